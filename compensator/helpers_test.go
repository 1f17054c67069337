package compensator_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"orderpipe/compensator"
	"orderpipe/shared/order"
	"orderpipe/shared/orderstore"
	"orderpipe/shared/outbox"
	"orderpipe/shared/payments"
	"orderpipe/shared/psp"
	"orderpipe/shared/tooling/pspserver"
	"orderpipe/shared/tooling/testenv"
)

// TestMain runs the tests, or, in a child that a crash test started, the
// compensator command (testenv.MainWith).
func TestMain(m *testing.M) { testenv.MainWith(m, compensator.Command()) }

// world is one test's database, stream, payment provider and relay.
type world struct {
	t      *testing.T
	db     *testenv.Database
	nats   *testenv.NATSEnv
	relay  *outbox.Relay
	psp    *psp.Client
	pspURL string
	client uuid.UUID
}

func newWorld(t *testing.T) *world {
	t.Helper()
	db := testenv.DB(t)
	n := testenv.NATS(t)
	pspURL := testenv.ServePSP(t, db.Pool, pspserver.Options{})
	w := &world{t: t, db: db, nats: n, psp: psp.NewClient(pspURL, 5*time.Second), pspURL: pspURL,
		relay: &outbox.Relay{Pool: db.Pool, JS: n.JS, Topology: n.Topology, Logger: testenv.Logger(t)}}
	w.client = uuid.New()
	w.exec(`INSERT INTO api_clients (client_id, name, api_key_hash, webhook_secret) VALUES ($1, 'c', $2, 's')`, w.client, w.client[:])
	w.exec(`INSERT INTO inventory (sku, available) VALUES ('SKU-1', 100), ('SKU-2', 100)`)
	return w
}

// newWorldWithOrder is newWorld with one order of s in it (see newOrder):
// the set-up of the tests of one order.
func newWorldWithOrder(t *testing.T, s spec) (*world, uuid.UUID) {
	t.Helper()
	w := newWorld(t)
	return w, w.newOrder(s)
}

func (w *world) exec(sql string, args ...any) {
	w.t.Helper()
	if _, err := w.db.Pool.Exec(w.t.Context(), sql, args...); err != nil {
		w.t.Fatalf("%s: %v", sql, err)
	}
}

// scalar returns the one value that the query sql selects.
func scalar[T any](w *world, sql string, args ...any) T {
	w.t.Helper()
	var v T
	if err := w.db.Pool.QueryRow(w.t.Context(), sql, args...).Scan(&v); err != nil {
		w.t.Fatalf("%s: %v", sql, err)
	}
	return v
}

// wantPendingOutbox fails the test unless want outbox rows are left
// unpublished; when says at which point of the test.
func (w *world) wantPendingOutbox(want int, when string) {
	w.t.Helper()
	if n := w.int(`SELECT count(*) FROM outbox WHERE published_at IS NULL`); n != want {
		w.t.Fatalf("%s: %d outbox rows pending, want %d", when, n, want)
	}
}

func (w *world) int(sql string, args ...any) int {
	w.t.Helper()
	return scalar[int](w, sql, args...)
}

func (w *world) str(sql string, args ...any) string {
	w.t.Helper()
	return scalar[string](w, sql, args...)
}

// checkVoided fails the test unless the order's charge key was voided
// with nothing charged and nothing refunded at the provider.
func (w *world) checkVoided(id uuid.UUID) {
	w.t.Helper()
	if n := w.int(`SELECT count(*) FROM psp_refunds`); n != 0 {
		w.t.Fatalf("refunds %d, want 0", n)
	}
	if n := w.int(`SELECT count(*) FROM psp_charges WHERE state <> 'voided'`); n != 0 {
		w.t.Fatalf("charges %d, want 0: an unwind must never charge", n)
	}
	if s := w.str(`SELECT status FROM payments WHERE order_id = $1`, id); s != "voided" {
		w.t.Fatalf("payment %s, want voided", s)
	}
}

// stuckPaid creates n charged orders left paid past their deadline, and
// two compensators (no re-drive) that take batch orders a pass, to race.
func (w *world) stuckPaid(n, batch int) ([]uuid.UUID, *compensator.Compensator, *compensator.Compensator) {
	w.t.Helper()
	ids := w.newOrders(n, spec{status: order.StatusPaid, lines: map[string]int{"SKU-1": 1}, payment: "succeeded"})
	w.age(ids...)
	cfg := w.cfg(compensator.NoRedrive)
	cfg.BatchSize = batch
	return ids, w.comp(cfg, w.psp), w.comp(cfg, w.psp)
}

// cfg is a configuration with one-minute deadlines, for orders aged by
// age().
func (w *world) cfg(maxAttempts int) compensator.Config {
	return compensator.Config{
		StuckProcessing: time.Minute, StuckReserved: time.Minute, StuckPaid: time.Minute,
		MaxAttempts: maxAttempts, Interval: time.Minute, BatchSize: 10,
		ConsumerHorizon: time.Second, OutboxMinAge: time.Millisecond, HealMinAge: time.Millisecond,
	}
}

func (w *world) comp(cfg compensator.Config, provider *psp.Client) *compensator.Compensator {
	w.t.Helper()
	c, err := compensator.New(cfg, w.db.Pool, w.relay, provider, testenv.Logger(w.t))
	if err != nil {
		w.t.Fatal(err)
	}
	return c
}

func (w *world) pass(c *compensator.Compensator) compensator.Result {
	w.t.Helper()
	res, err := c.RunOnce(w.t.Context())
	if err != nil {
		w.t.Fatalf("pass: %v", err)
	}
	return res
}

// spec is how far an order got before it got stuck.
type spec struct {
	status order.Status
	// lines are (sku, quantity) reserved when status is reserved or paid.
	lines map[string]int
	// payment: "" none, "pending" (charge outcome unknown, provider never
	// got it), "succeeded" (charged through the provider).
	payment string
	// lost: the order's events never reached the stream.
	lost bool
}

// newOrder creates an order as the intake and the consumers would have
// left it in s.status, with its outbox events published, and returns its id.
func (w *world) newOrder(s spec) uuid.UUID {
	w.t.Helper()
	ctx := w.t.Context()
	id := uuid.Must(uuid.NewV7())
	rid := "r" + strings.ReplaceAll(id.String(), "-", "")[:20]
	var outboxIDs []int64
	items := []order.Item{}
	for sku, q := range s.lines {
		items = append(items, order.Item{SKU: sku, Quantity: q})
	}
	raw, err := json.Marshal(items)
	if err != nil {
		w.t.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, w.db.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders (order_id, order_no, client_id, request_id, fingerprint, status, user_id, items, amount, currency)
			VALUES ($1, $2, $3, $4, '\x00', 'processing', 1, $5, 12.50, 'CNY')`, id, order.NewOrderNo(time.Now()), w.client, rid, raw); err != nil {
			return err
		}
		oid, err := orderstore.Record(ctx, tx, id, w.client, rid, order.StatusProcessing, "")
		outboxIDs = append(outboxIDs, oid)
		if err != nil || s.status == order.StatusProcessing {
			return err
		}
		for sku, q := range s.lines {
			if _, err := tx.Exec(ctx, `UPDATE inventory SET available = available - $2 WHERE sku = $1`, sku, q); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `INSERT INTO reservations (order_id, sku, quantity) VALUES ($1, $2, $3)`, id, sku, q); err != nil {
				return err
			}
		}
		m, err := orderstore.Transition(ctx, tx, id, order.StatusProcessing, order.StatusReserved, "")
		outboxIDs = append(outboxIDs, m.Event.ID)
		if err != nil || s.status == order.StatusReserved {
			return err
		}
		m, err = orderstore.Transition(ctx, tx, id, order.StatusReserved, s.status, "")
		outboxIDs = append(outboxIDs, m.Event.ID)
		return err
	})
	if err != nil {
		w.t.Fatalf("create order: %v", err)
	}
	key := payments.ChargeKey(id)
	switch s.payment {
	case "pending":
		w.exec(`INSERT INTO payments (order_id, idempotency_key, amount, currency, status) VALUES ($1, $2, 12.50, 'CNY', 'pending')`, id, key)
	case "succeeded":
		ans, err := w.psp.Charge(ctx, key, "12.50", "CNY", id.String())
		if err != nil || ans.Status != psp.StatusSucceeded {
			w.t.Fatalf("charge: %+v %v", ans, err)
		}
		w.exec(`INSERT INTO payments (order_id, idempotency_key, amount, currency, status, charge_id) VALUES ($1, $2, 12.50, 'CNY', 'succeeded', $3)`, id, key, ans.ID)
	}
	if s.lost {
		// Published and lost by the broker: stamped, never in the stream.
		w.exec(`UPDATE outbox SET published_at = now() WHERE id = ANY($1)`, outboxIDs)
	} else if err := w.relay.Publish(ctx, outboxIDs...); err != nil {
		w.t.Fatalf("publish: %v", err)
	}
	return id
}

// newOrders creates n orders of s (see newOrder) and returns their ids.
func (w *world) newOrders(n int, s spec) []uuid.UUID {
	w.t.Helper()
	var ids []uuid.UUID
	for range n {
		ids = append(ids, w.newOrder(s))
	}
	return ids
}

// age makes an order look idle for two minutes (past the one-minute
// deadlines of cfg).
func (w *world) age(ids ...uuid.UUID) {
	w.t.Helper()
	w.exec(`UPDATE orders SET updated_at = updated_at - interval '2 minutes',
		redriven_at = redriven_at - interval '2 minutes' WHERE order_id = ANY($1)`, ids)
}

// deleteEvent deletes the order's last event from the stream, as a
// retention limit or an operator would, and keeps the others.
func (w *world) deleteEvent(id uuid.UUID) {
	w.t.Helper()
	s, err := w.nats.JS.Stream(w.t.Context(), w.nats.Topology.Stream)
	if err != nil {
		w.t.Fatal(err)
	}
	if err := s.DeleteMsg(w.t.Context(), uint64(w.int(`SELECT stream_seq FROM outbox WHERE order_id = $1 ORDER BY id DESC LIMIT 1`, id))); err != nil {
		w.t.Fatal(err)
	}
}

func (w *world) status(id uuid.UUID) order.Status {
	w.t.Helper()
	return order.Status(w.str(`SELECT status FROM orders WHERE order_id = $1`, id))
}

// msgIDs returns the Nats-Msg-Id of every message of the test's stream
// about the order, in stream order.
func (w *world) msgIDs(id uuid.UUID) []string {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(w.t.Context(), 10*time.Second)
	defer cancel()
	cons, err := w.nats.JS.OrderedConsumer(ctx, w.nats.Topology.Stream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		w.t.Fatal(err)
	}
	info, err := w.nats.JS.Stream(ctx, w.nats.Topology.Stream)
	if err != nil {
		w.t.Fatal(err)
	}
	total := int(info.CachedInfo().State.Msgs)
	var out []string
	if total == 0 {
		return nil
	}
	batch, err := cons.FetchNoWait(total)
	if err != nil {
		w.t.Fatal(err)
	}
	for m := range batch.Messages() {
		if mid := m.Headers().Get("Nats-Msg-Id"); strings.HasPrefix(mid, id.String()) {
			out = append(out, mid)
		}
	}
	return out
}

func streamMsgs(t *testing.T, js jetstream.JetStream, stream string) uint64 {
	t.Helper()
	s, err := js.Stream(t.Context(), stream)
	if err != nil {
		t.Fatal(err)
	}
	return s.CachedInfo().State.Msgs
}

// dump returns one digest per table of the public schema, of every row.
func dump(t *testing.T, pool *pgxpool.Pool) map[string]string {
	t.Helper()
	ctx := t.Context()
	tables := testenv.Column[string](t, pool, `SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename`)
	out := map[string]string{}
	for _, tb := range tables {
		var digest *string
		var n int
		q := fmt.Sprintf(`SELECT md5(string_agg(t::text, ',' ORDER BY t::text)), count(*) FROM %s t`, pgx.Identifier{tb}.Sanitize())
		if err := pool.QueryRow(ctx, q).Scan(&digest, &n); err != nil {
			t.Fatal(err)
		}
		d := "empty"
		if digest != nil {
			d = *digest
		}
		out[tb] = fmt.Sprintf("%d rows %s", n, d)
	}
	return out
}

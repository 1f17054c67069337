// Package pipetest is the consumers' test bundle: a database, a stream, a
// payment provider stand-in and a router of the test's own, orders created
// the way the intake creates them (order row, history and outbox event in
// one transaction, then the inline publish), and the invariant check that
// ends every fault test. Tests only.
package pipetest

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"orderpipe/consumers"
	"orderpipe/consumers/confirm"
	"orderpipe/consumers/inventory"
	"orderpipe/consumers/payment"
	"orderpipe/consumers/step"
	"orderpipe/shared/app"
	"orderpipe/shared/natsjs"
	"orderpipe/shared/order"
	"orderpipe/shared/orderevent"
	"orderpipe/shared/orderstore"
	"orderpipe/shared/outbox"
	"orderpipe/shared/psp"
	"orderpipe/shared/tooling/pspserver"
	"orderpipe/shared/tooling/testenv"
)

// Env is one test's pipeline infrastructure.
type Env struct {
	DB       *testenv.Database
	NATS     *testenv.NATSEnv
	App      *app.Env
	PSPURL   string
	ClientID uuid.UUID
	// Initial is the stock each SKU was given (for the invariant).
	Initial map[string]int64
}

// New returns a fresh database and stream, an app.Env on them, an API
// client row, and a payment stand-in with opts.
func New(t testing.TB, opts pspserver.Options) *Env {
	t.Helper()
	return NewOn(t, testenv.DB(t), testenv.NATS(t), opts)
}

// OwnNATS returns a NATSEnv on a server of the test's own (testenv.OwnNATS)
// with the production topology, for tests that restart the server or run
// `orderpipe consumers` as a child process.
func OwnNATS(t testing.TB, url string) *testenv.NATSEnv {
	t.Helper()
	nc, js := testenv.Connect(t, url)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if _, err := natsjs.EnsureStream(ctx, js, orderevent.DefaultTopology, 1); err != nil {
		t.Fatal(err)
	}
	return &testenv.NATSEnv{URL: url, Topology: orderevent.DefaultTopology, Conn: nc, JS: js}
}

// NewOn is New on a given database and stream.
func NewOn(t testing.TB, db *testenv.Database, n *testenv.NATSEnv, opts pspserver.Options) *Env {
	t.Helper()
	e := &Env{DB: db, NATS: n, Initial: map[string]int64{}}
	e.PSPURL = ServePSP(t, e, opts)
	e.App = testenv.Env(t, db, n)
	e.App.Config.PSPURL, e.App.Config.ShutdownTimeout = e.PSPURL, 10*time.Second
	e.ClientID = uuid.New()
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	if _, err := db.Pool.Exec(t.Context(),
		`INSERT INTO api_clients (client_id, name, api_key_hash, webhook_secret) VALUES ($1, 'pipetest', $2, 'whsec_test')`, e.ClientID, key); err != nil {
		t.Fatalf("create api client: %v", err)
	}
	return e
}

// Quiet makes e's logger log warnings and errors only (for load tests).
func (e *Env) Quiet(t testing.TB) {
	e.App.Logger = testenv.LoggerAt(t, slog.LevelWarn)
}

// ServePSP starts a payment stand-in with opts on e's database and returns
// its URL.
func ServePSP(t testing.TB, e *Env, opts pspserver.Options) string {
	t.Helper()
	return testenv.ServePSP(t, e.DB.Pool, opts)
}

// Stock sets a SKU's stock and remembers it as initial.
func (e *Env) Stock(t testing.TB, sku string, qty int64) {
	t.Helper()
	if _, err := e.DB.Pool.Exec(t.Context(), `
		INSERT INTO inventory (sku, available) VALUES ($1, $2)
		ON CONFLICT (sku) DO UPDATE SET available = EXCLUDED.available`, sku, qty); err != nil {
		t.Fatal(err)
	}
	e.Initial[sku] = qty
}

// Config is a router config for tests: short waits, quick redeliveries.
func Config() consumers.Config {
	c := consumers.Default()
	c.AckWait = 2 * time.Second
	c.MaxDeliver = 20
	c.Redelivery = []time.Duration{50 * time.Millisecond, 100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond, time.Second}
	c.Retries = 1
	c.RetryInterval = 20 * time.Millisecond
	c.RetryMaxInterval = 100 * time.Millisecond
	c.Workers = 8
	c.DrainTimeout = 10 * time.Second
	c.MaxProcessing = 30 * time.Second
	return c
}

// Steps returns the default steps (those of consumers.Factories) with a
// provider client of the given per-attempt timeout.
func (e *Env) Steps(pspTimeout time.Duration) []step.Step {
	return []step.Step{
		inventory.Step(),
		payment.Step(e.DB.Pool, psp.NewClient(e.PSPURL, pspTimeout)),
		confirm.Step(),
	}
}

// Router is a running pipeline; Stop drains it.
type Router struct {
	P    *consumers.Pipeline
	stop context.CancelFunc
	done chan error
}

// Start runs a pipeline with steps on env until the test ends (or Stop).
func Start(t testing.TB, env *app.Env, cfg consumers.Config, steps ...step.Step) *Router {
	t.Helper()
	p, err := consumers.Build(env, cfg, steps...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background()) // stopped by a cleanup, which t.Context() would precede
	r := &Router{P: p, stop: cancel, done: make(chan error, 1)}
	go func() { r.done <- p.Run(ctx) }()
	select {
	case <-p.Running():
	case err := <-r.done:
		cancel()
		t.Fatalf("router stopped at start: %v", err)
	case <-time.After(30 * time.Second):
		cancel()
		t.Fatal("router did not start within 30s")
	}
	t.Cleanup(func() { r.Stop(t) })
	return r
}

// Stop drains the router and waits for it (idempotent).
func (r *Router) Stop(t testing.TB) {
	if r.stop == nil {
		return
	}
	r.stop()
	r.stop = nil
	if err := <-r.done; err != nil {
		t.Logf("router stopped: %v", err)
	}
}

// Line is one order line.
type Line struct {
	SKU string
	Qty int
}

// CreateOrder stores an order the way the intake does — the order row,
// its history row and its accepted event in the outbox, in one
// transaction — and publishes the event inline. It returns the order id.
func (e *Env) CreateOrder(t testing.TB, amount string, lines ...Line) uuid.UUID {
	t.Helper()
	id, outboxID := e.InsertOrder(t, amount, lines...)
	relay := &outbox.Relay{Pool: e.DB.Pool, JS: e.App.JS, Topology: e.App.Topology, Logger: e.App.Logger}
	if err := relay.Publish(t.Context(), outboxID); errors.Is(err, outbox.ErrBrokerUnavailable) {
		t.Logf("accepted event left to the relay: %v", err)
	} else if err != nil {
		t.Fatalf("publish accepted event: %v", err)
	}
	return id
}

// InsertOrder is CreateOrder without the publish.
func (e *Env) InsertOrder(t testing.TB, amount string, lines ...Line) (uuid.UUID, int64) {
	t.Helper()
	ctx := t.Context()
	id := uuid.Must(uuid.NewV7())
	rid := order.NewRequestID(time.Now()) + fmt.Sprintf("%x", id[10:])
	items := make([]order.Item, len(lines))
	for i, l := range lines {
		items[i] = order.Item{SKU: l.SKU, Quantity: l.Qty}
	}
	raw, _ := json.Marshal(items)
	var outboxID int64
	err := pgx.BeginFunc(ctx, e.DB.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `
			INSERT INTO orders (order_id, order_no, client_id, request_id, fingerprint, status, user_id, items, amount, currency)
			VALUES ($1, $2, $3, $4, $5, 'processing', 42, $6, $7::numeric, 'CNY')`,
			id, order.NewOrderNo(time.Now()), e.ClientID, rid, []byte(rid), raw, amount); err != nil {
			return err
		}
		var err error
		outboxID, err = orderstore.Record(ctx, tx, id, e.ClientID, rid, order.StatusProcessing, "")
		return err
	})
	if err != nil {
		t.Fatalf("insert order: %v", err)
	}
	return id, outboxID
}

// Status returns an order's status.
func (e *Env) Status(t testing.TB, id uuid.UUID) order.Status {
	t.Helper()
	var s string
	if err := e.DB.Pool.QueryRow(t.Context(), `SELECT status FROM orders WHERE order_id = $1`, id).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return order.Status(s)
}

// WaitTerminal waits until no order of the test's database is in a
// non-terminal state.
func (e *Env) WaitTerminal(t testing.TB, timeout time.Duration) {
	t.Helper()
	testenv.WaitFor(t, timeout, "every order terminal", func() bool {
		var open int
		if err := e.DB.Pool.QueryRow(t.Context(),
			`SELECT count(*) FROM orders WHERE status NOT IN ('confirmed', 'rejected', 'cancelled')`).Scan(&open); err != nil {
			return false
		}
		return open == 0
	})
}

// Counts returns the number of orders per status.
func (e *Env) Counts(t testing.TB) map[order.Status]int {
	t.Helper()
	rows, err := e.DB.Pool.Query(t.Context(), `SELECT status, count(*) FROM orders GROUP BY status`)
	if err != nil {
		t.Fatal(err)
	}
	out := map[order.Status]int{}
	for rows.Next() {
		var s string
		var n int
		if err := rows.Scan(&s, &n); err != nil {
			t.Fatal(err)
		}
		out[order.Status(s)] = n
	}
	rows.Close()
	return out
}

// CheckInvariants fails the test unless, for every order of the
// database: it is terminal; its reservations form one set (reserved
// exactly when the order got past processing; none left held unless it
// is confirmed); the provider holds at most one successful charge for it,
// refunded unless the order is confirmed, and a confirmed order has one;
// its history has one row per status entered. And stock is conserved: for
// every SKU, initial = available + reserved and not released.
func (e *Env) CheckInvariants(t testing.TB) {
	t.Helper()
	ctx := t.Context()
	pool := e.DB.Pool
	fail := func(q, what string) {
		t.Helper()
		rows, err := pool.Query(ctx, q)
		if err != nil {
			t.Fatalf("invariant query (%s): %v", what, err)
		}
		defer rows.Close()
		n := 0
		for rows.Next() {
			vals, _ := rows.Values()
			if n < 10 {
				t.Errorf("invariant broken: %s: %v", what, vals)
			}
			n++
		}
		if n > 0 {
			t.Errorf("invariant broken: %s: %d rows", what, n)
		}
	}
	fail(`SELECT order_id, status FROM orders WHERE status NOT IN ('confirmed', 'rejected', 'cancelled')`, "order not terminal")
	fail(`SELECT o.order_id, o.status, count(r.*) FROM orders o LEFT JOIN reservations r ON r.order_id = o.order_id
		GROUP BY o.order_id, o.status, o.items
		HAVING count(r.*) <> (CASE WHEN o.status = 'rejected' THEN 0 ELSE (SELECT count(DISTINCT x->>'sku') FROM jsonb_array_elements(o.items) x) END)
		   AND NOT (o.status = 'cancelled' AND count(r.*) = 0)`, "reservation set is not one line per SKU")
	fail(`SELECT o.order_id, o.status FROM orders o JOIN reservations r ON r.order_id = o.order_id
		WHERE r.released_at IS NULL AND o.status <> 'confirmed'`, "stock still held by an order that is not confirmed")
	fail(`SELECT o.order_id, o.status FROM orders o JOIN reservations r ON r.order_id = o.order_id
		WHERE r.released_at IS NOT NULL AND o.status = 'confirmed'`, "stock released for a confirmed order")
	fail(`SELECT reference, count(*) FROM psp_charges WHERE state = 'succeeded' GROUP BY reference HAVING count(*) > 1`,
		"more than one successful charge for an order")
	fail(`SELECT o.order_id, o.status FROM orders o JOIN psp_charges c ON c.reference = o.order_id::text AND c.state = 'succeeded'
		LEFT JOIN psp_refunds r ON r.charge_id = c.charge_id AND r.state = 'succeeded'
		WHERE o.status <> 'confirmed' AND r.refund_id IS NULL`, "a charge of an order that is not confirmed was not refunded")
	fail(`SELECT o.order_id FROM orders o JOIN psp_charges c ON c.reference = o.order_id::text
		JOIN psp_refunds r ON r.charge_id = c.charge_id WHERE o.status = 'confirmed'`, "a confirmed order was refunded")
	fail(`SELECT o.order_id FROM orders o WHERE o.status = 'confirmed'
		AND NOT EXISTS (SELECT 1 FROM psp_charges c WHERE c.reference = o.order_id::text AND c.state = 'succeeded')`,
		"a confirmed order was not charged")
	fail(`SELECT order_id, status, count(*) FROM order_events GROUP BY order_id, status HAVING count(*) > 1`,
		"a status entered twice in an order's history")
	rows, err := pool.Query(ctx, `
		SELECT i.sku, i.available, coalesce(sum(r.quantity) FILTER (WHERE r.released_at IS NULL), 0)::bigint
		FROM inventory i LEFT JOIN reservations r ON r.sku = i.sku GROUP BY i.sku, i.available`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var sku string
		var avail, held int64
		if err := rows.Scan(&sku, &avail, &held); err != nil {
			t.Fatal(err)
		}
		if init, ok := e.Initial[sku]; ok && avail+held != init {
			t.Errorf("stock not conserved for %s: initial %d, available %d + held %d = %d", sku, init, avail, held, avail+held)
		}
	}
}

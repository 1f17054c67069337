package orderstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"orderpipe/shared/failpoint"
	"orderpipe/shared/order"
	"orderpipe/shared/orderstore"
	"orderpipe/shared/outbox"
	"orderpipe/shared/tooling/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func newOrder(t *testing.T, pool *pgxpool.Pool) (uuid.UUID, int64) {
	t.Helper()
	ctx := t.Context()
	client, id := uuid.New(), uuid.Must(uuid.NewV7())
	var oid int64
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO api_clients (client_id, name, api_key_hash, webhook_secret) VALUES ($1, 'c', $2, 's')`, client, client[:]); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO orders (order_id, order_no, client_id, request_id, fingerprint, status, user_id, items, amount, currency)
			VALUES ($1, $2, $3, 'r1', '\x00', 'processing', 1, '[]', 1.00, 'CNY')`, id, order.NewOrderNo(time.Now()), client); err != nil {
			return err
		}
		var err error
		oid, err = orderstore.Record(ctx, tx, id, client, "r1", order.StatusProcessing, "")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return id, oid
}

func TestTransitionIsConditionalAndRecorded(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	ctx := t.Context()
	id, _ := newOrder(t, db.Pool)
	move := func(from, to order.Status) orderstore.Moved {
		var m orderstore.Moved
		err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			var err error
			m, err = orderstore.Transition(ctx, tx, id, from, to, "")
			return err
		})
		if err != nil {
			t.Fatalf("%s → %s: %v", from, to, err)
		}
		return m
	}
	if m := move(order.StatusProcessing, order.StatusReserved); !m.OK || m.Event.ID == 0 {
		t.Fatalf("first move: %+v", m)
	}
	if m := move(order.StatusProcessing, order.StatusReserved); m.OK || m.Current != order.StatusReserved {
		t.Fatalf("repeated move: %+v", m)
	}
	err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		_, err := orderstore.Transition(ctx, tx, id, order.StatusReserved, order.StatusProcessing, "")
		return err
	})
	if !errors.Is(err, order.ErrInvalidTransition) {
		t.Fatalf("backwards move: %v", err)
	}
	var seqs, events int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*), max(seq) FROM order_events WHERE order_id = $1`, id).Scan(&events, &seqs); err != nil {
		t.Fatal(err)
	}
	if events != 2 || seqs != 2 {
		t.Fatalf("history: %d rows, max seq %d; want 2, 2", events, seqs)
	}
}

func TestRelayPublishesOnceEvenWhenItDiesBeforeStamping(t *testing.T) {
	t.Parallel()
	db, nt := testenv.DB(t), testenv.NATS(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	_, oid := newOrder(t, db.Pool)
	// A dead relay's claims expire after the lease; a short one lets the
	// next pass take over at once.
	relay := &outbox.Relay{Pool: db.Pool, JS: nt.JS, Topology: nt.Topology, Logger: testenv.Logger(t), Lease: time.Millisecond}

	disable := failpoint.Enable(outbox.FailAfterPublish, 1)
	if err := relay.Publish(ctx, oid); !errors.Is(err, failpoint.ErrInjected) {
		t.Fatalf("publish with failpoint: %v", err)
	}
	disable()
	if n, _ := outbox.Pending(ctx, db.Pool); n != 1 {
		t.Fatalf("pending after a crash before the stamp = %d, want 1", n)
	}
	// The dead pass's claim holds until its lease ends, which may be a
	// moment after this point on a fast machine: pass until it takes over.
	for n := 0; n != 1; {
		var err error
		if n, err = relay.PublishPending(ctx, 0); err != nil || n > 1 || ctx.Err() != nil {
			t.Fatalf("relay pass: %d, %v (%v)", n, err, ctx.Err())
		}
	}
	if n, _ := outbox.Pending(ctx, db.Pool); n != 0 {
		t.Fatalf("pending after relay = %d", n)
	}
	st, info := testenv.StreamInfo(t, nt.JS, nt.Topology.Stream)
	if info.State.Msgs != 1 {
		t.Fatalf("stream holds %d messages, want 1 (the republish must be dropped)", info.State.Msgs)
	}
	msg, err := st.GetMsg(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if msg.Subject != nt.Topology.Prefix+".accepted" || msg.Header.Get(jetstream.MsgIDHeader) == "" {
		t.Fatalf("message: %s %v", msg.Subject, msg.Header)
	}
}

// TestTransitionManyMovesEachOrderOnItsOwnCondition: one call moves the
// orders still in their from, leaves the others with their current status,
// writes one history row and one event per move (in the order given), and
// refuses a missing order, an order named twice and a forbidden move
// without writing anything.
func TestTransitionManyMovesEachOrderOnItsOwnCondition(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	ctx := t.Context()
	a, _ := newOrder(t, db.Pool)
	b, _ := newOrder(t, db.Pool)
	c, _ := newOrder(t, db.Pool)
	many := func(ms ...orderstore.Move) ([]orderstore.Moved, error) {
		var out []orderstore.Moved
		err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			var err error
			out, err = orderstore.TransitionMany(ctx, tx, ms)
			return err
		})
		return out, err
	}
	if _, err := many(orderstore.Move{ID: b, From: order.StatusProcessing, To: order.StatusReserved}); err != nil {
		t.Fatal(err)
	}
	got, err := many(
		orderstore.Move{ID: c, From: order.StatusProcessing, To: order.StatusRejected, Reason: "out of stock"},
		orderstore.Move{ID: b, From: order.StatusProcessing, To: order.StatusReserved}, // moved already
		orderstore.Move{ID: a, From: order.StatusProcessing, To: order.StatusReserved},
	)
	if err != nil {
		t.Fatal(err)
	}
	if !got[0].OK || got[0].Current != order.StatusRejected || got[1].OK || got[1].Current != order.StatusReserved || !got[2].OK || got[2].Current != order.StatusReserved {
		t.Fatalf("moves: %+v", got)
	}
	if got[0].Event.ID == 0 || got[2].Event.ID == 0 || got[1].Event.ID != 0 {
		t.Fatalf("outbox ids: %+v", got)
	}
	for _, want := range []struct {
		id     int64
		order  uuid.UUID
		event  string
		reason string
	}{{got[0].Event.ID, c, "rejected", "out of stock"}, {got[2].Event.ID, a, "reserved", ""}} {
		var oid uuid.UUID
		var event, reason string
		if err := db.Pool.QueryRow(ctx, `SELECT order_id, event, coalesce(convert_from(payload, 'UTF8')::jsonb->>'reason', '') FROM outbox WHERE id = $1`, want.id).Scan(&oid, &event, &reason); err != nil {
			t.Fatal(err)
		}
		if oid != want.order || event != want.event || reason != want.reason {
			t.Errorf("outbox row %d: %s %s %q; want %s %s %q", want.id, oid, event, reason, want.order, want.event, want.reason)
		}
	}
	var rows, maxSeq int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*), max(seq) FROM order_events WHERE order_id = $1`, b).Scan(&rows, &maxSeq); err != nil {
		t.Fatal(err)
	}
	if rows != 2 || maxSeq != 2 {
		t.Errorf("order b: %d history rows up to seq %d; want 2 (processing, reserved), the repeated move writing none", rows, maxSeq)
	}

	before := countRows(t, db.Pool)
	for name, ms := range map[string][]orderstore.Move{
		"missing order": {{ID: a, From: order.StatusReserved, To: order.StatusPaid}, {ID: uuid.Must(uuid.NewV7()), From: order.StatusProcessing, To: order.StatusReserved}},
		"named twice":   {{ID: a, From: order.StatusReserved, To: order.StatusPaid}, {ID: a, From: order.StatusReserved, To: order.StatusPaid}},
		"forbidden":     {{ID: a, From: order.StatusReserved, To: order.StatusPaid}, {ID: c, From: order.StatusRejected, To: order.StatusProcessing}},
	} {
		_, err := many(ms...)
		switch {
		case err == nil:
			t.Errorf("%s: no error", name)
		case name == "missing order" && !errors.Is(err, orderstore.ErrNotFound):
			t.Errorf("%s: %v, want ErrNotFound", name, err)
		case name == "forbidden" && !errors.Is(err, order.ErrInvalidTransition):
			t.Errorf("%s: %v, want ErrInvalidTransition", name, err)
		}
	}
	if after := countRows(t, db.Pool); after != before {
		t.Errorf("refused calls wrote rows: %v → %v", before, after)
	}
}

// countRows counts the history and outbox rows and the paid orders.
func countRows(t *testing.T, pool *pgxpool.Pool) [3]int {
	t.Helper()
	var n [3]int
	if err := pool.QueryRow(t.Context(), `SELECT (SELECT count(*) FROM order_events), (SELECT count(*) FROM outbox), (SELECT count(*) FROM orders WHERE status = 'paid')`).Scan(&n[0], &n[1], &n[2]); err != nil {
		t.Fatal(err)
	}
	return n
}

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
	if m := move(order.StatusProcessing, order.StatusReserved); !m.OK || m.OutboxID == 0 {
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
	if n, err := relay.PublishPending(ctx, 0); err != nil || n != 1 {
		t.Fatalf("relay pass: %d, %v", n, err)
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

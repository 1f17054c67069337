package compensator

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"orderpipe/shared/order"
	"orderpipe/shared/orderstore"
	"orderpipe/shared/tooling/testenv"
)

// The race of riverqueue/river#1302: the compensator reads a stuck order,
// a consumer finishes the step, then the compensator writes. The write is a
// compare-and-set on what was read, so it does nothing: no re-drive, no
// unwind, nothing recorded.
func TestConsumerWinsBetweenReadAndWrite(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	ctx := t.Context()
	client := uuid.New()
	if _, err := db.Pool.Exec(ctx, `INSERT INTO api_clients (client_id, name, api_key_hash, webhook_secret) VALUES ($1, 'c', $2, 's')`, client, client[:]); err != nil {
		t.Fatal(err)
	}
	newOrder := func() uuid.UUID {
		id := uuid.Must(uuid.NewV7())
		err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO orders (order_id, order_no, client_id, request_id, fingerprint, status, user_id, items, amount, currency, updated_at)
				VALUES ($1, $2, $3, $4, '\x00', 'processing', 1, '[]', 1.00, 'CNY', now() - interval '2 minutes')`, id, order.NewOrderNo(time.Now()), client, "r"+id.String()[:8]+id.String()[24:]); err != nil {
				return err
			}
			_, err := orderstore.Record(ctx, tx, id, client, "r"+id.String()[:8]+id.String()[24:], order.StatusProcessing, "")
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	redriven, unwound := newOrder(), newOrder()
	c, err := New(Config{StuckProcessing: time.Minute, StuckReserved: time.Minute, StuckPaid: time.Minute, Interval: time.Minute,
		ConsumerHorizon: time.Second, OutboxMinAge: time.Millisecond, HealMinAge: time.Millisecond}, db.Pool, nil, nil, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	// The compensator's read.
	seen, err := c.selectStuck(ctx, db.Pool, uuid.Nil, 10, false)
	if err != nil || len(seen) != 2 {
		t.Fatalf("read %d stuck orders: %v", len(seen), err)
	}
	// The consumer's step, in between.
	for _, id := range []uuid.UUID{redriven, unwound} {
		err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			_, err := orderstore.Transition(ctx, tx, id, order.StatusProcessing, order.StatusReserved, "")
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	// The compensator's write, from what it read.
	for i, o := range seen {
		err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			var a Action
			var oid int64
			var err error
			if i == 0 {
				a, oid, err = c.redrive(ctx, tx, o, Action{OrderID: o.ID, From: o.Status, Kind: KindRedrive, Attempt: o.attempt() + 1})
			} else {
				a, oid, _, err = c.unwind(ctx, tx, o, Action{OrderID: o.ID, From: o.Status, Kind: KindUnwind, Attempt: o.attempt()})
			}
			if err != nil {
				return err
			}
			if a.Kind != KindSkip || oid != 0 {
				t.Errorf("order %s: %s (outbox %d), want a skip", o.ID, a.Kind, oid)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	var actions, redrives, cancelled int
	if err := db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM compensator_actions), (SELECT coalesce(sum(redrive_attempts), 0) FROM orders),
		(SELECT count(*) FROM orders WHERE status <> 'reserved')`).Scan(&actions, &redrives, &cancelled); err != nil {
		t.Fatal(err)
	}
	if actions != 0 || redrives != 0 || cancelled != 0 {
		t.Fatalf("the compensator acted: %d actions, %d re-drives, %d orders not reserved", actions, redrives, cancelled)
	}
}

func TestSweepsExpiredDedupeRowsOnly(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	ctx := t.Context()
	if _, err := db.Pool.Exec(ctx, `INSERT INTO processed_messages (consumer, message_id, processed_at)
		SELECT 'c', 'old-' || g, now() - interval '73 hours' FROM generate_series(1, 6000) g
		UNION ALL SELECT 'c', 'new-' || g, now() - interval '71 hours' FROM generate_series(1, 10) g`); err != nil {
		t.Fatal(err)
	}
	c, err := New(Config{ConsumerHorizon: time.Minute}, db.Pool, nil, nil, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	var res Result
	if err := c.sweep(ctx, &res); err != nil {
		t.Fatal(err)
	}
	var left int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM processed_messages WHERE message_id LIKE 'new-%'`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if res.Swept != 6000 || left != 10 {
		t.Fatalf("swept %d, kept %d new rows", res.Swept, left)
	}
}

package orderstore_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"orderpipe/shared/order"
	"orderpipe/shared/orderstore"
)

// TestInsertBatch: one transaction for many requests. New requests get new
// orders with their history and accepted event; a request_id repeated in
// the same batch is one order (the others replay it, or get
// ErrRequestIDReused with another payload); one stored before is replayed;
// a colliding order number asks for a retry.
func TestInsertBatch(t *testing.T) {
	ctx, db, client := newTest(t)
	if _, err := orderstore.Insert(ctx, db.Pool, client, request(t, "old", `"39.98"`), orderstore.InsertOptions{}); err != nil {
		t.Fatal(err)
	}
	reqs := []orderstore.NewOrder{
		{Ctx: ctx, ClientID: client, Req: request(t, "a", `"39.98"`)},
		{Ctx: ctx, ClientID: client, Req: request(t, "b", `"39.98"`)},
		{Ctx: ctx, ClientID: client, Req: request(t, "a", `"39.98"`)}, // same as the first
		{Ctx: ctx, ClientID: client, Req: request(t, "a", `"1.00"`)},  // same key, other payload
		{Ctx: ctx, ClientID: client, Req: request(t, "old", `"39.98"`)},
	}
	res, err := orderstore.InsertBatch(ctx, db.Pool, reqs, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Err != nil || res[0].Replayed || res[0].OutboxID == 0 || res[1].Err != nil || res[1].Replayed || res[1].OutboxID == 0 {
		t.Fatalf("new requests: %+v / %+v", res[0], res[1])
	}
	if res[2].Err != nil || !res[2].Replayed || res[2].Order.ID != res[0].Order.ID || !res[2].RequestIDConflict {
		t.Fatalf("repeat in the batch: %+v", res[2])
	}
	if !errors.Is(res[3].Err, order.ErrRequestIDReused) {
		t.Fatalf("other payload: %+v", res[3])
	}
	if res[4].Err != nil || !res[4].Replayed {
		t.Fatalf("stored before: %+v", res[4])
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM orders`); n != 3 {
		t.Fatalf("%d orders, want 3", n)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM order_events`); n != 3 {
		t.Fatalf("%d history rows, want 3", n)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox WHERE order_id IS NOT NULL`); n != 3 {
		t.Fatalf("%d outbox rows, want 3", n)
	}
	// Every order number the same: all but the first collide.
	same := func(time.Time) string { return "ORD-SAME" }
	res, err = orderstore.InsertBatch(ctx, db.Pool, []orderstore.NewOrder{
		{Ctx: ctx, ClientID: client, Req: request(t, "c", `"39.98"`)},
		{Ctx: ctx, ClientID: client, Req: request(t, "d", `"39.98"`)},
	}, same)
	if err != nil || res[0].Err != nil || res[0].Retry || !res[1].Retry {
		t.Fatalf("order number collision: %+v, %v", res, err)
	}
}

// TestConcurrentBatchesOfTheSameRequestsDoNotDeadlock: two group commits
// at once that hold the same request_ids in opposite orders (a retry storm:
// every user's retries spread over both flushers) must both succeed. Each
// waits on the other's insert of a key it also inserts; unless both take
// the keys in one order, PostgreSQL finds a deadlock after its
// deadlock_timeout (a second) and fails a batch.
func TestConcurrentBatchesOfTheSameRequestsDoNotDeadlock(t *testing.T) {
	ctx, db, client := newTest(t)
	const users = 200
	for round := range 3 {
		var forward, backward []orderstore.NewOrder
		for u := range users {
			forward = append(forward, orderstore.NewOrder{Ctx: ctx, ClientID: client, Req: request(t, fmt.Sprintf("storm-%d-%d", round, u), `"39.98"`)})
		}
		for u := users - 1; u >= 0; u-- {
			backward = append(backward, forward[u])
		}
		errs := make(chan error, 2)
		for _, batch := range [][]orderstore.NewOrder{forward, backward} {
			go func() {
				res, err := orderstore.InsertBatch(ctx, db.Pool, batch, nil)
				for _, r := range res {
					err = errors.Join(err, r.Err)
				}
				errs <- err
			}()
		}
		for range 2 {
			if err := <-errs; err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
		}
		if n := count(t, db.Pool, `SELECT count(*) FROM orders WHERE request_id LIKE $1`, fmt.Sprintf("storm-%d-%%", round)); n != users {
			t.Fatalf("round %d: %d orders, want %d", round, n, users)
		}
	}
}

// killReads is a pgx tracer that kills its connection's backend (with
// pg_terminate_backend, from admin) before the first batch that reads
// orders by request_id is sent: a server fault between a group commit's
// commit and its read of the stored orders.
type killReads struct {
	admin  *pgxpool.Pool
	killed atomic.Bool
	err    error
}

func (k *killReads) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (k *killReads) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (k *killReads) TraceBatchStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	reads := false
	for _, q := range data.Batch.QueuedQueries {
		reads = reads || strings.Contains(q.SQL, "AS k(client_id, request_id)")
	}
	if !reads || k.killed.Swap(true) {
		return ctx
	}
	pid := conn.PgConn().PID()
	if _, err := k.admin.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
		k.err = err
		return ctx
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		var alive bool
		if err := k.admin.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1)`, pid).Scan(&alive); err != nil || !alive {
			k.err = err
			return ctx
		}
		if time.Now().After(deadline) {
			k.err = fmt.Errorf("backend %d still alive", pid)
			return ctx
		}
		runtime.Gosched()
	}
}

func (k *killReads) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (k *killReads) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// TestABatchThatCommittedAnswersItsNewOrdersWhenTheReadAfterFails: a batch
// of a new request and a repeated one commits the new order, then reads the
// repeated one's stored order. When that read fails (its backend killed),
// the batch has still committed: the new request is answered with its
// order (202 for the client, not an error or a replay of its own order on
// the retry), and only the repeated request gets the read's error.
func TestABatchThatCommittedAnswersItsNewOrdersWhenTheReadAfterFails(t *testing.T) {
	ctx, db, client := newTest(t)
	if _, err := orderstore.Insert(ctx, db.Pool, client, request(t, "old", `"39.98"`), orderstore.InsertOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	tracer := &killReads{admin: db.Pool}
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	res, err := orderstore.InsertBatch(ctx, pool, []orderstore.NewOrder{
		{Ctx: ctx, ClientID: client, Req: request(t, "new", `"39.98"`)},
		{Ctx: ctx, ClientID: client, Req: request(t, "old", `"39.98"`)},
	}, nil)
	if !tracer.killed.Load() || tracer.err != nil {
		t.Fatalf("the read's backend was not killed: %v", tracer.err)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM orders WHERE request_id = 'new'`); n != 1 {
		t.Fatalf("%d orders of the new request, want 1 (committed)", n)
	}
	if err != nil {
		t.Fatalf("the batch committed, but InsertBatch says it did not: %v", err)
	}
	if r := res[0]; r.Err != nil || r.Replayed || r.Retry || r.OutboxID == 0 || r.Order.RequestID != "new" {
		t.Fatalf("new request: %+v, want its new order", r)
	}
	if r := res[1]; r.Err == nil || errors.Is(r.Err, order.ErrRequestIDReused) || r.Retry {
		t.Fatalf("repeated request: %+v, want the read's error", r)
	}
}

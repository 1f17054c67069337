package orderstore_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"orderpipe/shared/order"
	"orderpipe/shared/orderstore"
	"orderpipe/shared/tenant"
	"orderpipe/shared/tooling/testenv"
)

func newClient(t testing.TB, pool *pgxpool.Pool) uuid.UUID {
	t.Helper()
	c, err := tenant.Create(t.Context(), pool, "shop")
	if err != nil {
		t.Fatal(err)
	}
	return c.ClientID
}

// newTest is the set-up of the tests of one client's orders: it marks t
// parallel and returns t's context and a database of t's own with one
// client in it.
func newTest(t *testing.T) (context.Context, *testenv.Database, uuid.UUID) {
	t.Helper()
	t.Parallel()
	db := testenv.DB(t)
	return t.Context(), db, newClient(t, db.Pool)
}

func request(t testing.TB, rid, amount string) order.CreateRequest {
	t.Helper()
	req, err := order.DecodeCreateRequest([]byte(`{"request_id":"`+rid+`","user_id":7,"items":[{"sku":"SKU-1","quantity":2},{"sku":"SKU-2","quantity":1}],"amount":`+amount+`,"currency":"CNY"}`), order.DecodeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return req
}

func count(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(t.Context(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestInsertReplayMismatch(t *testing.T) {
	ctx, db, client := newTest(t)

	first, err := orderstore.Insert(ctx, db.Pool, client, request(t, "r-1", `"39.98"`), orderstore.InsertOptions{})
	if err != nil || first.Replayed || first.OutboxID == 0 {
		t.Fatalf("first insert: %+v %v", first, err)
	}
	o := first.Order
	if o.ID.Version() != 7 || o.Status != order.StatusProcessing || o.Amount.String() != "39.98" || len(o.Items) != 2 || o.No == "" {
		t.Fatalf("order %+v", o)
	}

	again, err := orderstore.Insert(ctx, db.Pool, client, request(t, "r-1", `39.98`), orderstore.InsertOptions{})
	if err != nil || !again.Replayed || again.Order.ID != o.ID || again.OutboxID != 0 {
		t.Fatalf("replay: %+v %v", again, err)
	}
	_, err = orderstore.Insert(ctx, db.Pool, client, request(t, "r-1", `"39.99"`), orderstore.InsertOptions{})
	if !errors.Is(err, order.ErrRequestIDReused) {
		t.Fatalf("mismatch: %v", err)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM orders`); n != 1 {
		t.Fatalf("%d orders", n)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox WHERE msg_id = $1`, o.ID.String()+":accepted"); n != 1 {
		t.Fatalf("%d accepted events in the outbox", n)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM order_events WHERE order_id = $1 AND seq = 1 AND status = 'processing'`, o.ID); n != 1 {
		t.Fatalf("%d history rows", n)
	}

	got, err := orderstore.Get(ctx, db.Pool, client, o.ID)
	if err != nil || got.ID != o.ID || got.Amount != o.Amount || !got.CreatedAt.Equal(o.CreatedAt) {
		t.Fatalf("Get: %+v %v", got, err)
	}
	got, err = orderstore.GetByRequestID(ctx, db.Pool, client, "r-1")
	if err != nil || got.ID != o.ID {
		t.Fatalf("GetByRequestID: %+v %v", got, err)
	}

	// Another client sees nothing and may use the same request_id.
	other := newClient(t, db.Pool)
	if _, err := orderstore.Get(ctx, db.Pool, other, o.ID); !errors.Is(err, orderstore.ErrNotFound) {
		t.Fatalf("other client's Get: %v", err)
	}
	if _, err := orderstore.GetByRequestID(ctx, db.Pool, other, "r-1"); !errors.Is(err, orderstore.ErrNotFound) {
		t.Fatalf("other client's GetByRequestID: %v", err)
	}
	theirs, err := orderstore.Insert(ctx, db.Pool, other, request(t, "r-1", `"1.00"`), orderstore.InsertOptions{})
	if err != nil || theirs.Replayed || theirs.Order.ID == o.ID {
		t.Fatalf("other client's insert: %+v %v", theirs, err)
	}
}

func TestOrderNoCollisionIsRetried(t *testing.T) {
	ctx, db, client := newTest(t)
	taken, err := orderstore.Insert(ctx, db.Pool, client, request(t, "a", `1`), orderstore.InsertOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var calls int
	gen := func(now time.Time) string {
		calls++
		if calls <= 2 {
			return taken.Order.No
		}
		return order.NewOrderNo(now)
	}
	res, err := orderstore.Insert(ctx, db.Pool, client, request(t, "b", `1`), orderstore.InsertOptions{NewOrderNo: gen})
	if err != nil || res.OrderNoCollisions != 2 || res.Order.No == taken.Order.No {
		t.Fatalf("%+v %v", res, err)
	}
	// A generator that always collides gives up, with nothing written.
	always := func(time.Time) string { return taken.Order.No }
	_, err = orderstore.Insert(ctx, db.Pool, client, request(t, "c", `1`), orderstore.InsertOptions{NewOrderNo: always, MaxOrderNoAttempts: 3})
	if err == nil {
		t.Fatal("endless collisions: no error")
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM orders WHERE request_id = 'c'`); n != 0 {
		t.Fatalf("%d rows", n)
	}
}

func TestConcurrentInsertsOfOneKey(t *testing.T) {
	ctx, db, client := newTest(t)
	const n = 30
	var wg sync.WaitGroup
	results := make([]orderstore.Inserted, n)
	errs := make([]error, n)
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			results[i], errs[i] = orderstore.Insert(ctx, db.Pool, client, request(t, "same", `"5.00"`), orderstore.InsertOptions{})
		}()
	}
	close(start)
	wg.Wait()
	fresh, conflicts := 0, 0
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("insert %d: %v", i, errs[i])
		}
		if !results[i].Replayed {
			fresh++
		}
		if results[i].RequestIDConflict {
			conflicts++
		}
		if results[i].Order.ID != results[0].Order.ID {
			t.Fatal("two order ids for one key")
		}
	}
	if fresh != 1 {
		t.Fatalf("%d fresh inserts", fresh)
	}
	// Racing inserts met the unique constraint and were answered from the
	// winner's row (the fast-path read cannot see an uncommitted order).
	if conflicts == 0 {
		t.Fatalf("no insert met uk_order_request; the race was not exercised")
	}
	if c := count(t, db.Pool, `SELECT count(*) FROM orders`); c != 1 {
		t.Fatalf("%d rows", c)
	}
	if c := count(t, db.Pool, `SELECT count(*) FROM outbox`); c != 1 {
		t.Fatalf("%d outbox rows", c)
	}
}

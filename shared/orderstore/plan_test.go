package orderstore_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/google/uuid"

	"orderpipe/shared/order"
	"orderpipe/shared/orderstore"
	"orderpipe/shared/tooling/testenv"
)

// TestRepeatsAreReadThroughTheKeyAsTheTableGrows: the intake's read of
// repeated requests finds each order through its key however much the
// table grew since the read first ran. pgx prepares statements, and
// PostgreSQL may cache one plan for a prepared statement after five runs;
// a join of unnest with orders, cached while the table was nearly empty,
// scanned it whole, and went on doing so as it grew, until the next
// ANALYZE.
func TestRepeatsAreReadThroughTheKeyAsTheTableGrows(t *testing.T) {
	ctx, db, client := newTest(t)
	one := testenv.OneConnection(t, db)
	const before, after = 10, 5
	orders := make([]order.Order, before+after)
	for i := range orders {
		r, err := orderstore.Insert(ctx, db.Pool, client, request(t, fmt.Sprintf("plan-%d", i), `"1.00"`), orderstore.InsertOptions{})
		if err != nil {
			t.Fatal(err)
		}
		orders[i] = r.Order
	}
	read := func(o order.Order) {
		t.Helper()
		got, err := orderstore.GetByRequestIDs(ctx, one, []uuid.UUID{client, client}, []string{o.RequestID, "not-there"})
		if err != nil || len(got) != 1 || got[orderstore.Key{ClientID: client, RequestID: o.RequestID}].ID != o.ID {
			t.Fatalf("read by request_id: %v, %v; want exactly order %s", got, err, o.ID)
		}
	}
	for _, o := range orders[:before] {
		read(o) // past the runs after which a plan may be cached
	}
	const grown = 20000
	if _, err := db.Pool.Exec(ctx, `
		INSERT INTO orders (order_id, order_no, client_id, request_id, fingerprint, status, user_id, items, amount, currency)
		SELECT gen_random_uuid(), 'GROWN' || g, $1, 'grown-' || g, '\x00', 'confirmed', 1, '[]', 1, 'CNY' FROM generate_series(1, $2) g`,
		client, grown); err != nil {
		t.Fatal(err)
	}
	for _, o := range orders[before:] {
		read(o)
	}
	// One update on the same connection marks the moment its counters,
	// reads included, reach pg_stat_user_tables.
	if _, err := one.Exec(ctx, `UPDATE orders SET updated_at = updated_at WHERE order_id = $1`, orders[0].ID); err != nil {
		t.Fatal(err)
	}
	if n := testenv.TableReads(t, db, one, "orders", 1).FullScan; n >= grown {
		t.Errorf("reading %d repeated requests read %d order rows in full scans, of %d; want each found through its key", before+after, n, grown+len(orders))
	}
}

// TestAnOrderIsReadThroughItsIDAsTheTableGrows: Get (the notifier's read
// of each order, GET /v1/orders/{id}) reads one row through the primary
// key however much the client's orders grew since it first ran. With the
// client in the statement, a plan cached while orders was nearly empty
// walked the (client_id, request_id) index over every order of the
// client.
func TestAnOrderIsReadThroughItsIDAsTheTableGrows(t *testing.T) {
	ctx, db, client := newTest(t)
	other := newClient(t, db.Pool)
	one := testenv.OneConnection(t, db)
	const before, after = 10, 5
	orders := make([]order.Order, before+after)
	for i := range orders {
		r, err := orderstore.Insert(ctx, db.Pool, client, request(t, fmt.Sprintf("get-%d", i), `"1.00"`), orderstore.InsertOptions{})
		if err != nil {
			t.Fatal(err)
		}
		orders[i] = r.Order
	}
	get := func(o order.Order) {
		t.Helper()
		got, err := orderstore.Get(ctx, one, client, o.ID)
		if err != nil || got.ID != o.ID || got.RequestID != o.RequestID {
			t.Fatalf("get order %s: %+v, %v", o.ID, got, err)
		}
		if _, err := orderstore.Get(ctx, one, other, o.ID); !errors.Is(err, orderstore.ErrNotFound) {
			t.Fatalf("another client read order %s: %v, want ErrNotFound", o.ID, err)
		}
	}
	for _, o := range orders[:before] {
		get(o) // past the runs after which a plan may be cached
	}
	const grown = 20000
	if _, err := db.Pool.Exec(ctx, `
		INSERT INTO orders (order_id, order_no, client_id, request_id, fingerprint, status, user_id, items, amount, currency)
		SELECT gen_random_uuid(), 'GROWN' || g, $1, 'grown-' || g, '\x00', 'confirmed', 1, '[]', 1, 'CNY' FROM generate_series(1, $2) g`,
		client, grown); err != nil {
		t.Fatal(err)
	}
	for _, o := range orders[before:] {
		get(o)
	}
	if _, err := one.Exec(ctx, `UPDATE orders SET updated_at = updated_at WHERE order_id = $1`, orders[0].ID); err != nil {
		t.Fatal(err)
	}
	if r := testenv.TableReads(t, db, one, "orders", 1); r.FullScan+r.ByIndex >= grown {
		t.Errorf("%d reads of one order each read %d order rows (%d in full scans, %d through indexes), of %d; want each found through its id",
			2*(before+after), r.FullScan+r.ByIndex, r.FullScan, r.ByIndex, grown+len(orders))
	}
}

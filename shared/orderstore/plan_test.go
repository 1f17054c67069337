package orderstore_test

import (
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
	if n := testenv.FullScanReads(t, db, one, "orders", 1); n >= grown {
		t.Errorf("reading %d repeated requests read %d order rows in full scans, of %d; want each found through its key", before+after, n, grown+len(orders))
	}
}

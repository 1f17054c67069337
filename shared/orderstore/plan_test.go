package orderstore_test

import (
	"fmt"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"orderpipe/shared/order"
	"orderpipe/shared/orderstore"
	"orderpipe/shared/tooling/testenv"
)

// TestMovesAndReadsFindOrdersByKeyAsTheTableGrows: a step's moves (and
// its read of the orders that did not move) and the intake's read of
// repeated requests find their orders through a key however much the
// table grew since they first ran. A plan PostgreSQL caches for a prepared
// statement while the table is nearly empty scans it whole, and went on
// doing so as it grew, until the next ANALYZE.
func TestMovesAndReadsFindOrdersByKeyAsTheTableGrows(t *testing.T) {
	ctx, db, client := newTest(t)
	one := testenv.OneConnection(t, db)
	const before, after = 10, 5
	orders := make([]order.Order, before+after+1)
	for i := range orders {
		r, err := orderstore.Insert(ctx, db.Pool, client, request(t, fmt.Sprintf("plan-%d", i), `"1.00"`), orderstore.InsertOptions{})
		if err != nil {
			t.Fatal(err)
		}
		orders[i] = r.Order
	}
	still := orders[len(orders)-1] // never moves: read as an order that did not
	step := func(o order.Order) {
		t.Helper()
		err := pgx.BeginFunc(ctx, one, func(tx pgx.Tx) error {
			ms, err := orderstore.TransitionMany(ctx, tx, []orderstore.Move{
				{ID: o.ID, From: order.StatusProcessing, To: order.StatusReserved},
				{ID: still.ID, From: order.StatusReserved, To: order.StatusPaid},
			})
			if err == nil && (!ms[0].OK || ms[1].OK) {
				err = fmt.Errorf("moves %+v; want the first only", ms)
			}
			return err
		})
		if err != nil {
			t.Fatalf("move: %v", err)
		}
		got, err := orderstore.GetByRequestIDs(ctx, one, []uuid.UUID{client}, []string{o.RequestID})
		if err != nil || got[orderstore.Key{ClientID: client, RequestID: o.RequestID}].ID != o.ID {
			t.Fatalf("read by request_id: %v, %v", got, err)
		}
	}
	for _, o := range orders[:before] {
		step(o) // past the runs after which a plan may be cached
	}
	const grown = 20000
	if _, err := db.Pool.Exec(ctx, `
		INSERT INTO orders (order_id, order_no, client_id, request_id, fingerprint, status, user_id, items, amount, currency)
		SELECT gen_random_uuid(), 'GROWN' || g, $1, 'grown-' || g, '\x00', 'confirmed', 1, '[]', 1, 'CNY' FROM generate_series(1, $2) g`,
		client, grown); err != nil {
		t.Fatal(err)
	}
	for _, o := range orders[before : before+after] {
		step(o)
	}
	if read := testenv.FullScanReads(t, db, one, "orders", before+after); read >= grown {
		t.Errorf("moving and reading %d orders read %d order rows in full scans, of %d; want them found through a key", before+after, read, grown+len(orders))
	}
}

package orderstore_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"orderpipe/shared/order"
	"orderpipe/shared/orderstore"
	"orderpipe/shared/postgres"
	"orderpipe/shared/tooling/testenv"
)

// readsAsOrdersGrow writes 15 orders of client, runs op on ten of them
// (past the runs after which PostgreSQL may cache a plan), grows orders
// by grown rows of client, runs op on the other five, and returns the
// rows of orders read meanwhile by one, where op runs its statements.
func readsAsOrdersGrow(t *testing.T, db *testenv.Database, one *pgxpool.Pool, client uuid.UUID, op func(order.Order)) testenv.Reads {
	t.Helper()
	orders := make([]order.Order, 15)
	for i := range orders {
		r, err := orderstore.Insert(t.Context(), db.Pool, client, request(t, fmt.Sprintf("plan-%d", i), `"1.00"`), orderstore.InsertOptions{})
		if err != nil {
			t.Fatal(err)
		}
		orders[i] = r.Order
	}
	for _, o := range orders[:10] {
		op(o)
	}
	testenv.GrowOrders(t, db.Pool, client, grown)
	for _, o := range orders[10:] {
		op(o)
	}
	// One update on the same connection marks the moment its counters,
	// reads included, reach pg_stat_user_tables.
	if _, err := one.Exec(t.Context(), `UPDATE orders SET updated_at = updated_at WHERE order_id = $1`, orders[0].ID); err != nil {
		t.Fatal(err)
	}
	return testenv.TableReads(t, db, one, "orders", 1)
}

// grown is how many orders readsAsOrdersGrow adds.
const grown = 20000

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
	r := readsAsOrdersGrow(t, db, one, client, func(o order.Order) {
		t.Helper()
		got, err := orderstore.GetByRequestIDs(ctx, one, []uuid.UUID{client, client}, []string{o.RequestID, "not-there"})
		if err != nil || len(got) != 1 || got[orderstore.Key{ClientID: client, RequestID: o.RequestID}].ID != o.ID {
			t.Fatalf("read by request_id: %v, %v; want exactly order %s", got, err, o.ID)
		}
	})
	if r.FullScan >= grown {
		t.Errorf("reading 15 repeated requests read %d order rows in full scans, of %d; want each found through its key", r.FullScan, grown+15)
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
	r := readsAsOrdersGrow(t, db, one, client, func(o order.Order) {
		t.Helper()
		got, err := orderstore.Get(ctx, one, client, o.ID)
		if err != nil || got.ID != o.ID || got.RequestID != o.RequestID {
			t.Fatalf("get order %s: %+v, %v", o.ID, got, err)
		}
		if _, err := orderstore.Get(ctx, one, other, o.ID); !errors.Is(err, orderstore.ErrNotFound) {
			t.Fatalf("another client read order %s: %v, want ErrNotFound", o.ID, err)
		}
	})
	if r.FullScan+r.ByIndex >= grown {
		t.Errorf("30 reads of one order each read %d order rows (%d in full scans, %d through indexes), of %d; want each found through its id",
			r.FullScan+r.ByIndex, r.FullScan, r.ByIndex, grown+15)
	}
}

// TestMovesFindTheirOrdersThroughTheKeyAsTheTableGrows: a step's moves
// (TransitionMany) find each order through the primary key however much
// the table grew since the statement first ran. The join "o.order_id =
// v.id AND o.status = v.from_status", cached while orders was nearly
// empty, was a hash join over a full scan at every move.
func TestMovesFindTheirOrdersThroughTheKeyAsTheTableGrows(t *testing.T) {
	ctx, db, client := newTest(t)
	one := testenv.OneConnection(t, db)
	r := readsAsOrdersGrow(t, db, one, client, func(o order.Order) {
		t.Helper()
		err := pgx.BeginFunc(ctx, one, func(tx pgx.Tx) error {
			m, err := orderstore.Transition(ctx, tx, o.ID, order.StatusProcessing, order.StatusReserved, "")
			if err == nil && !m.OK {
				err = fmt.Errorf("not moved: %+v", m)
			}
			return err
		})
		if err != nil {
			t.Fatalf("move order %s to reserved: %v", o.ID, err)
		}
	})
	if r.FullScan >= grown {
		t.Errorf("moving 15 orders read %d order rows in full scans, of %d; want each found through its key", r.FullScan, grown+15)
	}
}

// TestStaysAreReadThroughTheKeyOnGenericPlans: a move that does not
// happen (the order is no longer in its from status: a redelivery) reads
// the order's current status through the primary key, on the generic plan
// the steps' transactions use (postgres.GenericPlans), made while orders
// was nearly empty.
func TestStaysAreReadThroughTheKeyOnGenericPlans(t *testing.T) {
	ctx, db, client := newTest(t)
	one := testenv.OneConnection(t, db)
	r := readsAsOrdersGrow(t, db, one, client, func(o order.Order) {
		t.Helper()
		err := pgx.BeginTxFunc(ctx, one, postgres.GenericPlans, func(tx pgx.Tx) error {
			m, err := orderstore.Transition(ctx, tx, o.ID, order.StatusReserved, order.StatusPaid, "")
			if err == nil && (m.OK || m.Current != order.StatusProcessing) {
				err = fmt.Errorf("moved or read wrong: %+v", m)
			}
			return err
		})
		if err != nil {
			t.Fatalf("move order %s from reserved: %v", o.ID, err)
		}
	})
	if r.FullScan >= grown {
		t.Errorf("15 moves that did not happen read %d order rows in full scans, of %d; want each found through its key", r.FullScan, grown+15)
	}
}

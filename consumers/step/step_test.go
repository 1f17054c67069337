package step_test

import (
	"fmt"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"orderpipe/consumers/step"
	"orderpipe/shared/order"
	"orderpipe/shared/orderevent"
	"orderpipe/shared/orderstore"
	"orderpipe/shared/tenant"
	"orderpipe/shared/tooling/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// TestLockOrdersFindsOrdersThroughTheKeyAsTheTableGrows: a step's lock of
// its batch's orders finds each through the primary key however much the
// table grew since the statement first ran. "order_id = ANY($1)", cached
// while orders was nearly empty, was a full scan at every batch.
func TestLockOrdersFindsOrdersThroughTheKeyAsTheTableGrows(t *testing.T) {
	t.Parallel()
	ctx, db := t.Context(), testenv.DB(t)
	c, err := tenant.Create(ctx, db.Pool, "shop")
	if err != nil {
		t.Fatal(err)
	}
	one := testenv.OneConnection(t, db)
	const before, after = 10, 5
	ids := make([]uuid.UUID, before+after)
	for i := range ids {
		req, err := order.DecodeCreateRequest(fmt.Appendf(nil, `{"request_id":"lock-%d","user_id":7,"items":[{"sku":"SKU-1","quantity":2}],"amount":"1.00","currency":"CNY"}`, i), order.DecodeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		r, err := orderstore.Insert(ctx, db.Pool, c.ClientID, req, orderstore.InsertOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = r.Order.ID
	}
	lock := func(id uuid.UUID) {
		t.Helper()
		ms := []step.Message{{Event: orderevent.Event{OrderID: id}}, {Event: orderevent.Event{OrderID: id}}}
		err := pgx.BeginFunc(ctx, one, func(tx pgx.Tx) error {
			got, err := step.LockOrders(ctx, tx, ms)
			if err == nil && (len(got) != 1 || got[id].Status != order.StatusProcessing || len(got[id].Items) == 0) {
				err = fmt.Errorf("locked %+v, want order %s processing with its items", got, id)
			}
			return err
		})
		if err != nil {
			t.Fatalf("lock order %s: %v", id, err)
		}
	}
	for _, id := range ids[:before] {
		lock(id) // past the runs after which a plan may be cached
	}
	const grown = 20000
	testenv.GrowOrders(t, db.Pool, c.ClientID, grown)
	for _, id := range ids[before:] {
		lock(id)
	}
	if _, err := one.Exec(ctx, `UPDATE orders SET updated_at = updated_at WHERE order_id = $1`, ids[0]); err != nil {
		t.Fatal(err)
	}
	if r := testenv.TableReads(t, db, one, "orders", 1); r.FullScan >= grown {
		t.Errorf("locking %d orders read %d order rows in full scans, of %d; want each found through its key", before+after, r.FullScan, grown+len(ids))
	}
}

package inventory_test

import (
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"orderpipe/consumers/inventory"
	"orderpipe/consumers/pipetest"
	"orderpipe/shared/order"
	"orderpipe/shared/stock"
	"orderpipe/shared/tooling/pspserver"
	"orderpipe/shared/tooling/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func available(t *testing.T, e *pipetest.Env, sku string) int64 {
	t.Helper()
	var n int64
	if err := e.DB.Pool.QueryRow(t.Context(), `SELECT available FROM inventory WHERE sku = $1`, sku).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestReserveAllOrNoneAndReleaseOnce reserves two orders (the second one
// cannot get all its lines and takes none), then releases the first from
// several transactions at once: its stock comes back exactly once.
func TestReserveAllOrNoneAndReleaseOnce(t *testing.T) {
	t.Parallel()
	e := pipetest.New(t, pspserver.Options{})
	e.Stock(t, "A", 5)
	e.Stock(t, "B", 3)
	pipetest.Start(t, e.App, pipetest.Config(), inventory.Step())
	first := e.CreateOrder(t, "1.00", pipetest.Line{SKU: "A", Qty: 2}, pipetest.Line{SKU: "B", Qty: 2}, pipetest.Line{SKU: "A", Qty: 1})
	testenv.WaitFor(t, 20*time.Second, "the first order reserved", func() bool { return e.Status(t, first) == order.StatusReserved })
	second := e.CreateOrder(t, "1.00", pipetest.Line{SKU: "A", Qty: 1}, pipetest.Line{SKU: "B", Qty: 2})
	testenv.WaitFor(t, 20*time.Second, "the second order rejected", func() bool { return e.Status(t, second) == order.StatusRejected })
	if a, b := available(t, e, "A"), available(t, e, "B"); a != 2 || b != 1 {
		t.Fatalf("after reserving: A=%d B=%d, want 2 and 1 (the rejected order took nothing)", a, b)
	}
	var n int
	_ = e.DB.Pool.QueryRow(t.Context(), `SELECT count(*) FROM reservations WHERE order_id = $1`, first).Scan(&n)
	if n != 2 {
		t.Fatalf("%d reservation lines, want one per SKU (2)", n)
	}

	var wg sync.WaitGroup
	released := make([]int, 4)
	for i := range released {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := pgx.BeginFunc(t.Context(), e.DB.Pool, func(tx pgx.Tx) error {
				var err error
				released[i], err = stock.Release(t.Context(), tx, first)
				return err
			})
			if err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	total := 0
	for _, r := range released {
		total += r
	}
	if total != 2 {
		t.Fatalf("released %v lines in all, want 2", released)
	}
	if a, b := available(t, e, "A"), available(t, e, "B"); a != 5 || b != 3 {
		t.Fatalf("after release: A=%d B=%d, want 5 and 3", a, b)
	}
}

func TestSetListSeed(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	ctx := t.Context()
	if err := stock.Seed(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	if err := stock.Set(ctx, db.Pool, "SKU-1", 7); err != nil {
		t.Fatal(err)
	}
	if err := stock.Seed(ctx, db.Pool); err != nil { // leaves SKU-1 alone
		t.Fatal(err)
	}
	levels, err := stock.List(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(levels) != 100 || levels[0].SKU != "SKU-1" || levels[0].Available != 7 || levels[99].Available != 1_000_000 {
		t.Fatalf("levels: %d, first %+v, last %+v", len(levels), levels[0], levels[len(levels)-1])
	}
	for _, bad := range []string{"", "a b", "x\n", string(make([]byte, 65))} {
		if err := stock.Set(ctx, db.Pool, bad, 1); err == nil {
			t.Errorf("Set(%q) accepted", bad)
		}
	}
	if err := stock.Set(ctx, db.Pool, "SKU-2", -1); err == nil {
		t.Error("negative stock accepted")
	}
}

// TestReserveManyServesInOrderAllOrNone: one ReserveMany call serves its
// orders in the order given, each all of its lines or none, from what the
// earlier ones left: the second order finds B short and takes nothing (not
// even its A), the third gets the A that the second left, the fourth names
// an unknown SKU.
func TestReserveManyServesInOrderAllOrNone(t *testing.T) {
	t.Parallel()
	e := pipetest.New(t, pspserver.Options{})
	e.Stock(t, "A", 5)
	e.Stock(t, "B", 3)
	var ids [4]uuid.UUID
	for i := range ids {
		ids[i], _ = e.InsertOrder(t, "1.00", pipetest.Line{SKU: "A", Qty: 1})
	}
	var problems [][]string
	err := pgx.BeginFunc(t.Context(), e.DB.Pool, func(tx pgx.Tx) error {
		var err error
		problems, err = stock.ReserveMany(t.Context(), tx, []stock.Want{
			{OrderID: ids[0], Lines: []stock.Line{{SKU: "A", Qty: 2}, {SKU: "B", Qty: 2}}},
			{OrderID: ids[1], Lines: []stock.Line{{SKU: "A", Qty: 2}, {SKU: "B", Qty: 2}}},
			{OrderID: ids[2], Lines: []stock.Line{{SKU: "A", Qty: 3}}},
			{OrderID: ids[3], Lines: []stock.Line{{SKU: "A", Qty: 1}, {SKU: "NOPE", Qty: 1}}},
		})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(problems) != 4 || len(problems[0]) != 0 || len(problems[1]) != 1 || len(problems[2]) != 0 || len(problems[3]) != 2 {
		t.Fatalf("problems %q; want none, B short, none, A short and an unknown SKU", problems)
	}
	if a, b := available(t, e, "A"), available(t, e, "B"); a != 0 || b != 1 {
		t.Errorf("available A %d B %d; want 0 and 1", a, b)
	}
	var held [4]int64
	for i, id := range ids {
		if err := e.DB.Pool.QueryRow(t.Context(), `SELECT coalesce(sum(quantity), 0) FROM reservations WHERE order_id = $1`, id).Scan(&held[i]); err != nil {
			t.Fatal(err)
		}
	}
	if held != [4]int64{4, 0, 3, 0} {
		t.Errorf("held per order %v; want [4 0 3 0]", held)
	}
}

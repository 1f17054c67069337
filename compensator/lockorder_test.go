package compensator_test

import (
	"testing"
	"time"

	"orderpipe/compensator"
	"orderpipe/shared/order"
	"orderpipe/shared/tooling/testenv"
)

// TestUnwindBatchLocksStockInSKUOrder: a batch that unwinds an order of
// SKU-2 and then one of SKU-1 does not hold SKU-2's stock row while it
// waits for SKU-1's. It gives the stock back at the end of the batch, every
// SKU once and in SKU order, as a reservation does, so a step's transaction
// that holds SKU-1 and then asks for SKU-2 is not deadlocked with it (before,
// PostgreSQL broke the cycle after deadlock_timeout by failing one of them).
func TestUnwindBatchLocksStockInSKUOrder(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := t.Context()
	first := w.newOrder(spec{status: order.StatusReserved, lines: map[string]int{"SKU-2": 1}})
	second := w.newOrder(spec{status: order.StatusReserved, lines: map[string]int{"SKU-1": 1}})
	w.age(first, second)

	// A step's transaction: SKU-1 first, then SKU-2 (sorted, as Reserve does).
	tx, err := w.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT 1 FROM inventory WHERE sku = 'SKU-1' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	type result struct {
		res compensator.Result
		err error
	}
	done := make(chan result, 1)
	c := w.comp(w.cfg(compensator.NoRedrive), w.psp)
	go func() {
		res, err := c.RunOnce(ctx)
		done <- result{res, err}
	}()
	testenv.WaitFor(t, time.Minute, "the compensator waiting for SKU-1's stock row", func() bool {
		return w.int(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`) == 1
	})
	if _, err := tx.Exec(ctx, `SELECT 1 FROM inventory WHERE sku = 'SKU-2' FOR UPDATE`); err != nil {
		t.Fatalf("the step's transaction, asking for SKU-2 while the compensator waits for SKU-1: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("pass: %v", r.err)
	}
	unwound := 0
	for _, a := range r.res.Actions {
		if a.Kind == compensator.KindUnwind {
			unwound++
		}
	}
	if unwound != 2 || w.status(first) != order.StatusCancelled || w.status(second) != order.StatusCancelled {
		t.Fatalf("unwound %d (%+v); statuses %s, %s; want both cancelled", unwound, r.res.Actions, w.status(first), w.status(second))
	}
	if got := w.int(`SELECT sum(available)::int FROM inventory`); got != 200 {
		t.Fatalf("stock after the unwinds: %d, want all 200 back", got)
	}
}

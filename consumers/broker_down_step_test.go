package consumers_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"orderpipe/consumers"
	"orderpipe/consumers/step"
	"orderpipe/shared/metrics"
	"orderpipe/shared/order"
	"orderpipe/shared/orderstore"
	"orderpipe/shared/outbox"
	"orderpipe/shared/tooling/testenv"
)

// TestStepCountsMovesWhileTheBrokerIsDown: a step that commits a move to a
// terminal state while NATS is down answers committed, counts the order
// finished (the success-rate alert reads that counter) and times its stage,
// and leaves the move's event pending in the outbox for the relay. Not
// parallel: the counters are the process's, and no other test may move
// them meanwhile.
func TestStepCountsMovesWhileTheBrokerIsDown(t *testing.T) {
	ns, e := onOwnNATS(t)
	id, _ := e.InsertOrder(t, "3.00", lines...)
	for _, m := range [][2]order.Status{{order.StatusProcessing, order.StatusReserved}, {order.StatusReserved, order.StatusPaid}} {
		if err := testenv.Move(t.Context(), e.DB.Pool, id, m[0], m[1], ""); err != nil {
			t.Fatal(err)
		}
	}
	c := consumers.NewCommitter(e.App, "confirm")
	finished := func() float64 {
		return testutil.ToFloat64(metrics.OrdersFinished.WithLabelValues(string(order.StatusConfirmed)))
	}
	timed := func() uint64 { return stageSeconds(t, order.StatusConfirmed).GetSampleCount() }
	finishedBefore, timedBefore := finished(), timed()

	ns.Stop()
	testenv.WaitFor(t, 10*time.Second, "the client to see the broker gone", func() bool { return !e.App.NC.IsConnected() })
	var events []outbox.Row
	fresh, committed, err := c.Commit(t.Context(), "confirm-"+id.String(), func(ctx context.Context, tx pgx.Tx) ([]outbox.Row, error) {
		rows, err := step.Published(orderstore.TransitionMany(ctx, tx, []orderstore.Move{{ID: id, From: order.StatusPaid, To: order.StatusConfirmed}}))
		events = rows
		return rows, err
	})
	if err != nil || !fresh || !committed {
		t.Fatalf("commit with the broker down: fresh %v, committed %v, err %v; want a fresh commit", fresh, committed, err)
	}
	if s := e.Status(t, id); s != order.StatusConfirmed {
		t.Fatalf("order %s; want confirmed", s)
	}
	// The step counts its moves before it answers.
	if f, n := finished()-finishedBefore, timed()-timedBefore; f != 1 || n != 1 {
		t.Errorf("with the broker down, %v order(s) counted confirmed and %d stage time(s) observed; want 1 and 1", f, n)
	}
	if len(events) != 1 {
		t.Fatalf("outbox rows of the move: %v; want one", events)
	}
	pending := testenv.Column[int64](t, e.DB.Pool, `SELECT id FROM outbox WHERE id = $1 AND published_at IS NULL`, events[0].ID)
	if len(pending) != 1 {
		t.Errorf("the confirmed event was stamped published with the broker down; want it pending for the relay")
	}
}

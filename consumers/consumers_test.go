package consumers_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"orderpipe/consumers"
	"orderpipe/consumers/pipetest"
	"orderpipe/consumers/step"
	"orderpipe/shared/metrics"
	"orderpipe/shared/order"
	"orderpipe/shared/redelivery"
	"orderpipe/shared/tooling/pspserver"
	"orderpipe/shared/tooling/testenv"
)

// TestMain runs the tests, or, in a child that a fault test started, the
// consumers command (testenv.MainWith).
func TestMain(m *testing.M) { testenv.MainWith(m, consumers.Command()) }

// started is when this test binary started: no order of its tests is older.
var started = time.Now()

// stageSeconds reads the histogram of the time from acceptance to status.
func stageSeconds(t *testing.T, status order.Status) *dto.Histogram {
	t.Helper()
	var d dto.Metric
	if err := metrics.StageSeconds.WithLabelValues(string(status)).(prometheus.Histogram).Write(&d); err != nil {
		t.Fatal(err)
	}
	return d.GetHistogram()
}

func TestHappyPathAndRejection(t *testing.T) {
	t.Parallel()
	e := pipetest.New(t, pspserver.Options{})
	e.Stock(t, "SKU-1", 10)
	e.Stock(t, "SKU-2", 1)
	pipetest.Start(t, e.App, pipetest.Config(), e.Steps(2*time.Second)...)
	ok := e.CreateOrder(t, "39.98", pipetest.Line{SKU: "SKU-1", Qty: 2}, pipetest.Line{SKU: "SKU-2", Qty: 1})
	noStock := e.CreateOrder(t, "10.00", pipetest.Line{SKU: "SKU-1", Qty: 1}, pipetest.Line{SKU: "SKU-2", Qty: 5})
	unknown := e.CreateOrder(t, "10.00", pipetest.Line{SKU: "NOPE", Qty: 1})
	e.WaitTerminal(t, 30*time.Second)
	if s := e.Status(t, ok); s != order.StatusConfirmed {
		t.Errorf("order with stock: %s, want confirmed", s)
	}
	for _, id := range []any{noStock, unknown} {
		var s, reason string
		if err := e.DB.Pool.QueryRow(t.Context(), `SELECT status, coalesce(reason, '') FROM orders WHERE order_id = $1`, id).Scan(&s, &reason); err != nil {
			t.Fatal(err)
		}
		if s != string(order.StatusRejected) || reason == "" {
			t.Errorf("order %v: %s (%q), want rejected with a reason", id, s, reason)
		}
	}
	e.CheckInvariants(t)
	for _, c := range []struct {
		name string
		v    float64
	}{
		{"processed by inventory", testutil.ToFloat64(metrics.HandlerMessages.WithLabelValues("inventory", metrics.HandlerProcessed))},
		{"orders confirmed", testutil.ToFloat64(metrics.OrdersFinished.WithLabelValues("confirmed"))},
		{"orders rejected", testutil.ToFloat64(metrics.OrdersFinished.WithLabelValues("rejected"))},
	} {
		if c.v < 1 {
			t.Errorf("metric %s = %v, want at least 1", c.name, c.v)
		}
	}
	// The time from acceptance to confirmed is observed, and is a time
	// this process's tests took (other tests run beside this one), not
	// one read off a wrong clock.
	h := stageSeconds(t, order.StatusConfirmed)
	if n, sum := h.GetSampleCount(), h.GetSampleSum(); n < 1 || sum <= 0 || sum/float64(n) > time.Since(started).Seconds() {
		t.Errorf("acceptance → confirmed: %d observations, %.3f s in all; want at least one, each under %s", n, sum, time.Since(started))
	}
}

// TestSlowStepKeepsItsMessage: a payment call that takes four times the
// AckWait is not redelivered meanwhile (in-progress acks), so the step runs
// once.
func TestSlowStepKeepsItsMessage(t *testing.T) {
	t.Parallel()
	e := pipetest.New(t, pspserver.Options{Latency: 2 * time.Second})
	e.Stock(t, "SKU-1", 10)
	cfg := pipetest.Config()
	cfg.AckWait = 500 * time.Millisecond
	steps := e.Steps(10 * time.Second)
	var runs, maxDelivered atomic.Int64
	inner := steps[1].Prepare
	steps[1].Prepare = func(ctx context.Context, m step.Message, c step.CommitIntent) error {
		runs.Add(1)
		if d := int64(m.Delivered); d > maxDelivered.Load() {
			maxDelivered.Store(d)
		}
		return inner(ctx, m, c)
	}
	pipetest.Start(t, e.App, cfg, steps...)
	id := e.CreateOrder(t, "1.00", pipetest.Line{SKU: "SKU-1", Qty: 1})
	e.WaitTerminal(t, 30*time.Second)
	if s := e.Status(t, id); s != order.StatusConfirmed {
		t.Fatalf("order: %s, want confirmed", s)
	}
	if runs.Load() != 1 || maxDelivered.Load() != 1 {
		t.Fatalf("payment ran %d times, delivered up to %d times; want once", runs.Load(), maxDelivered.Load())
	}
	e.CheckInvariants(t)
	// The handler latency histogram's buckets reach the longest a run may
	// take (with the default buckets, everything past 10 s fell into +Inf).
	// Its samples are the process's, fed by the parallel tests too: only
	// its buckets are checked.
	var d dto.Metric
	if err := metrics.HandlerDuration.WithLabelValues("payment").(prometheus.Histogram).Write(&d); err != nil {
		t.Fatal(err)
	}
	buckets := d.GetHistogram().GetBucket()
	if top, bound := buckets[len(buckets)-1].GetUpperBound(), redelivery.Default().MaxProcessing.Seconds(); top < bound {
		t.Errorf("handler latency buckets end at %v s, short of a run's bound of %v s", top, bound)
	}
}

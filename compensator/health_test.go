package compensator_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"orderpipe/shared/metrics"
	"orderpipe/shared/order"
)

// The tests of this file read process-wide metrics: none is parallel.

// lastSuccess reads orderpipe_compensator_last_success_timestamp_seconds
// as a time.
func lastSuccess() time.Time {
	return time.UnixMilli(int64(testutil.ToFloat64(metrics.CompensatorLastSuccess) * 1e3))
}

func phaseFailures(phase string) float64 {
	return testutil.ToFloat64(metrics.CompensatorPassFailures.WithLabelValues(phase))
}

// TestPassesSayWhetherTheyComplete: a pass that completes sets the time of
// the last completed pass; a pass with a phase that fails at every pass
// counts the failure by phase and leaves that time where it was, so that
// a compensator whose passes all fail is seen (before, the failure went to
// the log only and every gauge just stayed as it was).
func TestPassesSayWhetherTheyComplete(t *testing.T) {
	w := newWorld(t)
	w.newOrder(spec{status: order.StatusProcessing})
	c := w.comp(w.cfg(3), w.psp)

	before := time.Now().Add(-time.Millisecond)
	w.pass(c)
	if got := lastSuccess(); got.Before(before) || got.After(time.Now()) {
		t.Fatalf("last completed pass at %s, want between %s and now", got, before)
	}

	// A phase that fails at every pass (its table is gone).
	w.exec(`ALTER TABLE idempotency_tokens RENAME TO idempotency_tokens_away`)
	completed := lastSuccess()
	tokens, measure := phaseFailures("tokens"), phaseFailures("measure")
	for range 2 {
		if _, err := c.RunOnce(t.Context()); err == nil {
			t.Fatal("a pass without the tokens table succeeded")
		}
	}
	if got := phaseFailures("tokens") - tokens; got != 2 {
		t.Fatalf("tokens phase failures +%v, want +2", got)
	}
	if got := phaseFailures("measure") - measure; got != 0 {
		t.Fatalf("measure phase failures +%v, want 0", got)
	}
	if got := lastSuccess(); !got.Equal(completed) {
		t.Fatalf("failed passes moved the last completed pass from %s to %s", completed, got)
	}

	w.exec(`ALTER TABLE idempotency_tokens_away RENAME TO idempotency_tokens`)
	w.pass(c)
	if got := lastSuccess(); !got.After(completed) {
		t.Fatalf("a pass that completed left the last completed pass at %s", got)
	}
}

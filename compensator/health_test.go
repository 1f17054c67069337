package compensator_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"orderpipe/compensator"
	"orderpipe/shared/metrics"
	"orderpipe/shared/natsjs"
	"orderpipe/shared/order"
	"orderpipe/shared/outbox"
	"orderpipe/shared/psp"
	"orderpipe/shared/tooling/pspserver"
	"orderpipe/shared/tooling/testenv"
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
// the log only and every gauge just stayed as it was). The pass also
// reports the oldest outbox event nobody published.
func TestPassesSayWhetherTheyComplete(t *testing.T) {
	w := newWorld(t)
	w.newOrder(spec{status: order.StatusProcessing})
	// An event left pending ten minutes ago (its publisher died).
	w.exec(`UPDATE outbox SET published_at = NULL, created_at = now() - interval '10 minutes' WHERE id = (SELECT min(id) FROM outbox)`)
	c := w.comp(w.cfg(3), w.psp)

	before := time.Now().Add(-time.Millisecond)
	w.pass(c)
	if got := lastSuccess(); got.Before(before) || got.After(time.Now()) {
		t.Fatalf("last completed pass at %s, want between %s and now", got, before)
	}
	if got := testutil.ToFloat64(metrics.OutboxOldestPendingAge); got < 590 || got > 700 {
		t.Fatalf("oldest pending outbox event %v s old, want about 600", got)
	}
	w.pass(c) // the first pass republished it
	if got := testutil.ToFloat64(metrics.OutboxOldestPendingAge); got != 0 {
		t.Fatalf("oldest pending outbox event %v s old after its republish, want 0", got)
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

// TestARefundTheProviderFailsIsReported: a cancelled order holds a
// succeeded charge and the provider fails every refund. Each pass asks
// again and counts the failure; the refund stays due and the gauges say
// so, with the time since the order was cancelled. The passes still count
// as completed (the provider's failure has its own alert). Before, the
// failure went to the log only and refunds were counted when they
// succeeded.
func TestARefundTheProviderFailsIsReported(t *testing.T) {
	w, id := newWorldWithOrder(t, spec{status: order.StatusPaid, lines: map[string]int{"SKU-1": 1}, payment: "succeeded"})
	failing := psp.NewClient(testenv.ServePSP(t, w.db.Pool, pspserver.Options{ErrorRate: 1}), 5*time.Second)
	w.age(id)
	c := w.comp(w.cfg(compensator.NoRedrive), failing)
	failures, refundPhase := testutil.ToFloat64(metrics.RefundFailures), phaseFailures("refunds")

	before := time.Now().Add(-time.Millisecond)
	res, err := c.RunOnce(t.Context())
	if err == nil || !psp.IsTransient(err) || res.Unwound != 1 || res.Refunded != 0 {
		t.Fatalf("first pass: %+v, %v; want the order unwound and its refund failed", res, err)
	}
	if w.status(id) != order.StatusCancelled {
		t.Fatal("not unwound")
	}
	// The order was cancelled an hour ago.
	w.exec(`UPDATE orders SET updated_at = now() - interval '1 hour' WHERE order_id = $1`, id)
	if _, err := c.RunOnce(t.Context()); err == nil {
		t.Fatal("second pass: the refund did not fail")
	}
	if got := testutil.ToFloat64(metrics.RefundsDue); got != 1 {
		t.Fatalf("refunds due %v, want 1", got)
	}
	if got := testutil.ToFloat64(metrics.OldestRefundDueAge); got < 3590 || got > 3700 {
		t.Fatalf("oldest refund due %v s, want about 3600", got)
	}
	if got := testutil.ToFloat64(metrics.RefundFailures) - failures; got != 2 {
		t.Fatalf("refund failures +%v, want +2", got)
	}
	if got := phaseFailures("refunds") - refundPhase; got != 2 {
		t.Fatalf("refunds phase failures +%v, want +2", got)
	}
	if got := lastSuccess(); got.Before(before) {
		t.Fatalf("passes whose only failure was the provider's did not count as completed: last at %s", got)
	}
	if n := w.int(`SELECT count(*) FROM psp_refunds`); n != 0 {
		t.Fatalf("provider refunds %d, want 0", n)
	}

	// The provider is back: refunded, nothing due any more.
	if res := w.pass(w.comp(w.cfg(compensator.NoRedrive), w.psp)); res.Refunded != 1 {
		t.Fatalf("pass with the provider back: %+v", res)
	}
	if due, age := testutil.ToFloat64(metrics.RefundsDue), testutil.ToFloat64(metrics.OldestRefundDueAge); due != 0 || age != 0 {
		t.Fatalf("after the refund: due %v, oldest %v s; want 0 and 0", due, age)
	}
}

// TestABrokerLostMidPassStillCompletesThePass: the broker answers the
// pass's broker phase and goes away while heal asks about an event. The
// pass skips the phases that need the broker, says the broker is down
// (orderpipe_compensator_broker_up 0, which has its alert), and counts as
// completed: the compensator itself is fine. Before, only a broker found
// down by the broker phase counted so; a heal that lost it made a failed
// pass, and a publish that lost it (outbox's own sentinel) did not even
// skip the phases after it.
func TestABrokerLostMidPassStillCompletesThePass(t *testing.T) {
	w := newWorld(t)
	w.newOrder(spec{status: order.StatusProcessing}) // before and after it: its deletion is inside the stream
	lost := w.newOrder(spec{status: order.StatusProcessing})
	w.newOrder(spec{status: order.StatusProcessing})
	c := w.comp(w.cfg(3), w.psp)
	w.pass(c) // a completed pass, so that the last one's time is exported
	w.deleteEvent(lost)
	compensator.SetLookupHook(c, func(uuid.UUID) { w.nats.Conn.Close() })
	t.Cleanup(func() { // the test's own connection is closed: delete its stream over another
		nc, js, err := natsjs.Connect(w.nats.URL, t.Name(), testenv.Logger(t))
		if err != nil {
			t.Error(err)
			return
		}
		defer nc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = js.DeleteStream(ctx, w.nats.Topology.Stream)
	})
	renotify, republish := phaseFailures("renotify"), phaseFailures("republish")
	before := time.Now().Add(-time.Millisecond)
	res, err := c.RunOnce(t.Context())
	if err == nil || !errors.Is(err, compensator.ErrBrokerUnavailable) || !res.BrokerUnavailable {
		t.Fatalf("pass: %+v, %v; want the broker unavailable", res, err)
	}
	if got := lastSuccess(); got.Before(before) {
		t.Fatalf("a pass whose only failure was the broker did not count as completed: last at %s", got)
	}
	if got := testutil.ToFloat64(metrics.CompensatorBrokerUp); got != 0 {
		t.Fatalf("broker up %v, want 0", got)
	}
	if r, p := phaseFailures("renotify")-renotify, phaseFailures("republish")-republish; r != 0 || p != 0 {
		t.Fatalf("renotify +%v, republish +%v failures; want them skipped", r, p)
	}
}

// TestOutboxBrokerErrorsAreTheCompensators: the relay's publishes and the
// compensator's own lookups report an unreachable broker with one
// sentinel, so a pass sees both.
func TestOutboxBrokerErrorsAreTheCompensators(t *testing.T) {
	if !errors.Is(fmt.Errorf("publish: %w", outbox.ErrBrokerUnavailable), compensator.ErrBrokerUnavailable) {
		t.Fatal("outbox.ErrBrokerUnavailable is not compensator.ErrBrokerUnavailable")
	}
}

package compensator_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"orderpipe/compensator"
	"orderpipe/shared/config"
	"orderpipe/shared/metrics"
	"orderpipe/shared/natsjs"
	"orderpipe/shared/order"
	"orderpipe/shared/orderevent"
	"orderpipe/shared/outbox"
	"orderpipe/shared/tooling/testenv"
)

// onOwnNATS moves w onto a NATS server of the test's own (so that the test
// can stop it) with the production topology.
func (w *world) onOwnNATS() *testenv.NATSServer {
	w.t.Helper()
	srv := testenv.OwnNATS(w.t)
	nc, js := testenv.Connect(w.t, srv.URL())
	if _, err := natsjs.EnsureStream(w.t.Context(), js, orderevent.DefaultTopology, 1); err != nil {
		w.t.Fatal(err)
	}
	w.nats = &testenv.NATSEnv{URL: srv.URL(), Topology: orderevent.DefaultTopology, Conn: nc, JS: js}
	w.relay = &outbox.Relay{Pool: w.db.Pool, JS: js, Topology: orderevent.DefaultTopology, Logger: testenv.Logger(w.t)}
	return srv
}

// ageOutage moves the broker's last outage, and its return, a deadline
// (w.cfg's) into the past.
func (w *world) ageOutage() {
	w.t.Helper()
	w.exec(`UPDATE broker_outage SET back_at = back_at - interval '2 minutes', unavailable_at = unavailable_at - interval '2 minutes'`)
}

// unstamp forgets the stream sequences of the events published so far.
// A compensator run as a command watches the production stream, which does
// not hold the events the test published on its own topology: it would
// heal them as lost (and heal runs before the stuck orders' scan).
func (w *world) unstamp() {
	w.t.Helper()
	w.exec(`UPDATE outbox SET stream_seq = NULL`)
}

// snapshot is what a pass must not change while the broker is away.
func (w *world) snapshot(ids []uuid.UUID) string {
	w.t.Helper()
	return w.str(`SELECT string_agg(order_id || ' ' || status || ' ' || redrive_attempts, ', ' ORDER BY order_id) ||
		' actions=' || (SELECT count(*) FROM compensator_actions) ||
		' refunds=' || (SELECT count(*) FROM psp_refunds) ||
		' outbox=' || (SELECT count(*) FROM outbox)
		FROM orders WHERE order_id = ANY($1)`, ids)
}

// TestBrokerDownCostsTimeNotOrders: with NATS down for many more passes
// than the re-drive budget allows, the compensator counts no attempt and
// unwinds nothing (before, every pass counted a re-drive whose publish had
// failed, and the orders were unwound and refunded). Each pass says the
// broker is unavailable: its error, its summary, the metric. Once the
// broker is back, the re-drives go out and count.
func TestBrokerDownCostsTimeNotOrders(t *testing.T) { // not parallel: it reads a process-wide gauge
	w := newWorld(t)
	srv := w.onOwnNATS()
	fresh := w.newOrder(spec{status: order.StatusProcessing})
	last := w.newOrder(spec{status: order.StatusReserved, lines: map[string]int{"SKU-1": 2}})
	w.exec(`UPDATE orders SET redrive_attempts = 2, redrive_status = 'reserved' WHERE order_id = $1`, last)
	paid := w.newOrder(spec{status: order.StatusPaid, lines: map[string]int{"SKU-1": 1}, payment: "succeeded"})
	w.exec(`UPDATE orders SET redrive_attempts = 2, redrive_status = 'paid' WHERE order_id = $1`, paid)
	ids := []uuid.UUID{fresh, last, paid}
	before := w.snapshot(ids)
	c := w.comp(w.cfg(3), w.psp)

	srv.Stop()
	brokerFailures := phaseFailures("broker")
	for i := range 6 { // twice the re-drive budget
		w.age(ids...)
		before := time.Now().Add(-time.Millisecond)
		res, err := c.RunOnce(t.Context())
		if !errors.Is(err, compensator.ErrBrokerUnavailable) || !res.BrokerUnavailable {
			t.Fatalf("pass %d with the broker down: %+v, %v; want broker unavailable", i, res, err)
		}
		if res.Redriven+res.Unwound+res.Refunded != 0 || !strings.Contains(res.Summary(), "broker unavailable") {
			t.Fatalf("pass %d acted with the broker down: %s", i, res.Summary())
		}
		if g := testutil.ToFloat64(metrics.CompensatorBrokerUp); g != 0 {
			t.Fatalf("orderpipe_compensator_broker_up = %v with the broker down", g)
		}
		// The pass did all it could: it counts as completed (the broker
		// has its own alert), and its broker phase as failed.
		if got := lastSuccess(); got.Before(before) {
			t.Fatalf("pass %d with the broker down did not count as completed: last at %s", i, got)
		}
		if got := phaseFailures("broker") - brokerFailures; got != float64(i+1) {
			t.Fatalf("pass %d: broker phase failures +%v, want +%d", i, got, i+1)
		}
	}
	if after := w.snapshot(ids); after != before {
		t.Fatalf("the broker outage changed orders:\nbefore %s\nafter  %s", before, after)
	}

	srv.Start()
	testenv.WaitFor(t, 30*time.Second, "a pass that reaches the broker again", func() bool {
		_, err := c.RunOnce(t.Context())
		return !errors.Is(err, compensator.ErrBrokerUnavailable)
	})
	if g := testutil.ToFloat64(metrics.CompensatorBrokerUp); g != 1 {
		t.Fatalf("orderpipe_compensator_broker_up = %v with the broker back", g)
	}
	// The deadlines count again from the broker's return: nothing yet.
	if after := w.snapshot(ids); after != before {
		t.Fatalf("the first passes after the outage changed orders:\nbefore %s\nafter  %s", before, after)
	}
	w.ageOutage()
	w.pass(c)
	if n := w.int(`SELECT redrive_attempts FROM orders WHERE order_id = $1`, fresh); n != 1 {
		t.Fatalf("fresh order: %d attempts after the broker came back, want 1", n)
	}
	if w.status(fresh) != order.StatusProcessing {
		t.Fatalf("fresh order %s", w.status(fresh))
	}
	// The two at the end of their budget get their third, acknowledged,
	// re-drive, and only then, one deadline later, are unwound.
	w.age(ids...)
	res := w.pass(c)
	if res.Unwound != 0 && (w.int(`SELECT redrive_attempts FROM orders WHERE order_id = $1`, last) < 3) {
		t.Fatalf("unwound before its last re-drive was acknowledged: %+v", res)
	}
	w.age(ids...)
	w.pass(c)
	for _, id := range []uuid.UUID{last, paid} {
		if w.status(id) != order.StatusCancelled {
			t.Fatalf("order %s: %s after three acknowledged re-drives, want cancelled", id, w.status(id))
		}
	}
	w.wantPendingOutbox(0, "at the end")
}

// TestAnOutageAfterTheLastRedriveCostsTimeNotTheOrder: the last re-drive
// the budget allows was acknowledged, then the broker went away before the
// consumers could act on it, for longer than the deadline. The first pass
// that reaches the broker again must not unwind the order: its deadline
// counts from the broker's return (the consumers had no broker before).
// One deadline after the return, it is unwound as usual.
func TestAnOutageAfterTheLastRedriveCostsTimeNotTheOrder(t *testing.T) { // not parallel: it reads a process-wide gauge
	w := newWorld(t)
	srv := w.onOwnNATS()
	id := w.newOrder(spec{status: order.StatusReserved, lines: map[string]int{"SKU-1": 2}})
	w.exec(`UPDATE orders SET redrive_attempts = 3, redrive_status = 'reserved', redriven_at = now() WHERE order_id = $1`, id)
	c := w.comp(w.cfg(3), w.psp)

	srv.Stop()
	for i := range 2 {
		w.age(id)
		if _, err := c.RunOnce(t.Context()); !errors.Is(err, compensator.ErrBrokerUnavailable) {
			t.Fatalf("pass %d with the broker down: %v; want broker unavailable", i, err)
		}
	}
	srv.Start()
	testenv.WaitFor(t, 30*time.Second, "a pass that reaches the broker again", func() bool {
		_, err := c.RunOnce(t.Context())
		return !errors.Is(err, compensator.ErrBrokerUnavailable)
	})
	if st := w.status(id); st != order.StatusReserved {
		t.Fatalf("order %s right after the broker came back, want reserved: the outage cost the order", st)
	}
	if n := w.int(`SELECT count(*) FROM compensator_actions WHERE order_id = $1`, id); n != 0 {
		t.Fatalf("%d actions on the order right after the outage", n)
	}
	// A deadline after the broker's return, the order is stuck again.
	w.age(id)
	w.ageOutage()
	w.pass(c)
	if st := w.status(id); st != order.StatusCancelled {
		t.Fatalf("order %s a deadline after the broker came back, want cancelled", st)
	}
}

// TestRedriveNotAcknowledgedIsNotCounted: the broker answers the pass's
// check but does not take the re-drive (here: no stream captures its
// subject). The attempt is taken back — not counted, its event out of the
// outbox, no action recorded — and the pass says the broker is unavailable.
func TestRedriveNotAcknowledgedIsNotCounted(t *testing.T) {
	t.Parallel()
	w, id := newWorldWithOrder(t, spec{status: order.StatusProcessing})
	pending := w.int(`SELECT count(*) FROM outbox`)
	w.relay = &outbox.Relay{Pool: w.db.Pool, JS: w.nats.JS, Logger: testenv.Logger(t), PublishTimeout: time.Second,
		Topology: orderevent.Topology{Stream: w.nats.Topology.Stream, Prefix: "nowhere" + strings.ReplaceAll(uuid.NewString(), "-", "")}}
	c := w.comp(w.cfg(3), w.psp)
	for range 4 {
		w.age(id)
		res, err := c.RunOnce(t.Context())
		if !errors.Is(err, compensator.ErrBrokerUnavailable) || res.Redriven != 0 {
			t.Fatalf("pass: %+v, %v; want no re-drive counted and the broker unavailable", res, err)
		}
	}
	if n := w.int(`SELECT redrive_attempts FROM orders WHERE order_id = $1`, id); n != 0 {
		t.Fatalf("%d attempts counted for re-drives the broker never took", n)
	}
	if n := w.int(`SELECT count(*) FROM compensator_actions`); n != 0 {
		t.Fatalf("%d actions recorded", n)
	}
	if n := w.int(`SELECT count(*) FROM outbox`); n != pending {
		t.Fatalf("%d outbox rows, want the %d from before: an unacknowledged re-drive leaves", n, pending)
	}
	if w.status(id) != order.StatusProcessing {
		t.Fatalf("status %s", w.status(id))
	}
}

// TestRedriveLeasedByARelayIsCounted: another publisher (a relay, or a
// second compensator's republish) leases the re-drive's outbox row right
// after the pass commits it, so the pass's own publish leaves the row to
// that lease. The row is being published, not lost: the attempt counts,
// the row stays, and the pass reports no outage.
func TestRedriveLeasedByARelayIsCounted(t *testing.T) {
	t.Parallel()
	w, id := newWorldWithOrder(t, spec{status: order.StatusReserved})
	w.exec(`CREATE FUNCTION lease_at_once() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN NEW.claimed_until := now() + interval '1 minute'; RETURN NEW; END $$`)
	w.exec(`CREATE TRIGGER lease_at_once BEFORE INSERT ON outbox FOR EACH ROW EXECUTE FUNCTION lease_at_once()`)
	w.age(id)
	res, err := w.comp(w.cfg(3), w.psp).RunOnce(t.Context())
	if err != nil || res.Redriven != 1 {
		t.Fatalf("pass: %+v, %v; want the leased re-drive counted", res, err)
	}
	if n := w.int(`SELECT redrive_attempts FROM orders WHERE order_id = $1`, id); n != 1 {
		t.Fatalf("attempts %d, want 1", n)
	}
	if n := w.int(`SELECT count(*) FROM compensator_actions WHERE order_id = $1 AND action = 'redrive'`, id); n != 1 {
		t.Fatalf("recorded re-drives %d, want 1", n)
	}
	if n := w.int(`SELECT count(*) FROM outbox WHERE order_id = $1 AND published_at IS NULL AND claimed_until > now()`, id); n != 1 {
		t.Fatalf("leased pending rows %d, want the re-drive's row left to its lease holder", n)
	}
}

// TestForceSkipsTheWindowCheck: --force lets an operator run with windows
// that do not fit (here deadlines inside the consumers' horizon); what the
// forced run does is recorded as forced. Without --force the same command
// line is refused.
func TestForceSkipsTheWindowCheck(t *testing.T) {
	t.Parallel()
	w, id := newWorldWithOrder(t, spec{status: order.StatusReserved, lines: map[string]int{"SKU-1": 1}})
	w.exec(`UPDATE orders SET updated_at = now() - interval '1 hour' WHERE order_id = $1`, id)
	w.unstamp()
	cfg := config.Config{DatabaseURL: w.db.URL, NATSURL: w.nats.URL, PSPURL: w.pspURL}
	args := []string{"--once", "--stuck-after", "1m", "--max-attempts", "0"}
	if _, err := run(t, compensator.Command(), cfg, args...); err == nil || !strings.Contains(err.Error(), "does not fit") {
		t.Fatalf("without --force: %v, want refused", err)
	}
	if n := w.int(`SELECT count(*) FROM compensator_actions`); n != 0 {
		t.Fatal("a refused run acted")
	}
	out, err := run(t, compensator.Command(), cfg, append(args, "--force")...)
	if err != nil {
		t.Fatalf("with --force: %v\n%s", err, out)
	}
	if !strings.Contains(out, "forced pass") {
		t.Fatalf("output does not say the pass was forced:\n%s", out)
	}
	if w.status(id) != order.StatusCancelled {
		t.Fatalf("status %s, want cancelled by the forced run", w.status(id))
	}
	if n := w.int(`SELECT count(*) FROM compensator_actions WHERE order_id = $1 AND forced`, id); n != 1 {
		t.Fatalf("%d forced actions recorded, want 1", n)
	}
	// --once does not apply the daemon's interval rule; the daemon does.
	if _, err := run(t, compensator.Command(), config.Config{}, "--once", "--interval", "3h"); err != nil && strings.Contains(err.Error(), "does not fit") {
		t.Fatalf("--once with a long interval: %v", err)
	}
	if _, err := run(t, compensator.Command(), config.Config{}, "--interval", "3h"); err == nil || !strings.Contains(err.Error(), "does not fit") {
		t.Fatalf("the daemon with a long interval: %v, want refused", err)
	}
}

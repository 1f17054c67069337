package compensator_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"orderpipe/compensator"
	"orderpipe/consumers"
	"orderpipe/consumers/confirm"
	"orderpipe/consumers/inventory"
	"orderpipe/consumers/payment"
	"orderpipe/shared/order"
	"orderpipe/shared/psp"
	"orderpipe/shared/tooling/pspserver"
	"orderpipe/shared/tooling/testenv"
)

// flakyPSP is the payment stand-in behind a switch: while down it answers
// 503 to everything, without doing anything.
type flakyPSP struct {
	down atomic.Bool
	h    http.Handler
}

func (f *flakyPSP) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if f.down.Load() {
		http.Error(w, `{"error":"down","code":"unavailable"}`, http.StatusServiceUnavailable)
		return
	}
	f.h.ServeHTTP(w, r)
}

// pipeline is the consumers' router, in process, on the world's database
// and stream, with the payment step talking to a switchable provider.
type pipeline struct {
	w     *world
	psp   *flakyPSP
	url   string
	cfg   consumers.Config
	stop  context.CancelFunc
	done  chan error
	alive bool
}

func newPipeline(w *world, maxDeliver int) *pipeline {
	w.t.Helper()
	f := &flakyPSP{h: testenv.PSPHandler(w.t, w.db.Pool, pspserver.Options{})}
	hs := httptest.NewServer(f)
	w.t.Cleanup(hs.Close)
	c := consumers.Default()
	c.AckWait = 2 * time.Second
	c.MaxDeliver = maxDeliver
	c.Redelivery = []time.Duration{50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond}
	c.Retries = 1
	c.RetryInterval = 20 * time.Millisecond
	c.RetryMaxInterval = 100 * time.Millisecond
	c.DrainTimeout = 10 * time.Second
	c.MaxProcessing = 30 * time.Second
	p := &pipeline{w: w, psp: f, url: hs.URL, cfg: c}
	w.t.Cleanup(p.Stop)
	return p
}

// stoppedPipeline is newPipeline started once, to provision the durable
// consumers, and stopped.
func stoppedPipeline(w *world, maxDeliver int) *pipeline {
	w.t.Helper()
	p := newPipeline(w, maxDeliver)
	p.Start()
	p.Stop()
	return p
}

// Start runs the router until Stop (or the end of the test).
func (p *pipeline) Start() {
	t := p.w.t
	t.Helper()
	env := testenv.Env(t, p.w.db, p.w.nats)
	env.Config.PSPURL, env.Config.ShutdownTimeout = p.url, 10*time.Second
	pl, err := consumers.Build(env, p.cfg, inventory.Step(), payment.Step(p.w.db.Pool, psp.NewClient(p.url, 5*time.Second)), confirm.Step())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background()) // stopped by Stop, a cleanup, which t.Context() would precede
	p.stop, p.done, p.alive = cancel, make(chan error, 1), true
	go func() { p.done <- pl.Run(ctx) }()
	select {
	case <-pl.Running():
	case err := <-p.done:
		p.alive = false
		t.Fatalf("router stopped at start: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("router did not start")
	}
}

// Stop drains the router.
func (p *pipeline) Stop() {
	if !p.alive {
		return
	}
	p.alive = false
	p.stop()
	if err := <-p.done; err != nil {
		p.w.t.Logf("router stopped: %v", err)
	}
}

func (w *world) waitStatus(want order.Status, ids ...uuid.UUID) {
	w.t.Helper()
	testenv.WaitFor(w.t, 30*time.Second, "orders "+string(want), func() bool {
		for _, id := range ids {
			if w.status(id) != want {
				return false
			}
		}
		return true
	})
}

// checkInvariants: every order terminal; stock conserved (100 of each SKU
// at the start); one successful charge at most per order, refunded unless
// the order is confirmed, present if it is; no status twice in a history.
func (w *world) checkInvariants() {
	w.t.Helper()
	for what, q := range map[string]string{
		"order not terminal":                 `SELECT count(*) FROM orders WHERE status NOT IN ('confirmed', 'rejected', 'cancelled')`,
		"stock not conserved":                `SELECT count(*) FROM inventory i WHERE i.available + (SELECT coalesce(sum(quantity), 0) FROM reservations r WHERE r.sku = i.sku AND r.released_at IS NULL) <> 100`,
		"stock held by an unconfirmed order": `SELECT count(*) FROM reservations r JOIN orders o USING (order_id) WHERE r.released_at IS NULL AND o.status <> 'confirmed'`,
		"two charges for one order":          `SELECT count(*) FROM (SELECT reference FROM psp_charges WHERE state = 'succeeded' GROUP BY reference HAVING count(*) > 1) x`,
		"unrefunded charge of an unconfirmed order": `SELECT count(*) FROM orders o JOIN psp_charges c ON c.reference = o.order_id::text AND c.state = 'succeeded'
			LEFT JOIN psp_refunds r ON r.charge_id = c.charge_id WHERE o.status <> 'confirmed' AND r.refund_id IS NULL`,
		"refunded confirmed order": `SELECT count(*) FROM orders o JOIN psp_charges c ON c.reference = o.order_id::text JOIN psp_refunds r ON r.charge_id = c.charge_id WHERE o.status = 'confirmed'`,
		"confirmed order not charged": `SELECT count(*) FROM orders o WHERE o.status = 'confirmed'
			AND NOT EXISTS (SELECT 1 FROM psp_charges c WHERE c.reference = o.order_id::text AND c.state = 'succeeded')`,
		"status entered twice": `SELECT count(*) FROM (SELECT 1 FROM order_events GROUP BY order_id, status HAVING count(*) > 1) x`,
	} {
		if n := w.int(q); n != 0 {
			w.t.Errorf("invariant broken: %s (%d)", what, n)
		}
	}
}

// An order stuck in each open state because its event was lost is
// re-driven, and the consumers take it to confirmed.
func TestEventLostInEachStateIsRedrivenToConfirmed(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	p := newPipeline(w, 5)
	p.Start()
	processing := w.newOrder(spec{status: order.StatusProcessing, lines: map[string]int{"SKU-1": 2}, lost: true})
	reserved := w.newOrder(spec{status: order.StatusReserved, lines: map[string]int{"SKU-1": 1, "SKU-2": 1}, lost: true})
	// A paid order whose charge went through the same provider as the
	// step's (its key is the step's).
	paid := w.newOrder(spec{status: order.StatusPaid, lines: map[string]int{"SKU-2": 3}, payment: "succeeded", lost: true})
	ids := []uuid.UUID{processing, reserved, paid}
	w.age(ids...)
	res := w.pass(w.comp(w.cfg(3), w.psp))
	if res.Redriven != 3 || res.Stuck[order.StatusProcessing] != 1 || res.Stuck[order.StatusReserved] != 1 || res.Stuck[order.StatusPaid] != 1 {
		t.Fatalf("pass: %+v", res)
	}
	w.waitStatus(order.StatusConfirmed, ids...)
	w.checkInvariants()
	if n := w.int(`SELECT count(*) FROM psp_charges WHERE state = 'succeeded'`); n != 3 {
		t.Fatalf("charges %d", n)
	}
	// Confirmed orders are not stuck any more.
	w.age(ids...)
	if res := w.pass(w.comp(w.cfg(3), w.psp)); len(res.Actions) != 0 {
		t.Fatalf("acted on confirmed orders: %+v", res.Actions)
	}
	w.holdsTheContract()
}

// The consumers are down while an order is stuck: the compensator's
// re-drive waits in the stream next to the original event, and once the
// consumers are back the order is confirmed once.
func TestConsumersDownThenBack(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	p := stoppedPipeline(w, 5)
	id := w.newOrder(spec{status: order.StatusProcessing, lines: map[string]int{"SKU-1": 1}})
	w.age(id)
	if res := w.pass(w.comp(w.cfg(3), w.psp)); res.Redriven != 1 {
		t.Fatalf("%+v", res)
	}
	if w.status(id) != order.StatusProcessing {
		t.Fatal("moved without consumers")
	}
	p.Start()
	w.waitStatus(order.StatusConfirmed, id)
	w.checkInvariants()
	testenv.WaitFor(t, 10*time.Second, "both deliveries handled", func() bool {
		return w.int(`SELECT count(*) FROM processed_messages WHERE consumer = 'inventory' AND message_id LIKE $1`, id.String()+":accepted%") == 2
	})
}

// deadLetteredWhileProviderDown runs the pipeline with the provider down
// and creates an order of qty SKU-1, whose reserved event the payment step
// then dead-letters.
func deadLetteredWhileProviderDown(t *testing.T, qty int) (*world, *pipeline, uuid.UUID) {
	t.Helper()
	w := newWorld(t)
	p := newPipeline(w, 2)
	p.psp.down.Store(true)
	p.Start()
	id := w.newOrder(spec{status: order.StatusProcessing, lines: map[string]int{"SKU-1": qty}})
	testenv.WaitFor(t, 30*time.Second, "the reserved event dead-lettered", func() bool {
		return w.int(`SELECT count(*) FROM dead_letters WHERE order_id = $1`, id) == 1
	})
	return w, p, id
}

// The provider is down: the payment step dead-letters the order's reserved
// event. Once the provider is back, the re-drive gets it charged and
// confirmed.
func TestProviderDownThenBackIsRedrivenToConfirmed(t *testing.T) {
	t.Parallel()
	w, p, id := deadLetteredWhileProviderDown(t, 1)
	if w.status(id) != order.StatusReserved {
		t.Fatalf("status %s", w.status(id))
	}
	p.psp.down.Store(false)
	w.age(id)
	if res := w.pass(w.comp(w.cfg(3), w.psp)); res.Redriven != 1 || res.Actions[0].From != order.StatusReserved {
		t.Fatalf("%+v", res)
	}
	w.waitStatus(order.StatusConfirmed, id)
	w.checkInvariants()
}

// The provider stays down past every re-drive: the order is unwound, and
// its charge key — whose outcome was unknown while the provider was down —
// is voided once the provider is back: no charge, no refund.
func TestProviderDownPastEveryRedriveIsUnwound(t *testing.T) {
	t.Parallel()
	w, p, id := deadLetteredWhileProviderDown(t, 4)
	down := psp.NewClient(p.url, 5*time.Second)
	c := w.comp(w.cfg(1), down)
	w.age(id)
	if res := w.pass(c); res.Redriven != 1 {
		t.Fatalf("re-drive: %+v", res)
	}
	testenv.WaitFor(t, 30*time.Second, "the re-drive dead-lettered", func() bool {
		return w.int(`SELECT count(*) FROM dead_letters WHERE order_id = $1`, id) == 2
	})
	w.age(id)
	res, err := c.RunOnce(t.Context())
	if res.Unwound != 1 || err == nil || !psp.IsTransient(err) {
		t.Fatalf("unwind with the provider down: %+v %v", res, err)
	}
	if w.status(id) != order.StatusCancelled || w.int(`SELECT available FROM inventory WHERE sku = 'SKU-1'`) != 100 {
		t.Fatal("not unwound")
	}
	p.psp.down.Store(false)
	// The provider is back and never charged the key: the key is voided,
	// nothing is charged to learn that, and nothing is refunded.
	res = w.pass(c)
	if res.Refunded != 0 {
		t.Fatalf("refund: %+v", res)
	}
	w.checkInvariants()
	w.checkVoided(id)
	if res := w.pass(c); len(res.Actions) != 0 {
		t.Fatalf("acted again: %+v", res.Actions)
	}
	_ = compensator.KindRefund
}

// Two compensators unwind orders while the consumers' router, back from
// an outage, confirms the same orders: every order ends confirmed (and
// untouched by the compensators) or cancelled once with its stock back and
// its charge refunded once.
func TestTwoCompensatorsRaceTheRouter(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	p := stoppedPipeline(w, 5)
	const n = 16
	_, a, b := w.stuckPaid(n, 3)
	ctx := t.Context()
	errs := make(chan error, 8)
	done := make(chan struct{})
	for _, c := range []*compensator.Compensator{a, b} {
		go func() {
			defer func() { done <- struct{}{} }()
			for range 3 {
				if _, err := c.RunOnce(ctx); err != nil {
					errs <- err
				}
			}
		}()
	}
	p.Start()
	<-done
	<-done
	close(errs)
	for err := range errs {
		t.Logf("pass: %v", err) // a refund in flight elsewhere is settled by a later pass
	}
	// Settle what is left (refunds that were in flight), then check.
	testenv.WaitFor(t, 30*time.Second, "every charge of a cancelled order refunded", func() bool {
		_, _ = a.RunOnce(ctx)
		return w.int(`SELECT count(*) FROM payments p JOIN orders o USING (order_id) WHERE o.status = 'cancelled' AND p.status <> 'refunded'`) == 0 &&
			w.int(`SELECT count(*) FROM orders WHERE status NOT IN ('confirmed', 'cancelled')`) == 0
	})
	w.checkInvariants()
	cancelled := w.int(`SELECT count(*) FROM orders WHERE status = 'cancelled'`)
	confirmed := w.int(`SELECT count(*) FROM orders WHERE status = 'confirmed'`)
	t.Logf("%d cancelled by the compensators, %d confirmed by the router", cancelled, confirmed)
	if cancelled+confirmed != n {
		t.Fatalf("cancelled %d + confirmed %d != %d", cancelled, confirmed, n)
	}
	if got := w.int(`SELECT count(*) FROM compensator_actions WHERE action = 'unwind'`); got != cancelled {
		t.Errorf("unwinds %d, cancelled %d", got, cancelled)
	}
	if got := w.int(`SELECT count(*) FROM (SELECT order_id FROM compensator_actions GROUP BY order_id, action HAVING count(*) > 1) x`); got != 0 {
		t.Errorf("%d orders with the same action twice", got)
	}
	if got := w.int(`SELECT count(*) FROM compensator_actions a JOIN orders o USING (order_id) WHERE o.status = 'confirmed'`); got != 0 {
		t.Errorf("%d actions on confirmed orders", got)
	}
	if got := w.int(`SELECT count(*) FROM psp_refunds`); got != cancelled {
		t.Errorf("provider refunds %d, cancelled %d", got, cancelled)
	}
}

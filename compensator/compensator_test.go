package compensator_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"orderpipe/compensator"
	"orderpipe/shared/failpoint"
	"orderpipe/shared/idemtoken"
	"orderpipe/shared/metrics"
	"orderpipe/shared/order"
	"orderpipe/shared/orderstore"
	"orderpipe/shared/payments"
	"orderpipe/shared/psp"
	"orderpipe/shared/tooling/testenv"
)

func TestConfigRefusesWindowsThatDoNotFit(t *testing.T) {
	t.Parallel()
	good := compensator.Config{ConsumerHorizon: 2 * time.Minute}
	if _, err := good.Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	cases := []struct {
		name string
		cfg  compensator.Config
		want string
	}{
		{"deadline inside the consumers' horizon", compensator.Config{ConsumerHorizon: 50 * time.Minute}, "longer than the consumers' redelivery horizon"},
		{"one state's deadline too short", compensator.Config{StuckPaid: time.Minute, ConsumerHorizon: 2 * time.Minute, Interval: time.Second}, "stuck deadline of paid (1m0s)"},
		{"negative deadline", compensator.Config{StuckReserved: -time.Second}, "stuck deadline of reserved must be positive"},
		{"retention shorter than the duplicate window", compensator.Config{DedupeRetention: time.Hour}, "dedupe retention (1h0m0s) must be at least"},
		{"retention shorter than the open horizon", compensator.Config{StuckProcessing: 10 * time.Hour, Interval: time.Minute, DedupeRetention: 24 * time.Hour}, "longest an order stays open"},
		{"interval longer than a deadline", compensator.Config{Interval: time.Hour}, "interval (1h0m0s) must not be longer"},
		{"outbox age past the deadline", compensator.Config{OutboxMinAge: time.Hour}, "outbox minimum age"},
		{"too many attempts", compensator.Config{MaxAttempts: 1000}, "max attempts"},
		{"negative attempts", compensator.Config{MaxAttempts: -5}, "max attempts"},
		{"batch", compensator.Config{BatchSize: -1}, "batch size"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := c.cfg.Validate()
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error containing %q", err, c.want)
			}
			if !strings.Contains(err.Error(), "does not fit") {
				t.Fatalf("error does not say what is wrong: %v", err)
			}
		})
	}
	if _, err := (compensator.Config{MaxAttempts: compensator.NoRedrive}).Validate(); err != nil {
		t.Fatalf("NoRedrive: %v", err)
	}
}

func TestRedrivePublishesTheCurrentEventWithAFreshMsgID(t *testing.T) {
	t.Parallel()
	w, id := newWorldWithOrder(t, spec{status: order.StatusProcessing})
	ctx := t.Context()
	fresh := w.newOrder(spec{status: order.StatusProcessing}) // not past its deadline
	c := w.comp(w.cfg(3), w.psp)

	if res := w.pass(c); res.Redriven != 0 || len(res.Actions) != 0 {
		t.Fatalf("nothing is stuck yet, got %+v", res)
	}
	w.age(id)
	res := w.pass(c)
	if res.Redriven != 1 || res.Stuck[order.StatusProcessing] != 1 || len(res.Actions) != 1 || res.Actions[0].OrderID != id {
		t.Fatalf("first pass: %+v", res)
	}
	if a := res.Actions[0]; a.Kind != compensator.KindRedrive || a.Attempt != 1 || a.From != order.StatusProcessing {
		t.Fatalf("action: %+v", a)
	}
	// Re-driven: not stuck again until its deadline passes again.
	if res := w.pass(c); res.Redriven != 0 {
		t.Fatalf("second pass right after: %+v", res)
	}
	w.age(id)
	if res := w.pass(c); res.Redriven != 1 || res.Actions[0].Attempt != 2 {
		t.Fatalf("third pass: %+v", res)
	}
	want := []string{id.String() + ":accepted", id.String() + ":accepted:r1", id.String() + ":accepted:r2"}
	testenv.WaitFor(t, 5*time.Second, "re-drives in the stream", func() bool { return slices.Equal(w.msgIDs(id), want) })
	if got := w.int(`SELECT count(*) FROM compensator_actions WHERE order_id = $1 AND action = 'redrive'`, id); got != 2 {
		t.Fatalf("recorded re-drives: %d", got)
	}
	var actor, reason string
	if err := w.db.Pool.QueryRow(ctx, `SELECT actor, reason FROM compensator_actions WHERE order_id = $1 ORDER BY id DESC LIMIT 1`, id).Scan(&actor, &reason); err != nil {
		t.Fatal(err)
	}
	if actor != c.Config().Actor || !strings.Contains(reason, "re-drive 2 of 3") || !strings.Contains(reason, id.String()+":accepted:r2") {
		t.Fatalf("actor %q reason %q", actor, reason)
	}
	if w.status(id) != order.StatusProcessing || w.status(fresh) != order.StatusProcessing {
		t.Fatal("a re-drive moved an order")
	}
	w.wantPendingOutbox(0, "at the end")
}

func TestRedriveCountsPerStateAndEndsInAnUnwind(t *testing.T) {
	t.Parallel()
	w, id := newWorldWithOrder(t, spec{status: order.StatusProcessing})
	ctx := t.Context()
	c := w.comp(w.cfg(1), w.psp)
	w.age(id)
	if res := w.pass(c); res.Redriven != 1 {
		t.Fatalf("%+v", res)
	}
	// The order moves on: its re-drive count starts again in reserved.
	err := pgx.BeginFunc(ctx, w.db.Pool, func(tx pgx.Tx) error {
		_, err := orderstore.Transition(ctx, tx, id, order.StatusProcessing, order.StatusReserved, "")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	w.age(id)
	res := w.pass(c)
	if res.Redriven != 1 || res.Actions[0].Attempt != 1 || res.Actions[0].From != order.StatusReserved {
		t.Fatalf("reserved re-drive: %+v", res)
	}
	w.age(id)
	res = w.pass(c)
	if res.Unwound != 1 || res.Actions[0].Attempt != 1 {
		t.Fatalf("unwind: %+v", res)
	}
	if w.status(id) != order.StatusCancelled {
		t.Fatalf("status %s", w.status(id))
	}
	if r := w.str(`SELECT reason FROM orders WHERE order_id = $1`, id); !strings.Contains(r, "no progress in reserved after 1 re-drives") {
		t.Fatalf("reason %q", r)
	}
	testenv.WaitFor(t, 5*time.Second, "the cancelled event", func() bool {
		return slices.Contains(w.msgIDs(id), id.String()+":reserved:r1") && slices.Contains(w.msgIDs(id), id.String()+":cancelled")
	})
}

func TestUnwindReleasesStockAndRefundsOnce(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	paid := w.newOrder(spec{status: order.StatusPaid, lines: map[string]int{"SKU-1": 3, "SKU-2": 1}, payment: "succeeded"})
	reserved := w.newOrder(spec{status: order.StatusReserved, lines: map[string]int{"SKU-1": 2}})
	processing := w.newOrder(spec{status: order.StatusProcessing})
	if n := w.int(`SELECT available FROM inventory WHERE sku = 'SKU-1'`); n != 95 {
		t.Fatalf("available %d", n)
	}
	c := w.comp(w.cfg(compensator.NoRedrive), w.psp)
	w.age(paid, reserved, processing)
	res := w.pass(c)
	if res.Unwound != 3 || res.Refunded != 1 || res.Redriven != 0 {
		t.Fatalf("%+v", res)
	}
	for _, id := range []uuid.UUID{paid, reserved, processing} {
		if s := w.status(id); s != order.StatusCancelled {
			t.Fatalf("order %s is %s", id, s)
		}
	}
	if a, b := w.int(`SELECT available FROM inventory WHERE sku = 'SKU-1'`), w.int(`SELECT available FROM inventory WHERE sku = 'SKU-2'`); a != 100 || b != 100 {
		t.Fatalf("stock not given back: %d %d", a, b)
	}
	if n := w.int(`SELECT count(*) FROM reservations WHERE released_at IS NULL`); n != 0 {
		t.Fatalf("%d reservations still held", n)
	}
	check := func() {
		t.Helper()
		if n := w.int(`SELECT count(*) FROM psp_refunds`); n != 1 {
			t.Fatalf("provider refunds: %d", n)
		}
		if s := w.str(`SELECT status || ' ' || refund_key || ' ' || (refund_id IS NOT NULL) FROM payments WHERE order_id = $1`, paid); s != "refunded refund:"+paid.String()+" true" {
			t.Fatalf("payment: %s", s)
		}
		if n := w.int(`SELECT count(*) FROM compensator_actions WHERE action = 'unwind'`); n != 3 {
			t.Fatalf("unwinds recorded: %d", n)
		}
		if n := w.int(`SELECT count(*) FROM compensator_actions WHERE action = 'refund' AND order_id = $1`, paid); n != 1 {
			t.Fatalf("refunds recorded: %d", n)
		}
		if n := w.int(`SELECT count(*) FROM order_events WHERE status = 'cancelled'`); n != 3 {
			t.Fatalf("cancelled history rows: %d", n)
		}
	}
	check()
	// Again, and again after the orders look old: nothing more happens.
	w.age(paid, reserved, processing)
	if res := w.pass(c); len(res.Actions) != 0 {
		t.Fatalf("second pass acted: %+v", res.Actions)
	}
	check()
	testenv.WaitFor(t, 5*time.Second, "the cancelled event", func() bool {
		return slices.Contains(w.msgIDs(paid), paid.String()+":cancelled")
	})
}

// A compensator that dies after the provider refunded and before the
// refund was recorded: the next pass asks again with the same key and
// records the first refund; the provider refunds once.
func TestRefundCrashBetweenProviderAndRecord(t *testing.T) {
	t.Parallel()
	w, id := newWorldWithOrder(t, spec{status: order.StatusPaid, lines: map[string]int{"SKU-1": 1}, payment: "succeeded"})
	ctx := t.Context()
	w.age(id)
	// Unwound while no provider is reachable: the refund stays due, its
	// key recorded.
	if _, err := w.comp(w.cfg(compensator.NoRedrive), nil).RunOnce(ctx); err == nil {
		t.Fatal("want the refund reported as due")
	}
	if s := w.str(`SELECT status || ' ' || refund_key FROM payments WHERE order_id = $1`, id); s != "succeeded "+payments.RefundKey(id) {
		t.Fatalf("refund intent: %s", s)
	}
	// The crashed compensator's call: the provider refunded, nothing was
	// recorded.
	first, err := w.psp.Refund(ctx, payments.RefundKey(id), w.str(`SELECT charge_id FROM payments WHERE order_id = $1`, id))
	if err != nil {
		t.Fatal(err)
	}
	res := w.pass(w.comp(w.cfg(compensator.NoRedrive), w.psp))
	if res.Refunded != 1 || res.Unwound != 0 {
		t.Fatalf("second pass: %+v", res)
	}
	if n := w.int(`SELECT count(*) FROM psp_refunds`); n != 1 {
		t.Fatalf("provider refunds: %d", n)
	}
	if s := w.str(`SELECT status || ' ' || refund_id FROM payments WHERE order_id = $1`, id); s != "refunded "+first.ID {
		t.Fatalf("payment %s, want refunded %s", s, first.ID)
	}
	if res := w.pass(w.comp(w.cfg(compensator.NoRedrive), w.psp)); len(res.Actions) != 0 {
		t.Fatalf("third pass: %+v", res.Actions)
	}
	if n := w.int(`SELECT count(*) FROM compensator_actions WHERE action = 'refund'`); n != 1 {
		t.Fatalf("refund actions %d", n)
	}
}

// The provider is down when an order whose charge outcome is unknown is
// unwound: the order is cancelled at once, the refund stays due, and once
// the provider is back the key is voided, never charged.
func TestProviderDownDuringUnwind(t *testing.T) {
	t.Parallel()
	w, id := newWorldWithOrder(t, spec{status: order.StatusReserved, lines: map[string]int{"SKU-1": 1}, payment: "pending"})
	down := psp.NewClient("http://127.0.0.1:1", time.Second)
	w.age(id)
	res, err := w.comp(w.cfg(compensator.NoRedrive), down).RunOnce(t.Context())
	if err == nil || !psp.IsTransient(err) || res.Unwound != 1 {
		t.Fatalf("pass with the provider down: %+v %v", res, err)
	}
	if w.status(id) != order.StatusCancelled || w.int(`SELECT available FROM inventory WHERE sku = 'SKU-1'`) != 100 {
		t.Fatal("not unwound")
	}
	if s := w.str(`SELECT status || ' ' || refund_key FROM payments WHERE order_id = $1`, id); s != "pending refund:"+id.String() {
		t.Fatalf("refund intent: %s", s)
	}
	// No provider at all: the refund stays due and the pass says so.
	if _, err := w.comp(w.cfg(compensator.NoRedrive), nil).RunOnce(t.Context()); err == nil || !strings.Contains(err.Error(), "no payment provider") {
		t.Fatalf("without provider: %v", err)
	}
	// The provider is back. It never saw the key, so the key is voided:
	// nothing is charged to learn the outcome, and nothing is refunded.
	res = w.pass(w.comp(w.cfg(compensator.NoRedrive), w.psp))
	if res.Refunded != 0 {
		t.Fatalf("%+v", res)
	}
	w.checkVoided(id)
	if _, err := w.psp.Charge(t.Context(), payments.ChargeKey(id), "1.00", "CNY", id.String()); !psp.IsVoided(err) {
		t.Fatalf("a late charge of the voided key: %v, want 410", err)
	}
	if res := w.pass(w.comp(w.cfg(compensator.NoRedrive), w.psp)); len(res.Actions) != 0 {
		t.Fatalf("a later pass acted again: %+v", res.Actions)
	}
}

// The compensator dies in the middle of a pass (after the first batch
// committed, inside the second) and runs again: every order is acted on
// exactly once.
func TestKilledMidPassThenRunAgain(t *testing.T) {
	w := newWorld(t)
	ids := w.newOrders(7, spec{status: order.StatusProcessing})
	w.age(ids...)
	cfg := w.cfg(3)
	cfg.BatchSize = 3
	c := w.comp(cfg, w.psp)
	disable := failpoint.Enable(compensator.FailMidPass, 5) // second order of the second batch
	res, err := c.RunOnce(t.Context())
	disable()
	if !errors.Is(err, failpoint.ErrInjected) {
		t.Fatalf("pass: %v", err)
	}
	if res.Redriven != 3 {
		t.Fatalf("first batch: %+v", res)
	}
	if n := w.int(`SELECT count(*) FROM compensator_actions`); n != 3 {
		t.Fatalf("actions after the crash: %d", n)
	}
	// And one that dies after its batch committed, before publishing.
	disable = failpoint.Enable(compensator.FailAfterBatch, 1)
	res, err = c.RunOnce(t.Context())
	disable()
	if !errors.Is(err, failpoint.ErrInjected) || res.Redriven != 3 {
		t.Fatalf("second pass: %+v %v", res, err)
	}
	w.wantPendingOutbox(3, "after the second crash")
	res = w.pass(c)
	if res.Redriven != 1 || res.Republished != 3 {
		t.Fatalf("third pass: %+v", res)
	}
	for _, id := range ids {
		if n := w.int(`SELECT count(*) FROM compensator_actions WHERE order_id = $1`, id); n != 1 {
			t.Fatalf("order %s acted on %d times", id, n)
		}
		if n := w.int(`SELECT redrive_attempts FROM orders WHERE order_id = $1`, id); n != 1 {
			t.Fatalf("order %s attempts %d", id, n)
		}
	}
	w.wantPendingOutbox(0, "after the run again")
	testenv.WaitFor(t, 5*time.Second, "every re-drive in the stream", func() bool {
		for _, id := range ids {
			if !slices.Contains(w.msgIDs(id), id.String()+":accepted:r1") {
				return false
			}
		}
		return true
	})
}

func TestDryRunChangesNothing(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := t.Context()
	redrive := w.newOrder(spec{status: order.StatusProcessing})
	unwind := w.newOrder(spec{status: order.StatusPaid, lines: map[string]int{"SKU-1": 2}, payment: "succeeded"})
	w.newOrder(spec{status: order.StatusReserved}) // not stuck
	w.age(redrive, unwind)
	w.exec(`UPDATE orders SET redrive_attempts = 3, redrive_status = 'paid' WHERE order_id = $1`, unwind)
	// A cancelled order with a charge left to refund, an outbox row left
	// pending, and an expired dedupe row.
	due := w.newOrder(spec{status: order.StatusPaid, payment: "succeeded"})
	err := pgx.BeginFunc(ctx, w.db.Pool, func(tx pgx.Tx) error {
		_, err := orderstore.Transition(ctx, tx, due, order.StatusPaid, order.StatusCancelled, "test")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	w.exec(`INSERT INTO processed_messages (consumer, message_id, processed_at) VALUES ('x', 'old', now() - interval '30 days'), ('x', 'new', now())`)

	before := dump(t, w.db.Pool)
	msgs := streamMsgs(t, w.nats.JS, w.nats.Topology.Stream)
	cfg := w.cfg(3)
	cfg.DryRun = true
	c := w.comp(cfg, w.psp)
	var printed []string
	c.OnAction = func(a compensator.Action) { printed = append(printed, a.String()) }
	res := w.pass(c)
	if !res.DryRun || res.Redriven != 1 || res.Unwound != 1 || res.Refunded != 1 || res.Republished != 1 || res.Swept != 1 {
		t.Fatalf("dry run: %+v", res)
	}
	if len(printed) != 3 || !strings.HasPrefix(printed[0], "would-") || !strings.Contains(res.Summary(), "nothing changed") {
		t.Fatalf("printed %q, summary %q", printed, res.Summary())
	}
	if !strings.Contains(printed[1], "would refund charge") || !strings.Contains(printed[1], "would release 1 reservation") {
		t.Fatalf("unwind line %q", printed[1])
	}
	after := dump(t, w.db.Pool)
	for tb, d := range before {
		if after[tb] != d {
			t.Errorf("table %s changed: %s → %s", tb, d, after[tb])
		}
	}
	if len(before) < 10 || len(after) != len(before) {
		t.Fatalf("tables: %d before, %d after", len(before), len(after))
	}
	if got := streamMsgs(t, w.nats.JS, w.nats.Topology.Stream); got != msgs {
		t.Fatalf("stream messages %d → %d", msgs, got)
	}
}

// Two compensators and a consumer racing on the same orders: every order
// ends either confirmed by the consumer (and untouched by the
// compensators) or cancelled once, with its charge refunded once.
func TestTwoCompensatorsAndARacingConsumer(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := t.Context()
	const n = 24
	ids, a, b := w.stuckPaid(n, 4)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for _, c := range []*compensator.Compensator{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 3 {
				if _, err := c.RunOnce(ctx); err != nil {
					errs <- err
				}
			}
		}()
	}
	// The consumer confirms every other order, as fast as it can.
	confirmed := map[uuid.UUID]bool{}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < n; i += 2 {
			var moved orderstore.Moved
			err := pgx.BeginFunc(ctx, w.db.Pool, func(tx pgx.Tx) error {
				var err error
				moved, err = orderstore.Transition(ctx, tx, ids[i], order.StatusPaid, order.StatusConfirmed, "")
				return err
			})
			if err != nil {
				errs <- err
				continue
			}
			if moved.OK {
				confirmed[ids[i]] = true
			}
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("racer: %v", err)
	}
	refunds := 0
	for _, id := range ids {
		unwinds := w.int(`SELECT count(*) FROM compensator_actions WHERE order_id = $1 AND action = 'unwind'`, id)
		refunded := w.int(`SELECT count(*) FROM compensator_actions WHERE order_id = $1 AND action = 'refund'`, id)
		pay := w.str(`SELECT status FROM payments WHERE order_id = $1`, id)
		switch s := w.status(id); {
		case s == order.StatusConfirmed && confirmed[id]:
			if unwinds != 0 || refunded != 0 || pay != "succeeded" {
				t.Errorf("confirmed order %s: unwinds %d refunds %d payment %s", id, unwinds, refunded, pay)
			}
		case s == order.StatusCancelled && !confirmed[id]:
			refunds++
			if unwinds != 1 || refunded != 1 || pay != "refunded" {
				t.Errorf("cancelled order %s: unwinds %d refunds %d payment %s", id, unwinds, refunded, pay)
			}
		default:
			t.Errorf("order %s is %s (confirmed by the consumer: %v)", id, s, confirmed[id])
		}
	}
	if got := w.int(`SELECT count(*) FROM psp_refunds`); got != refunds {
		t.Errorf("provider refunds %d, cancelled orders %d", got, refunds)
	}
	if got := w.int(`SELECT count(*) FROM order_events WHERE status = 'cancelled'`); got != refunds {
		t.Errorf("cancelled history rows %d, want %d", got, refunds)
	}
	if got := w.int(`SELECT count(*) FROM compensator_actions WHERE action = 'unwind'`); got+len(confirmed) != n {
		t.Errorf("unwinds %d + confirmed %d != %d", got, len(confirmed), n)
	}
	if avail := w.int(`SELECT available FROM inventory WHERE sku = 'SKU-1'`); avail != 100-len(confirmed) {
		t.Errorf("available %d, want %d", avail, 100-len(confirmed))
	}
}

func TestTwoCompensatorsRedriveOncePerDeadline(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := t.Context()
	ids := w.newOrders(20, spec{status: order.StatusReserved})
	w.age(ids...)
	cfg := w.cfg(3)
	cfg.BatchSize = 3
	var wg sync.WaitGroup
	for range 3 {
		c := w.comp(cfg, w.psp)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := c.RunOnce(ctx); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	for _, id := range ids {
		if n := w.int(`SELECT count(*) FROM compensator_actions WHERE order_id = $1`, id); n != 1 {
			t.Errorf("order %s re-driven %d times", id, n)
		}
	}
}

func TestDaemonPassesAtOnceAndStops(t *testing.T) {
	t.Parallel()
	w, id := newWorldWithOrder(t, spec{status: order.StatusPaid})
	w.age(id)
	c := w.comp(w.cfg(3), w.psp)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	testenv.WaitFor(t, 10*time.Second, "the first pass", func() bool {
		return w.int(`SELECT count(*) FROM compensator_actions WHERE order_id = $1`, id) == 1
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// A pass sweeps idempotency tokens that expired unused longer than the
// retention ago, keeps younger expired ones (they still answer
// "expired"), and sets the token gauge per state.
func TestPassSweepsExpiredTokens(t *testing.T) {
	w := newWorld(t)
	ctx := t.Context()
	for _, ttl := range []time.Duration{time.Hour, time.Second} {
		if _, err := idemtoken.Issue(ctx, w.db.Pool, w.client, ttl); err != nil {
			t.Fatal(err)
		}
	}
	old, err := idemtoken.Issue(ctx, w.db.Pool, w.client, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	w.exec(`UPDATE idempotency_tokens SET expires_at = now() - interval '2 hours' WHERE token = $1`, old.Token)
	w.exec(`UPDATE idempotency_tokens SET expires_at = now() - interval '1 minute' WHERE token <> $1 AND expires_at < now() + interval '1 minute'`, old.Token)
	cfg := w.cfg(3)
	cfg.TokenRetention = time.Hour
	res := w.pass(w.comp(cfg, w.psp))
	if res.TokensSwept != 1 || !strings.Contains(res.Summary(), "expired tokens swept 1") {
		t.Fatalf("swept %d tokens: %s", res.TokensSwept, res.Summary())
	}
	if n := w.int(`SELECT count(*) FROM idempotency_tokens WHERE token = $1`, old.Token); n != 0 {
		t.Fatal("the token expired past the retention is still there")
	}
	if got := value(t, metrics.Tokens.WithLabelValues("expired")); got != 1 {
		t.Fatalf("expired gauge %v, want 1", got)
	}
	if got := value(t, metrics.Tokens.WithLabelValues("unused")); got != 1 {
		t.Fatalf("unused gauge %v, want 1", got)
	}
}

// A pass prunes published outbox rows of finished orders past the outbox
// retention; it keeps pending rows, young rows and every row of an open
// order (heal reads them).
func TestPassPrunesPublishedOutboxRows(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	done := w.newOrder(spec{status: order.StatusCancelled})
	open := w.newOrder(spec{status: order.StatusReserved})
	// Ids follow the rows' creation: the orders' own events, the first
	// rows, were created before the ones below (and published recently).
	w.exec(`UPDATE outbox SET created_at = now() - interval '5 days'`)
	w.exec(`INSERT INTO outbox (msg_id, event, payload, headers, order_id, published_at, created_at) VALUES
		('done-old', 'confirmed', '{}', '{}', $1, now() - interval '4 days', now() - interval '4 days'),
		('done-young', 'confirmed', '{}', '{}', $1, now() - interval '1 hour', now() - interval '1 hour'),
		('open-old', 'reserved', '{}', '{}', $2, now() - interval '4 days', now() - interval '4 days')`, done, open)
	before := w.int(`SELECT count(*) FROM outbox`)
	res := w.pass(w.comp(w.cfg(3), w.psp))
	if res.OutboxPruned < 1 || w.int(`SELECT count(*) FROM outbox WHERE msg_id = 'done-old'`) != 0 {
		t.Fatalf("pruned %d: %s", res.OutboxPruned, res.Summary())
	}
	for _, kept := range []string{"done-young", "open-old"} {
		if w.int(`SELECT count(*) FROM outbox WHERE msg_id = $1`, kept) != 1 {
			t.Errorf("%s was pruned", kept)
		}
	}
	if after := w.int(`SELECT count(*) FROM outbox`); after != before-int(res.OutboxPruned) {
		t.Fatalf("outbox rows %d → %d, pruned %d", before, after, res.OutboxPruned)
	}
}

// The prune reads the outbox's rows past the retention, not the whole
// table: the outbox keeps --outbox-retention (72h) of every published
// event, and the compensator prunes at every pass. When nothing is old
// enough, the prune's scan in id order found no row to stop at and read
// every row.
func TestPruneReadsOnlyRowsPastTheRetention(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	done := w.newOrder(spec{status: order.StatusCancelled})
	open := w.newOrder(spec{status: order.StatusReserved})
	w.exec(`UPDATE outbox SET created_at = now() - interval '5 days'`) // as above
	w.exec(`INSERT INTO outbox (msg_id, event, payload, headers, order_id, published_at, created_at) VALUES
		('done-old', 'confirmed', '{}', '{}', $1, now() - interval '4 days', now() - interval '4 days'),
		('open-old', 'reserved', '{}', '{}', $2, now() - interval '4 days', now() - interval '4 days')`, done, open)
	const young = 20000
	w.exec(`INSERT INTO outbox (msg_id, event, payload, order_id, published_at, created_at)
		SELECT 'young-' || g, 'order.confirmed', '{}', $1, now() - interval '1 hour', now() - interval '1 hour' FROM generate_series(1, $2) g`, done, young)
	one := testenv.OneConnection(t, w.db)
	c, err := compensator.New(w.cfg(3), one, w.relay, w.psp, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	if res := w.pass(c); res.OutboxPruned != 1 {
		t.Fatalf("pruned %d rows, want done-old only: %s", res.OutboxPruned, res.Summary())
	}
	// One update through the pass's connection, by key, marks its
	// counters in.
	marker := w.int(`SELECT id FROM outbox WHERE msg_id = 'open-old'`)
	if _, err := one.Exec(t.Context(), `UPDATE outbox SET claimed_until = NULL WHERE id = $1`, marker); err != nil {
		t.Fatal(err)
	}
	if r := testenv.TableReads(t, w.db, one, "outbox", 1); r.FullScan+r.ByIndex >= young {
		t.Errorf("a pass read %d outbox rows (%d in full scans) to prune 1 of %d; want the young rows left unread", r.FullScan+r.ByIndex, r.FullScan, young+2)
	}
}

// A pass reads no used idempotency token, and a used token lives as long
// as its order: settling the tokens whose holder died looks up the
// processing ones through their index (migration 00015), the sweep the
// expired unused ones through theirs, and the gauge counts only the tokens
// not used yet, through the same two indexes. The settle's two statements
// read the whole table until migration 00015, the gauge until the used
// tokens left it for a counter.
func TestPassReadsNoUsedToken(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	const grown = 20000
	testenv.GrowOrders(t, w.db.Pool, w.client, grown)
	w.exec(`INSERT INTO idempotency_tokens (token, client_id, state, expires_at, used_at, order_id)
		SELECT 'opt1.' || substr(md5(order_id::text) || md5(order_id::text), 1, 48), client_id, 'used', now() + interval '1 day', now(), order_id
		FROM orders WHERE starts_with(request_id, 'grown-')`)
	one := testenv.OneConnection(t, w.db)
	c, err := compensator.New(w.cfg(3), one, w.relay, w.psp, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	w.pass(c)
	// One update through the pass's connection, by key, marks its
	// counters in.
	marker := w.str(`SELECT token FROM idempotency_tokens LIMIT 1`)
	if _, err := one.Exec(t.Context(), `UPDATE idempotency_tokens SET used_at = used_at WHERE token = $1`, marker); err != nil {
		t.Fatal(err)
	}
	if r := testenv.TableReads(t, w.db, one, "idempotency_tokens", 1); r.FullScan+r.ByIndex > 100 {
		t.Errorf("a pass read %d token rows (%d in full scans) of %d used ones; want none of them", r.FullScan+r.ByIndex, r.FullScan, grown)
	}
}

// A pass settles tokens whose holder died: used with the order that
// committed, unused again once SettleGrace past the lease without one; a
// token still under its lease is left to its holder.
func TestPassSettlesTokensOfDeadHolders(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := t.Context()
	var toks []string
	for range 3 {
		tok, err := idemtoken.Issue(ctx, w.db.Pool, w.client, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		toks = append(toks, tok.Token)
	}
	committed, lost, held := toks[0], toks[1], toks[2]
	id := w.newOrder(spec{status: order.StatusCancelled})
	w.exec(`UPDATE orders SET request_id = $1, client_id = $2 WHERE order_id = $3`, committed, w.client, id)
	w.exec(`UPDATE idempotency_tokens SET state = 'processing', claimed_until = now() - interval '2 minutes' WHERE token IN ($1, $2)`, committed, lost)
	w.exec(`UPDATE idempotency_tokens SET state = 'processing', claimed_until = now() + interval '1 minute' WHERE token = $1`, held)
	res := w.pass(w.comp(w.cfg(3), w.psp))
	if res.TokensSettled != 2 {
		t.Fatalf("settled %d: %s", res.TokensSettled, res.Summary())
	}
	if got := w.str(`SELECT state || ' ' || coalesce(order_id::text, '-') FROM idempotency_tokens WHERE token = $1`, committed); got != "used "+id.String() {
		t.Errorf("the token whose order committed: %s", got)
	}
	if got := w.str(`SELECT state FROM idempotency_tokens WHERE token = $1`, lost); got != "unused" {
		t.Errorf("the token whose holder wrote nothing: %s", got)
	}
	if got := w.str(`SELECT state FROM idempotency_tokens WHERE token = $1`, held); got != "processing" {
		t.Errorf("the token under its lease: %s", got)
	}
}

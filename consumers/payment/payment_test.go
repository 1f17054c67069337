package payment_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"orderpipe/consumers/confirm"
	"orderpipe/consumers/inventory"
	"orderpipe/consumers/payment"
	"orderpipe/consumers/pipetest"
	"orderpipe/shared/order"
	"orderpipe/shared/orderstore"
	"orderpipe/shared/payments"
	"orderpipe/shared/psp"
	"orderpipe/shared/stock"
	"orderpipe/shared/tooling/pspserver"
	"orderpipe/shared/tooling/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func count(t *testing.T, e *pipetest.Env, q string, args ...any) int {
	t.Helper()
	var n int
	if err := e.DB.Pool.QueryRow(t.Context(), q, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// unwind does what the compensator does to an order it gives up on:
// cancelled, stock released, in one transaction; then the refund.
func unwind(t *testing.T, e *pipetest.Env, id uuid.UUID, from order.Status) {
	t.Helper()
	ctx := t.Context()
	err := pgx.BeginFunc(ctx, e.DB.Pool, func(tx pgx.Tx) error {
		moved, err := orderstore.Transition(ctx, tx, id, from, order.StatusCancelled, "test: unwound")
		if err != nil {
			return err
		}
		if !moved.OK {
			t.Fatalf("unwind: order is %s, not %s", moved.Current, from)
		}
		_, err = stock.Release(ctx, tx, id)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

func setup(t *testing.T, opts pspserver.Options) (*pipetest.Env, *psp.Client) {
	e := pipetest.New(t, opts)
	e.Stock(t, "SKU-1", 100)
	return e, psp.NewClient(e.PSPURL, 5*time.Second)
}

// TestRefundExactlyOnce: a paid order (no confirm step running) is
// unwound; Refund, called again and again, refunds it once.
func TestRefundExactlyOnce(t *testing.T) {
	t.Parallel()
	e, client := setup(t, pspserver.Options{})
	pipetest.Start(t, e.App, pipetest.Config(), inventory.Step(), payment.Step(e.DB.Pool, client))
	id := e.CreateOrder(t, "12.00", pipetest.Line{SKU: "SKU-1", Qty: 1})
	testenv.WaitFor(t, 20*time.Second, "the order paid", func() bool { return e.Status(t, id) == order.StatusPaid })
	unwind(t, e, id, order.StatusPaid)
	var first payments.Settled
	for i := range 3 {
		r, err := payments.Settle(t.Context(), e.DB.Pool, client, id)
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = r
		}
		if r.RefundID == "" || r != first {
			t.Fatalf("refund %d = %+v, want %+v", i, r, first)
		}
	}
	if n := count(t, e, `SELECT count(*) FROM psp_refunds`); n != 1 {
		t.Fatalf("%d refunds at the provider, want 1", n)
	}
	if n := count(t, e, `SELECT count(*) FROM payments WHERE order_id = $1 AND status = 'refunded'`, id); n != 1 {
		t.Fatal("payment not recorded as refunded")
	}
	e.CheckInvariants(t)
}

// TestSettlePendingPayment: the step recorded a pending payment and died
// (the provider may or may not have charged). Settle never charges to learn
// the outcome: it voids the key. A key the provider never saw is voided and
// dead (nothing is charged, now or later); a key it did charge comes back
// with its charge, which is refunded.
func TestSettlePendingPayment(t *testing.T) {
	t.Parallel()
	e, client := setup(t, pspserver.Options{})
	pending := func(id uuid.UUID) {
		t.Helper()
		if err := payments.RecordPending(t.Context(), e.DB.Pool, id, "3.00", "CNY"); err != nil {
			t.Fatal(err)
		}
	}
	if r, err := payments.Settle(t.Context(), e.DB.Pool, client, uuid.New()); err != nil || r != (payments.Settled{}) {
		t.Fatalf("settle of an order without payment: %+v, %v", r, err)
	}

	never, _ := e.InsertOrder(t, "3.00", pipetest.Line{SKU: "SKU-1", Qty: 1})
	pending(never)
	unwind(t, e, never, order.StatusProcessing)
	for range 2 {
		r, err := payments.Settle(t.Context(), e.DB.Pool, client, never)
		if err != nil || !r.Voided || r.ChargeID != "" || r.RefundID != "" {
			t.Fatalf("settle of a key never charged = %+v, %v; want voided", r, err)
		}
	}
	if n := count(t, e, `SELECT count(*) FROM psp_charges WHERE reference = $1 AND state <> 'voided'`, never.String()); n != 0 {
		t.Fatalf("%d charges made to settle an order never charged, want 0", n)
	}
	if _, err := client.Charge(t.Context(), payments.ChargeKey(never), "3.00", "CNY", never.String()); !psp.IsVoided(err) {
		t.Fatalf("a late charge of the voided key: %v, want 410", err)
	}

	charged, _ := e.InsertOrder(t, "3.00", pipetest.Line{SKU: "SKU-1", Qty: 1})
	pending(charged)
	if _, err := client.Charge(t.Context(), payments.ChargeKey(charged), "3.00", "CNY", charged.String()); err != nil {
		t.Fatal(err)
	}
	unwind(t, e, charged, order.StatusProcessing)
	r, err := payments.Settle(t.Context(), e.DB.Pool, client, charged)
	if err != nil || r.Voided || r.ChargeID == "" || r.RefundID == "" {
		t.Fatalf("settle of a charged key = %+v, %v; want refunded", r, err)
	}
	if n := count(t, e, `SELECT count(*) FROM psp_charges WHERE reference = $1`, charged.String()); n != 1 {
		t.Fatalf("%d charges, want the one", n)
	}
	e.CheckInvariants(t)
}

// TestPermanentRefusalCancels: a provider that refuses the charge for good
// (a 4xx other than 402 and 409: here the key was already used with another
// body) is no dead end: the order ends cancelled with the provider's
// reason, its stock released, its key settled, and nothing stays charged.
func TestPermanentRefusalCancels(t *testing.T) {
	t.Parallel()
	e, client := setup(t, pspserver.Options{})
	id := e.CreateOrder(t, "7.00", pipetest.Line{SKU: "SKU-1", Qty: 3})
	// Someone charged the order's key with another body: the step's own
	// charge is refused with 422.
	if _, err := client.Charge(t.Context(), payments.ChargeKey(id), "1.00", "CNY", id.String()); err != nil {
		t.Fatal(err)
	}
	voided := e.CreateOrder(t, "7.00", pipetest.Line{SKU: "SKU-1", Qty: 2})
	// And a key voided before the step ran: the charge gets 410.
	if _, err := client.Void(t.Context(), payments.ChargeKey(voided), voided.String()); err != nil {
		t.Fatal(err)
	}
	pipetest.Start(t, e.App, pipetest.Config(), e.Steps(5*time.Second)...)
	e.WaitTerminal(t, 30*time.Second)
	for _, o := range []struct {
		id   uuid.UUID
		want string
	}{{id, "payment refused by the provider: this Idempotency-Key was used with another request body (422)"},
		{voided, "payment refused by the provider: the charge was voided"}} {
		var status, reason string
		if err := e.DB.Pool.QueryRow(t.Context(), `SELECT status, reason FROM orders WHERE order_id = $1`, o.id).Scan(&status, &reason); err != nil {
			t.Fatal(err)
		}
		if status != "cancelled" || reason != o.want {
			t.Errorf("order %s (%q), want cancelled with %q", status, reason, o.want)
		}
	}
	// The charge the refused key did make is given back after the commit
	// that cancelled the order.
	testenv.WaitFor(t, 30*time.Second, "no payment holding money", func() bool {
		return count(t, e, `SELECT count(*) FROM payments WHERE status IN ('pending', 'succeeded')`) == 0
	})
	if n := count(t, e, `SELECT count(*) FROM dead_letters`); n != 0 {
		t.Fatalf("%d dead letters: a refusal must end the order, not park its message", n)
	}
	e.CheckInvariants(t)
}

// TestOrderCancelledWhileCharging: the compensator cancels the order while
// the provider is still charging it; the step finds the order moved, and
// refunds its own charge instead of moving it to paid.
func TestOrderCancelledWhileCharging(t *testing.T) {
	t.Parallel()
	e, client := setup(t, pspserver.Options{Latency: 700 * time.Millisecond})
	pipetest.Start(t, e.App, pipetest.Config(), inventory.Step(), payment.Step(e.DB.Pool, client), confirm.Step())
	id := e.CreateOrder(t, "7.00", pipetest.Line{SKU: "SKU-1", Qty: 2})
	testenv.WaitFor(t, 20*time.Second, "the charge in flight", func() bool {
		return count(t, e, `SELECT count(*) FROM psp_charges WHERE reference = $1 AND state = 'in_flight'`, id.String()) == 1
	})
	unwind(t, e, id, order.StatusReserved)
	testenv.WaitFor(t, 20*time.Second, "the charge refunded", func() bool {
		return count(t, e, `SELECT count(*) FROM payments WHERE order_id = $1 AND status = 'refunded'`, id) == 1
	})
	if s := e.Status(t, id); s != order.StatusCancelled {
		t.Fatalf("order: %s, want cancelled", s)
	}
	e.CheckInvariants(t)
}

// TestDeclineReleasesStock: a declined payment cancels the order with the
// reason and gives its stock back in the same transaction.
func TestDeclineReleasesStock(t *testing.T) {
	t.Parallel()
	e, _ := setup(t, pspserver.Options{DeclineRate: 1})
	pipetest.Start(t, e.App, pipetest.Config(), e.Steps(5*time.Second)...)
	id := e.CreateOrder(t, "7.00", pipetest.Line{SKU: "SKU-1", Qty: 30})
	e.WaitTerminal(t, 20*time.Second)
	var status, reason string
	if err := e.DB.Pool.QueryRow(t.Context(), `SELECT status, reason FROM orders WHERE order_id = $1`, id).Scan(&status, &reason); err != nil {
		t.Fatal(err)
	}
	if status != "cancelled" || reason != "payment declined: card declined" {
		t.Fatalf("order %s (%q), want cancelled with the decline reason", status, reason)
	}
	if n := count(t, e, `SELECT available FROM inventory WHERE sku = 'SKU-1'`); n != 100 {
		t.Fatalf("stock %d after a decline, want 100", n)
	}
	e.CheckInvariants(t)
}

// TestPendingMany: the payment step's batched read records the pending
// payment of each order in the chargeable status, once, and of no other;
// it reads every order named, once, and leaves out an order that does not
// exist.
func TestPendingMany(t *testing.T) {
	t.Parallel()
	e, _ := setup(t, pspserver.Options{})
	ctx := t.Context()
	reserved := func(amount string) uuid.UUID {
		t.Helper()
		id, _ := e.InsertOrder(t, amount, pipetest.Line{SKU: "SKU-1", Qty: 1})
		err := pgx.BeginFunc(ctx, e.DB.Pool, func(tx pgx.Tx) error {
			_, err := orderstore.Transition(ctx, tx, id, order.StatusProcessing, order.StatusReserved, "")
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	a, b := reserved("4.50"), reserved("7.00")
	processing, _ := e.InsertOrder(t, "9.00", pipetest.Line{SKU: "SKU-1", Qty: 1})
	missing := uuid.New()
	// b has its pending row already, under other figures: it stays as it is.
	if err := payments.RecordPending(ctx, e.DB.Pool, b, "1.00", "EUR"); err != nil {
		t.Fatal(err)
	}
	for range 2 { // twice: the second run finds every row there
		due, err := payments.PendingMany(ctx, e.DB.Pool, []uuid.UUID{b, missing, a, processing, a}, string(order.StatusReserved))
		if err != nil {
			t.Fatal(err)
		}
		want := map[uuid.UUID]payments.Due{
			a:          {Status: "reserved", Amount: "4.50", Currency: "CNY"},
			b:          {Status: "reserved", Amount: "7.00", Currency: "CNY"},
			processing: {Status: "processing", Amount: "9.00", Currency: "CNY"},
		}
		if len(due) != len(want) {
			t.Fatalf("PendingMany = %+v, want %+v", due, want)
		}
		for id, w := range want {
			if due[id] != w {
				t.Fatalf("PendingMany[%s] = %+v, want %+v", id, due[id], w)
			}
		}
	}
	for id, w := range map[uuid.UUID]string{a: "4.50 CNY pending", b: "1.00 EUR pending", processing: ""} {
		var got string
		err := e.DB.Pool.QueryRow(ctx, `SELECT amount::text || ' ' || currency || ' ' || status FROM payments WHERE order_id = $1 AND idempotency_key = $2`,
			id, payments.ChargeKey(id)).Scan(&got)
		if errors.Is(err, pgx.ErrNoRows) {
			err = nil
		}
		if err != nil || got != w {
			t.Fatalf("payment of %s = %q, %v; want %q", id, got, err, w)
		}
	}
	if _, err := payments.PendingMany(ctx, e.DB.Pool, nil, string(order.StatusReserved)); err != nil {
		t.Fatalf("PendingMany of no orders: %v", err)
	}
}

// TestPendingManyWaitsForACancelInFlight: the compensator's unwind moves a
// reserved order to cancelled while the payment step's read runs. The read
// must see the cancel (and record no pending payment, so no charge goes
// out), not the reserved order of its snapshot: the unwind had found no
// payment to void, and the step charged an order already cancelled, then
// refunded it.
func TestPendingManyWaitsForACancelInFlight(t *testing.T) {
	t.Parallel()
	e, _ := setup(t, pspserver.Options{})
	ctx := t.Context()
	id, _ := e.InsertOrder(t, "4.50", pipetest.Line{SKU: "SKU-1", Qty: 1})
	if err := pgx.BeginFunc(ctx, e.DB.Pool, func(tx pgx.Tx) error {
		_, err := orderstore.Transition(ctx, tx, id, order.StatusProcessing, order.StatusReserved, "")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	cancel, err := e.DB.Pool.Begin(ctx) // the unwind, not committed yet
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cancel.Rollback(context.WithoutCancel(ctx)) }()
	if moved, err := orderstore.Transition(ctx, cancel, id, order.StatusReserved, order.StatusCancelled, "test: unwound"); err != nil || !moved.OK {
		t.Fatalf("cancel: %+v, %v", moved, err)
	}
	type result struct {
		due map[uuid.UUID]payments.Due
		err error
	}
	done := make(chan result, 1)
	go func() {
		due, err := payments.PendingMany(ctx, e.DB.Pool, []uuid.UUID{id}, string(order.StatusReserved))
		done <- result{due, err}
	}()
	var r result
	answered := false
	testenv.WaitFor(t, 10*time.Second, "the read answered or waiting for the cancel's lock", func() bool {
		select {
		case r = <-done:
			answered = true
			return true
		default:
		}
		return count(t, e, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`) > 0
	})
	if err := cancel.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if !answered {
		r = <-done
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	if got := r.due[id].Status; got != string(order.StatusCancelled) {
		t.Errorf("the read saw the order %s, want cancelled: the step would charge a cancelled order", got)
	}
	if n := count(t, e, `SELECT count(*) FROM payments WHERE order_id = $1`, id); n != 0 {
		t.Errorf("%d payments recorded for an order cancelled meanwhile, want none", n)
	}
}

// TestPendingManyReadsOrdersThroughTheKeyAsTheTableGrows: the payment
// step's batched read finds each order through its key however much the
// table grew since the read first ran. Its join of unnest with orders,
// cached while the table was nearly empty, scanned orders whole at every
// run as it grew.
func TestPendingManyReadsOrdersThroughTheKeyAsTheTableGrows(t *testing.T) {
	t.Parallel()
	e, _ := setup(t, pspserver.Options{})
	ctx := t.Context()
	one := testenv.OneConnection(t, e.DB)
	const before, after = 10, 5
	ids := make([]uuid.UUID, before+after)
	for i := range ids {
		ids[i], _ = e.InsertOrder(t, "4.50", pipetest.Line{SKU: "SKU-1", Qty: 1})
	}
	read := func(id uuid.UUID) {
		t.Helper()
		due, err := payments.PendingMany(ctx, one, []uuid.UUID{id, uuid.New()}, string(order.StatusReserved))
		if want := (payments.Due{Status: "processing", Amount: "4.50", Currency: "CNY"}); err != nil || len(due) != 1 || due[id] != want {
			t.Fatalf("PendingMany of order %s = %+v, %v; want exactly %+v", id, due, err, want)
		}
	}
	for _, id := range ids[:before] {
		read(id) // past the runs after which a plan may be cached
	}
	const grown = 20000
	testenv.GrowOrders(t, e.DB.Pool, e.ClientID, grown)
	for _, id := range ids[before:] {
		read(id)
	}
	if _, err := one.Exec(ctx, `UPDATE orders SET updated_at = updated_at WHERE order_id = $1`, ids[0]); err != nil {
		t.Fatal(err)
	}
	if r := testenv.TableReads(t, e.DB, one, "orders", 1); r.FullScan >= grown {
		t.Errorf("%d batched reads read %d order rows in full scans, of %d; want each order found through its key", before+after, r.FullScan, grown+len(ids))
	}
}

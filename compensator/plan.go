package compensator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"orderpipe/shared/payments"
)

// phaseBroker is the name of the phase that checks the broker.
const phaseBroker = "broker"

// phase is one named step of a pass (its name is the label of
// orderpipe_compensator_pass_failures_total).
type phase struct {
	name string
	// needsBroker: skipped when the pass found the broker unavailable.
	needsBroker bool
	run         func(ctx context.Context, res *Result) error
}

// phases are the steps of a pass, in order: measure the stuck orders; make
// sure the broker is there (a pass that cannot reach it re-drives and
// unwinds nothing, and the stuck deadlines count again from its return);
// heal open orders whose last event the broker lost (first: a healed
// order's deadline starts again, so it is not unwound for the loss);
// re-drive or unwind the stuck orders (plan, then apply); refund what
// unwinds left due; re-notify terminal orders whose webhook was never
// created; publish stale outbox rows; sweep expired dedupe rows and old
// published outbox rows; settle and sweep idempotency tokens.
func (c *Compensator) phases() []phase {
	return []phase{
		{name: "measure", run: func(ctx context.Context, res *Result) error { return c.measure(ctx, c.pool, res) }},
		{name: phaseBroker, run: func(ctx context.Context, _ *Result) error {
			if err := c.brokerReachable(ctx); err != nil {
				return errors.Join(err, c.noteBroker(ctx, false))
			}
			return c.noteBroker(ctx, true)
		}},
		{name: "heal", needsBroker: true, run: c.heal},
		{name: "scan", needsBroker: true, run: c.scan},
		{name: "refunds", run: c.refunds},
		{name: "renotify", needsBroker: true, run: c.renotify},
		{name: "republish", needsBroker: true, run: c.republish},
		{name: "sweep", run: c.sweep},
		{name: "tokens", run: c.tokens},
	}
}

// plan decides what a pass does to the stuck order o, from what it reads in
// tx; it writes nothing. The pass applies its decision (redrive, unwind)
// and the dry run reports it, so that both follow the same conditions and
// give the same reasons. dryRun only changes the wording ("would …").
func (c *Compensator) plan(ctx context.Context, tx pgx.Tx, o stuckOrder, dryRun bool) (Action, error) {
	a := Action{OrderID: o.ID, ClientID: o.ClientID, RequestID: o.RequestID, From: o.Status, DryRun: dryRun}
	idle := fmt.Sprintf("no progress in %s for %s (deadline %s)", o.Status, o.Age.Round(time.Second), c.cfg.StuckAfter(o.Status))
	if o.attempt() < c.cfg.Attempts() {
		a.Kind, a.Attempt = KindRedrive, o.attempt()+1
		a.Reason = fmt.Sprintf("%s; re-drive %d of %d", idle, a.Attempt, c.cfg.Attempts())
		return a, nil
	}
	a.Attempt = o.attempt()
	pending, err := eventPending(ctx, tx, o.ID)
	if err != nil {
		return Action{}, err
	}
	if pending {
		a.Kind, a.Reason = KindSkip, whyPending
		return a, nil
	}
	var held int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM reservations WHERE order_id = $1 AND released_at IS NULL`, o.ID).Scan(&held); err != nil {
		return Action{}, fmt.Errorf("read reservations of order %s: %w", o.ID, err)
	}
	p, err := payments.Get(ctx, tx, o.ID, false)
	if err != nil && !errors.Is(err, payments.ErrNoPayment) {
		return Action{}, err
	}
	var refund string
	switch {
	case err != nil || !p.Status.Holds():
		refund = "no charge to refund"
	case p.Status == payments.Pending:
		refund = "charge outcome unknown: " + would(dryRun, "void the key with the provider, refund it if it had charged")
	case dryRun:
		refund = "would refund charge " + p.ChargeID
	default:
		refund = fmt.Sprintf("refund of charge %s due", p.ChargeID)
	}
	a.Kind = KindUnwind
	a.Reason = fmt.Sprintf("%s after %d re-drives; %s %d reservation(s); %s", idle, a.Attempt, would(dryRun, "release"), held, refund)
	return a, nil
}

// would words an action for a dry run.
func would(dryRun bool, what string) string {
	if dryRun {
		return "would " + what
	}
	return what
}

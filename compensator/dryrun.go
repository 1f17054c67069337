package compensator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"orderpipe/shared/order"
)

// dryRun reports what a pass would do. Everything it reads, it reads in one
// READ ONLY transaction (PostgreSQL refuses any write in it), and it
// publishes nothing, calls no provider and touches no metric.
func (c *Compensator) dryRun(ctx context.Context) (Result, error) {
	res := Result{DryRun: true}
	tx, err := c.pool.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly, IsoLevel: pgx.RepeatableRead})
	if err != nil {
		return res, fmt.Errorf("begin read-only transaction: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := c.measure(ctx, tx, &res); err != nil {
		return res, err
	}
	cursor := uuid.Nil
	for {
		batch, err := c.selectStuck(ctx, tx, cursor, c.cfg.BatchSize, false)
		if err != nil {
			return res, err
		}
		for _, o := range batch {
			a, err := c.wouldAct(ctx, tx, o)
			if err != nil {
				return res, err
			}
			res.add(a)
			c.logAction(a)
		}
		if len(batch) < c.cfg.BatchSize {
			break
		}
		cursor = batch[len(batch)-1].ID
	}
	cursor = uuid.Nil
	for {
		due, err := selectRefundsDue(ctx, tx, cursor, c.cfg.BatchSize, c.cfg.DedupeRetention, false)
		if err != nil {
			return res, err
		}
		for _, r := range due {
			a := Action{OrderID: r.OrderID, ClientID: r.ClientID, RequestID: r.RequestID, Kind: KindRefund, From: order.StatusCancelled, DryRun: true,
				Reason: fmt.Sprintf("refund of charge %s due (payment %s)", deref(r.ChargeID), r.Status)}
			res.add(a)
			c.logAction(a)
		}
		if len(due) < c.cfg.BatchSize {
			break
		}
		cursor = due[len(due)-1].OrderID
	}
	if err := c.wouldRenotify(ctx, tx, &res); err != nil {
		return res, err
	}
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE published_at IS NULL AND created_at <= now() - make_interval(secs => $1::float8)`,
		c.cfg.OutboxMinAge.Seconds()).Scan(&res.Republished); err != nil {
		return res, fmt.Errorf("count pending outbox rows: %w", err)
	}
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM processed_messages WHERE processed_at < now() - make_interval(secs => $1::float8)`,
		c.cfg.DedupeRetention.Seconds()).Scan(&res.Swept); err != nil {
		return res, fmt.Errorf("count expired dedupe rows: %w", err)
	}
	return res, nil
}

// wouldAct says what a pass would do to o, reading what an unwind would
// undo.
func (c *Compensator) wouldAct(ctx context.Context, tx pgx.Tx, o stuckOrder) (Action, error) {
	if o.attempt() < c.cfg.Attempts() {
		attempt := o.attempt() + 1
		return Action{OrderID: o.ID, ClientID: o.ClientID, RequestID: o.RequestID, Kind: KindRedrive, From: o.Status, Attempt: attempt, DryRun: true,
			Reason: fmt.Sprintf("no progress in %s for %s (deadline %s); re-drive %d of %d",
				o.Status, o.Age.Round(time.Second), c.cfg.StuckAfter(o.Status), attempt, c.cfg.Attempts())}, nil
	}
	var held int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM reservations WHERE order_id = $1 AND released_at IS NULL`, o.ID).Scan(&held); err != nil {
		return Action{}, fmt.Errorf("read reservations of order %s: %w", o.ID, err)
	}
	refund := "no charge to refund"
	var status string
	var chargeID *string
	err := tx.QueryRow(ctx, `SELECT status, charge_id FROM payments WHERE order_id = $1 AND status IN ('pending', 'succeeded')`, o.ID).Scan(&status, &chargeID)
	switch {
	case err == nil && status == "pending":
		refund = "charge outcome unknown: would void the key with the provider, refund if it had charged"
	case err == nil:
		refund = fmt.Sprintf("would refund charge %s", deref(chargeID))
	case !errors.Is(err, pgx.ErrNoRows):
		return Action{}, fmt.Errorf("read payment of order %s: %w", o.ID, err)
	}
	return Action{OrderID: o.ID, ClientID: o.ClientID, RequestID: o.RequestID, Kind: KindUnwind, From: o.Status, Attempt: o.attempt(), DryRun: true,
		Reason: fmt.Sprintf("no progress in %s for %s (deadline %s) after %d re-drives; would release %d reservation(s); %s",
			o.Status, o.Age.Round(time.Second), c.cfg.StuckAfter(o.Status), o.attempt(), held, refund)}, nil
}

// deref returns *s, or "" for nil.
func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

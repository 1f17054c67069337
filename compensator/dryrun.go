package compensator

import (
	"context"
	"fmt"

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
			a, err := c.plan(ctx, tx, o, true)
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

// deref returns *s, or "" for nil.
func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

package compensator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"orderpipe/shared/metrics"
	"orderpipe/shared/order"
	"orderpipe/shared/payments"
	"orderpipe/shared/postgres"
	"orderpipe/shared/psp"
	"orderpipe/shared/tracing"
)

// markRefundDue records, in the unwind's transaction, that what the
// order's payment holds (a succeeded charge, or a pending one that may
// have charged) must be given back; the provider is called after the
// commit (refunds).
func markRefundDue(ctx context.Context, tx pgx.Tx, orderID uuid.UUID) error {
	if _, err := payments.MarkRefundDue(ctx, tx, orderID); err != nil && !errors.Is(err, payments.ErrNoPayment) {
		return err
	}
	return nil
}

// refundDue is a payment of a cancelled order that may hold money.
type refundDue struct {
	OrderID   uuid.UUID
	ClientID  uuid.UUID
	RequestID string
	Status    string
	ChargeKey string
	Amount    string
	Currency  string
	ChargeID  *string
	RefundKey string
}

// selectRefundsDue reads (lock: and claims) payments of cancelled orders
// that are succeeded or pending: money that may be held for an order that
// will never be confirmed. Candidates come from two small indexes: pending
// payments and succeeded ones with a refund due (payments_unsettled_idx),
// and orders cancelled within the last `recent` (orders_cancelled_idx: a
// charge recorded on an order after it was cancelled).
func selectRefundsDue(ctx context.Context, q postgres.DB, cursor uuid.UUID, limit int, recent time.Duration, lock bool) ([]refundDue, error) {
	sql := `
		SELECT p.order_id, o.client_id, o.request_id, p.status, p.idempotency_key, p.amount::text, p.currency, p.charge_id, coalesce(p.refund_key, '')
		FROM payments p JOIN orders o ON o.order_id = p.order_id
		WHERE p.order_id IN (
		        SELECT order_id FROM payments WHERE status = 'pending' OR (status = 'succeeded' AND refund_key IS NOT NULL)
		        UNION
		        SELECT order_id FROM orders WHERE status = 'cancelled' AND updated_at > now() - make_interval(secs => $3::float8))
		  AND o.status = 'cancelled' AND p.status IN ('pending', 'succeeded') AND p.order_id > $1
		ORDER BY p.order_id LIMIT $2`
	if lock {
		sql += ` FOR UPDATE OF p SKIP LOCKED`
	}
	rows, err := q.Query(ctx, sql, cursor, limit, recent.Seconds())
	if err != nil {
		return nil, fmt.Errorf("select refunds due: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (refundDue, error) {
		var r refundDue
		if err := row.Scan(&r.OrderID, &r.ClientID, &r.RequestID, &r.Status, &r.ChargeKey, &r.Amount, &r.Currency, &r.ChargeID, &r.RefundKey); err != nil {
			return refundDue{}, fmt.Errorf("select refunds due: %w", err)
		}
		return r, nil
	})
}

// refunds refunds the charges of cancelled orders (settleRefunds), then
// counts the payments that may still hold money for the gauges.
func (c *Compensator) refunds(ctx context.Context, res *Result) error {
	err := c.settleRefunds(ctx, res)
	if ctx.Err() != nil {
		return err
	}
	return errors.Join(err, c.measureRefundsDue(ctx))
}

// measureRefundsDue sets orderpipe_refunds_due and
// orderpipe_oldest_refund_due_age_seconds: the payments of cancelled or
// rejected orders that may still hold the customer's money (a succeeded
// charge whose refund is due, or a charge of unknown outcome to void),
// and how long ago the oldest one's order ended. Read after the pass asked
// the provider for them, they are the refunds the provider did not make
// (or that are in flight elsewhere). The candidates come from
// payments_unsettled_idx: after settleRefunds, a succeeded charge of a
// cancelled order has its refund_key.
func (c *Compensator) measureRefundsDue(ctx context.Context) error {
	var n int
	var oldest float64
	if err := c.pool.QueryRow(ctx, `
		SELECT count(*), coalesce(extract(epoch FROM now() - min(o.updated_at)), 0)::float8
		FROM payments p JOIN orders o ON o.order_id = p.order_id
		WHERE (p.status = 'pending' OR (p.status = 'succeeded' AND p.refund_key IS NOT NULL))
		  AND o.status IN ('cancelled', 'rejected')`).Scan(&n, &oldest); err != nil {
		return fmt.Errorf("count refunds due: %w", err)
	}
	metrics.RefundsDue.Set(float64(n))
	metrics.OldestRefundDueAge.Set(max(oldest, 0))
	return nil
}

// settleRefunds refunds the charges of cancelled orders. The intent
// (refund_key) is committed before the provider is called; the call
// carries that key, so a crash after the call and before the record
// repeats the call and gets the first refund back, never a second one.
func (c *Compensator) settleRefunds(ctx context.Context, res *Result) error {
	cursor := uuid.Nil
	var errs []error
	for {
		var due []refundDue
		err := pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
			var err error
			if due, err = selectRefundsDue(ctx, tx, cursor, c.cfg.BatchSize, c.cfg.DedupeRetention, true); err != nil {
				return err
			}
			for i, r := range due {
				if r.RefundKey == "" {
					due[i].RefundKey = payments.RefundKey(r.OrderID)
					if _, err := tx.Exec(ctx, `UPDATE payments SET refund_key = $2, updated_at = now() WHERE order_id = $1 AND refund_key IS NULL`, r.OrderID, due[i].RefundKey); err != nil {
						return fmt.Errorf("record refund intent of order %s: %w", r.OrderID, err)
					}
				}
			}
			return nil
		})
		if err != nil {
			return errors.Join(append(errs, err)...)
		}
		for _, r := range due {
			if ctx.Err() != nil {
				return errors.Join(append(errs, ctx.Err())...)
			}
			if err := c.refundOne(ctx, r, res); err != nil {
				errs = append(errs, err)
			}
		}
		if len(due) < c.cfg.BatchSize {
			return errors.Join(errs...)
		}
		cursor = due[len(due)-1].OrderID
	}
}

// refundOne settles one payment of a cancelled order with the provider
// through payments.Settle (the same keys from every caller; a pending
// charge key is voided, never charged) and records the compensator's refund
// action once. A refund the provider did not make (or that no provider
// was there to make) is counted (orderpipe_compensator_refund_failures_total)
// and returned as a reportedError: the refund stays due, and
// orderpipe_refunds_due shows it.
func (c *Compensator) refundOne(ctx context.Context, r refundDue, res *Result) error {
	if c.provider == nil {
		metrics.RefundFailures.Inc()
		return reportedError{fmt.Errorf("refund of order %s is due but no payment provider is configured", r.OrderID)}
	}
	done, err := payments.Settle(ctx, c.pool, c.provider, r.OrderID)
	if inFlight(err) {
		// Another caller is asking with the same key right now; it
		// records the answer (or, if it dies, a later pass asks again).
		lctx, span := tracing.Tracer().Start(ctx, "compensator refund")
		defer span.End()
		c.logger.InfoContext(lctx, "refund in flight elsewhere; settled on a later pass", slog.String("order_id", r.OrderID.String()),
			slog.String("request_id", r.RequestID), slog.String("client_id", r.ClientID.String()))
		return nil
	}
	if err != nil {
		err = fmt.Errorf("refund cancelled order %s: %w", r.OrderID, err)
		var pe *psp.Error
		if !errors.As(err, &pe) || ctx.Err() != nil {
			return err // not the provider's answer (the database, a shutdown)
		}
		metrics.RefundFailures.Inc()
		return reportedError{err}
	}
	if done.RefundID == "" {
		return nil // the pending key was voided or declined: nothing to give back
	}
	a := Action{OrderID: r.OrderID, ClientID: r.ClientID, RequestID: r.RequestID, Kind: KindRefund, From: order.StatusCancelled,
		Reason: fmt.Sprintf("refunded charge %s: refund %s (key %s)", done.ChargeID, done.RefundID, payments.RefundKey(r.OrderID))}
	recorded := false
	err = pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		// The payment row's lock serialises compensators that both saw
		// the refund through; the first one records it.
		var status string
		if err := tx.QueryRow(ctx, `SELECT status FROM payments WHERE order_id = $1 FOR UPDATE`, r.OrderID).Scan(&status); err != nil {
			return err
		}
		var seen bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM compensator_actions WHERE order_id = $1 AND action = 'refund')`, r.OrderID).Scan(&seen); err != nil {
			return err
		}
		if status != "refunded" || seen {
			return nil
		}
		recorded = true
		return c.record(ctx, tx, a)
	})
	if err != nil {
		return fmt.Errorf("record refund %s of order %s: %w", done.RefundID, r.OrderID, err)
	}
	if recorded {
		c.taken(a, res)
	}
	return nil
}

// inFlight reports a provider answer 409: the same key is being processed
// by another caller.
func inFlight(err error) bool {
	var pe *psp.Error
	return errors.As(err, &pe) && pe.HTTPStatus == http.StatusConflict
}

package compensator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"orderpipe/shared/failpoint"
	"orderpipe/shared/metrics"
	"orderpipe/shared/order"
	"orderpipe/shared/psp"
)

// RefundKey is the Idempotency-Key of the refund of an order's charge: the
// same for every attempt, from any compensator, so the provider refunds a
// charge once whatever the number of calls.
func RefundKey(orderID uuid.UUID) string { return "refund-" + orderID.String() }

// releaseStock gives back the stock that the order holds, in tx, and
// returns how many reservation rows it released. A row is released once:
// released_at is set by the transaction that gives the quantity back.
func releaseStock(ctx context.Context, tx pgx.Tx, orderID uuid.UUID) (int, error) {
	rows, err := tx.Query(ctx, `
		UPDATE reservations SET released_at = now()
		WHERE order_id = $1 AND released_at IS NULL
		RETURNING sku, quantity`, orderID)
	if err != nil {
		return 0, fmt.Errorf("release stock of order %s: %w", orderID, err)
	}
	type line struct {
		sku string
		qty int64
	}
	var lines []line
	for rows.Next() {
		var l line
		if err := rows.Scan(&l.sku, &l.qty); err != nil {
			rows.Close()
			return 0, fmt.Errorf("release stock of order %s: %w", orderID, err)
		}
		lines = append(lines, l)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("release stock of order %s: %w", orderID, err)
	}
	for _, l := range lines {
		if _, err := tx.Exec(ctx, `UPDATE inventory SET available = available + $2, updated_at = now() WHERE sku = $1`, l.sku, l.qty); err != nil {
			return 0, fmt.Errorf("release %d of %s for order %s: %w", l.qty, l.sku, orderID, err)
		}
	}
	return len(lines), nil
}

// markRefundDue records, in the unwind's transaction, that the order's
// charge (if one succeeded, or may have: a pending payment) must be
// refunded, with the refund's Idempotency-Key. The refund itself happens
// after the commit (refunds). It returns a description for the action.
func markRefundDue(ctx context.Context, tx pgx.Tx, orderID uuid.UUID) (string, error) {
	var status string
	var chargeID *string
	err := tx.QueryRow(ctx, `
		UPDATE payments SET refund_key = coalesce(refund_key, $2), updated_at = now()
		WHERE order_id = $1 AND status IN ('pending', 'succeeded')
		RETURNING status, charge_id`, orderID, RefundKey(orderID)).Scan(&status, &chargeID)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return "no charge to refund", nil
	case err != nil:
		return "", fmt.Errorf("mark refund due for order %s: %w", orderID, err)
	case status == "pending":
		return "charge outcome unknown: resolve with the provider, refund if charged", nil
	default:
		return fmt.Sprintf("refund of charge %s due", deref(chargeID)), nil
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// refundDue is a payment of a cancelled order that may hold money.
type refundDue struct {
	OrderID   uuid.UUID
	Status    string
	ChargeKey string
	Amount    string
	Currency  string
	ChargeID  *string
	RefundKey string
}

// selectRefundsDue reads (lock: and claims) payments of cancelled orders
// that are succeeded or pending: money that may be held for an order that
// will never be confirmed.
func selectRefundsDue(ctx context.Context, q querier, cursor uuid.UUID, limit int, lock bool) ([]refundDue, error) {
	sql := `
		SELECT p.order_id, p.status, p.idempotency_key, p.amount::text, p.currency, p.charge_id, coalesce(p.refund_key, '')
		FROM payments p JOIN orders o ON o.order_id = p.order_id
		WHERE o.status = 'cancelled' AND p.status IN ('pending', 'succeeded') AND p.order_id > $1
		ORDER BY p.order_id LIMIT $2`
	if lock {
		sql += ` FOR UPDATE OF p SKIP LOCKED`
	}
	rows, err := q.Query(ctx, sql, cursor, limit)
	if err != nil {
		return nil, fmt.Errorf("select refunds due: %w", err)
	}
	defer rows.Close()
	var out []refundDue
	for rows.Next() {
		var r refundDue
		if err := rows.Scan(&r.OrderID, &r.Status, &r.ChargeKey, &r.Amount, &r.Currency, &r.ChargeID, &r.RefundKey); err != nil {
			return nil, fmt.Errorf("select refunds due: %w", err)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// refunds refunds the charges of cancelled orders. The intent (refund_key)
// is committed before the provider is called; the call carries that key, so
// a crash after the call and before the record repeats the call and gets
// the first refund back, never a second one.
func (c *Compensator) refunds(ctx context.Context, res *Result) error {
	cursor := uuid.Nil
	var errs []error
	for {
		var due []refundDue
		err := pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
			var err error
			if due, err = selectRefundsDue(ctx, tx, cursor, c.cfg.BatchSize, true); err != nil {
				return err
			}
			for i, r := range due {
				if r.RefundKey == "" {
					due[i].RefundKey = RefundKey(r.OrderID)
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

// refundOne settles one payment of a cancelled order with the provider.
func (c *Compensator) refundOne(ctx context.Context, r refundDue, res *Result) error {
	if c.provider == nil {
		return fmt.Errorf("refund of order %s is due but no payment provider is configured", r.OrderID)
	}
	chargeID := deref(r.ChargeID)
	if r.Status == "pending" {
		// The charge's outcome is unknown. The same key returns the
		// provider's first answer (and charges now if it never got the
		// call: that charge is refunded below, so the customer is even).
		ans, err := c.provider.Charge(ctx, r.ChargeKey, r.Amount, r.Currency, r.OrderID.String())
		if inFlight(err) {
			c.logger.Info("charge in flight elsewhere; resolved on a later pass", slog.String("order_id", r.OrderID.String()))
			return nil
		}
		if err != nil {
			return fmt.Errorf("resolve pending charge of cancelled order %s: %w", r.OrderID, err)
		}
		if ans.Status == psp.StatusDeclined {
			_, err := c.pool.Exec(ctx, `UPDATE payments SET status = 'declined', decline_reason = $2, charge_id = coalesce(charge_id, $3), updated_at = now() WHERE order_id = $1 AND status = 'pending'`,
				r.OrderID, ans.Reason, ans.ID)
			if err != nil {
				return fmt.Errorf("record declined charge of cancelled order %s: %w", r.OrderID, err)
			}
			return nil
		}
		if _, err := c.pool.Exec(ctx, `UPDATE payments SET status = 'succeeded', charge_id = $2, updated_at = now() WHERE order_id = $1 AND status = 'pending'`,
			r.OrderID, ans.ID); err != nil {
			return fmt.Errorf("record charge of cancelled order %s: %w", r.OrderID, err)
		}
		chargeID = ans.ID
	}
	ans, err := c.provider.Refund(ctx, r.RefundKey, chargeID)
	if inFlight(err) {
		// Another compensator is asking with the same key right now; it
		// records the answer (or, if it dies, a later pass asks again).
		c.logger.Info("refund in flight elsewhere", slog.String("order_id", r.OrderID.String()))
		return nil
	}
	if err != nil {
		return fmt.Errorf("refund charge %s of cancelled order %s: %w", chargeID, r.OrderID, err)
	}
	if err := failpoint.Inject(FailAfterRefund); err != nil {
		return err
	}
	a := Action{OrderID: r.OrderID, Kind: KindRefund, From: order.StatusCancelled,
		Reason: fmt.Sprintf("refunded charge %s: refund %s (key %s)", chargeID, ans.ID, r.RefundKey)}
	recorded := false
	err = pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `
			UPDATE payments SET status = 'refunded', refund_id = $2, refunded_at = now(), updated_at = now()
			WHERE order_id = $1 AND status = 'succeeded'`, r.OrderID, ans.ID)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return nil // another compensator recorded the same refund
		}
		recorded = true
		return c.record(ctx, tx, a)
	})
	if err != nil {
		return fmt.Errorf("record refund %s of order %s: %w", ans.ID, r.OrderID, err)
	}
	if recorded {
		res.add(a)
		metrics.CompensatorActions.WithLabelValues(KindRefund).Inc()
		c.logAction(a)
	} else {
		c.logger.Debug("refund already recorded", slog.String("order_id", r.OrderID.String()))
	}
	return nil
}

// inFlight reports a provider answer 409: the same key is being processed
// by another caller.
func inFlight(err error) bool {
	var pe *psp.Error
	return errors.As(err, &pe) && pe.HTTPStatus == http.StatusConflict
}

// Package payment is the payment step: on orders.reserved it charges the
// order through the payment provider (shared/psp) with the Idempotency-Key
// "charge:<order_id>", the same for every retry, and then, in the step's
// transaction, records the answer and moves the order: succeeded → paid;
// declined → stock released → cancelled with the reason. A transient
// failure (409, 5xx, timeout) is retried with the same key, so an order is
// never charged twice.
//
// Before the provider is called the payment is recorded as pending: whoever
// finds a pending payment knows that a charge may exist under its key. The
// provider call happens outside any transaction (it may be slow; the router
// keeps the message alive with in-progress acks meanwhile).
//
// Refund undoes an order's charge exactly once ("refund:<order_id>"); the
// step uses it for an order that left reserved while it was being charged,
// and the compensator uses it when it unwinds an order.
package payment

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"orderpipe/consumers/inventory"
	"orderpipe/consumers/step"
	"orderpipe/shared/failpoint"
	"orderpipe/shared/order"
	"orderpipe/shared/orderevent"
	"orderpipe/shared/orderstore"
	"orderpipe/shared/psp"
)

// Name is the step's durable consumer name.
const Name = "payment"

// FailAfterCharge fires after the provider answered a charge and before
// the answer is recorded.
const FailAfterCharge = "payment.after-charge"

// ChargeKey is the Idempotency-Key of an order's charge.
func ChargeKey(orderID uuid.UUID) string { return "charge:" + orderID.String() }

// RefundKey is the Idempotency-Key of an order's refund.
func RefundKey(orderID uuid.UUID) string { return "refund:" + orderID.String() }

// Step returns the payment step.
func Step(pool *pgxpool.Pool, client *psp.Client) step.Step {
	p := &payments{pool: pool, psp: client}
	return step.Step{Name: Name, Events: []orderevent.Name{orderevent.Reserved}, Handle: p.handle}
}

type payments struct {
	pool *pgxpool.Pool
	psp  *psp.Client
}

var errOrderMoved = errors.New("order was cancelled while it was being charged")

func (p *payments) handle(ctx context.Context, m step.Message, commit step.Commit) error {
	id := m.Event.OrderID
	var status, amount, currency string
	err := p.pool.QueryRow(ctx, `SELECT status, amount::text, currency FROM orders WHERE order_id = $1`, id).Scan(&status, &amount, &currency)
	if errors.Is(err, pgx.ErrNoRows) {
		return step.Permanent(fmt.Errorf("charge order %s: %w", id, orderstore.ErrNotFound))
	}
	if err != nil {
		return fmt.Errorf("read order %s: %w", id, err)
	}
	if order.Status(status) != order.StatusReserved {
		// A late or repeated message. An earlier delivery may have charged
		// before dying: unless the order went through, undo that charge.
		if s := order.Status(status); s == order.StatusCancelled || s == order.StatusRejected {
			if _, err := Refund(ctx, p.pool, p.psp, id); err != nil {
				return err
			}
		}
		_, err := commit(ctx, func(context.Context, pgx.Tx) ([]int64, error) { return nil, nil })
		return err
	}
	if _, err := p.pool.Exec(ctx, `
		INSERT INTO payments (order_id, idempotency_key, amount, currency, status)
		VALUES ($1, $2, $3::numeric, $4, 'pending')
		ON CONFLICT (order_id) DO NOTHING`, id, ChargeKey(id), amount, currency); err != nil {
		return fmt.Errorf("record pending payment of order %s: %w", id, err)
	}
	ans, err := p.psp.Charge(ctx, ChargeKey(id), amount, currency, id.String())
	if err != nil {
		if psp.IsTransient(err) {
			return fmt.Errorf("charge order %s: %w", id, err)
		}
		return step.Permanent(fmt.Errorf("charge order %s: %w", id, err))
	}
	if err := failpoint.Inject(FailAfterCharge); err != nil {
		return err
	}
	_, err = commit(ctx, func(ctx context.Context, tx pgx.Tx) ([]int64, error) {
		st, err := step.LockStatus(ctx, tx, id)
		if err != nil {
			return nil, err
		}
		switch st {
		case order.StatusReserved:
		case order.StatusCancelled, order.StatusRejected:
			return nil, errOrderMoved
		default:
			// Another delivery (the original, a re-drive, a replay) got
			// there first with the same charge: the order went through.
			// Record the dedupe row and nothing else.
			return nil, nil
		}
		if err := record(ctx, tx, id, ans); err != nil {
			return nil, err
		}
		var moved orderstore.Moved
		if ans.Status == psp.StatusSucceeded {
			moved, err = orderstore.Transition(ctx, tx, id, order.StatusReserved, order.StatusPaid, "")
		} else {
			if _, err := inventory.Release(ctx, tx, id); err != nil {
				return nil, err
			}
			moved, err = orderstore.Transition(ctx, tx, id, order.StatusReserved, order.StatusCancelled, "payment declined: "+ans.Reason)
		}
		if err != nil || !moved.OK {
			return nil, err
		}
		return []int64{moved.OutboxID}, nil
	})
	if errors.Is(err, errOrderMoved) {
		// The compensator cancelled the order meanwhile: our charge must
		// not stay. Record it, refund it, then mark the message done.
		if err := recordPool(ctx, p.pool, id, ans); err != nil {
			return err
		}
		if ans.Status == psp.StatusSucceeded {
			if _, err := Refund(ctx, p.pool, p.psp, id); err != nil {
				return err
			}
		}
		_, err = commit(ctx, func(context.Context, pgx.Tx) ([]int64, error) { return nil, nil })
	}
	return err
}

// record writes the provider's answer on a pending payment.
func record(ctx context.Context, tx pgx.Tx, id uuid.UUID, ans psp.Answer) error {
	_, err := tx.Exec(ctx, recordSQL, id, ans.Status, ans.ID, ans.Reason)
	if err != nil {
		return fmt.Errorf("record %s charge of order %s: %w", ans.Status, id, err)
	}
	return nil
}

func recordPool(ctx context.Context, pool *pgxpool.Pool, id uuid.UUID, ans psp.Answer) error {
	_, err := pool.Exec(ctx, recordSQL, id, ans.Status, ans.ID, ans.Reason)
	if err != nil {
		return fmt.Errorf("record %s charge of order %s: %w", ans.Status, id, err)
	}
	return nil
}

const recordSQL = `
	UPDATE payments SET status = $2, charge_id = $3, decline_reason = NULLIF($4, ''), updated_at = now()
	WHERE order_id = $1 AND status = 'pending'`

// Refunded says what Refund did.
type Refunded struct {
	// ChargeID is the order's successful charge ("" when it has none).
	ChargeID string
	// RefundID is the provider's refund id (now or from before).
	RefundID string
}

// Refund undoes the charge of an order, if it has one, exactly once, and
// records it on the payment row (status refunded). It is safe to call any
// number of times, from any process: the provider sees the same
// Idempotency-Key ("refund:<order_id>") every time.
//
//   - no payment row: the order was never sent to the provider; nothing to do.
//   - declined or refunded: nothing (more) to do.
//   - pending (a charge may exist: its step died or is still running): the
//     charge is repeated with its own key and body, which returns the
//     provider's first answer (or, if the provider never saw it, charges
//     now); a success is then refunded. 409 (the charge is in flight) is a
//     transient error: call again later.
//   - succeeded: refunded.
//
// The caller decides that the order must not keep its money (it is
// cancelled or being cancelled); Refund does not look at the order's
// status. Errors from the provider are *psp.Error (psp.IsTransient tells
// whether to retry).
func Refund(ctx context.Context, pool *pgxpool.Pool, client *psp.Client, orderID uuid.UUID) (Refunded, error) {
	var key, amount, currency, status string
	var chargeID, refundID *string
	err := pool.QueryRow(ctx, `SELECT idempotency_key, amount::text, currency, status, charge_id, refund_id FROM payments WHERE order_id = $1`, orderID).
		Scan(&key, &amount, &currency, &status, &chargeID, &refundID)
	if errors.Is(err, pgx.ErrNoRows) {
		return Refunded{}, nil
	}
	if err != nil {
		return Refunded{}, fmt.Errorf("read payment of order %s: %w", orderID, err)
	}
	switch status {
	case "declined":
		return Refunded{}, nil
	case "refunded":
		return Refunded{ChargeID: deref(chargeID), RefundID: deref(refundID)}, nil
	case "pending":
		ans, err := client.Charge(ctx, key, amount, currency, orderID.String())
		if err != nil {
			return Refunded{}, fmt.Errorf("learn the charge of order %s: %w", orderID, err)
		}
		if err := recordPool(ctx, pool, orderID, ans); err != nil {
			return Refunded{}, err
		}
		if ans.Status != psp.StatusSucceeded {
			return Refunded{}, nil
		}
		chargeID = &ans.ID
	}
	r, err := client.Refund(ctx, RefundKey(orderID), *chargeID)
	if err != nil {
		return Refunded{}, fmt.Errorf("refund order %s: %w", orderID, err)
	}
	if _, err := pool.Exec(ctx, `
		UPDATE payments SET status = 'refunded', refund_key = $2, refund_id = $3, refunded_at = now(), updated_at = now()
		WHERE order_id = $1 AND status = 'succeeded'`, orderID, RefundKey(orderID), r.ID); err != nil {
		return Refunded{}, fmt.Errorf("record refund of order %s: %w", orderID, err)
	}
	return Refunded{ChargeID: *chargeID, RefundID: r.ID}, nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

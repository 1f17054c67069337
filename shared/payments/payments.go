// Package payments owns the payments table: orderpipe's side of the
// payment provider, one row per order. The payment step (consumers/payment)
// and the compensator both go through it, so that the rules about money are
// written once:
//
//   - The row is recorded Pending, with the charge's Idempotency-Key
//     (ChargeKey), before the provider is called: whoever finds a pending
//     payment knows that a charge may exist under that key.
//   - The provider's answer moves it, once, to Succeeded, Declined or
//     Voided (Record).
//   - Settle gives back what a cancelled order holds: a pending key is
//     resolved with the provider's void, which never charges; a succeeded
//     charge is refunded exactly once under RefundKey.
package payments

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"orderpipe/shared/postgres"
	"orderpipe/shared/psp"
)

// Status is a payment's state (payments.status).
type Status string

// The statuses of a payment.
const (
	// Pending: the provider may hold a charge under the key; its outcome
	// is not known here yet.
	Pending Status = "pending"
	// Succeeded: charged (ChargeID).
	Succeeded Status = "succeeded"
	// Declined: the provider declined the charge; nothing was charged.
	Declined Status = "declined"
	// Refunded: charged, then refunded (RefundID).
	Refunded Status = "refunded"
	// Voided: the key was voided before any charge, or the provider
	// refused the charge outright; nothing was or will be charged.
	Voided Status = "voided"
)

// Holds reports whether a payment in status s may hold the customer's
// money (a refund or a void may be due).
func (s Status) Holds() bool { return s == Pending || s == Succeeded }

// ChargeKey is the Idempotency-Key of an order's charge (and of its void).
func ChargeKey(orderID uuid.UUID) string { return "charge:" + orderID.String() }

// RefundKey is the Idempotency-Key of an order's refund.
func RefundKey(orderID uuid.UUID) string { return "refund:" + orderID.String() }

// Payment is one row of the payments table.
type Payment struct {
	OrderID uuid.UUID
	// Key is the charge's Idempotency-Key.
	Key      string
	Amount   string
	Currency string
	Status   Status
	ChargeID string
	// Reason is a decline's or a refusal's reason.
	Reason    string
	RefundKey string
	RefundID  string
}

// ErrNoPayment: the order has no payment row (it never reached the
// provider).
var ErrNoPayment = errors.New("no payment")

// Get reads an order's payment; lock adds FOR UPDATE (inside a
// transaction). A missing row is ErrNoPayment.
func Get(ctx context.Context, db postgres.DB, orderID uuid.UUID, lock bool) (Payment, error) {
	sql := `SELECT idempotency_key, amount::text, currency, status, coalesce(charge_id, ''), coalesce(decline_reason, ''),
	               coalesce(refund_key, ''), coalesce(refund_id, '')
	        FROM payments WHERE order_id = $1`
	if lock {
		sql += ` FOR UPDATE`
	}
	p := Payment{OrderID: orderID}
	err := db.QueryRow(ctx, sql, orderID).Scan(&p.Key, &p.Amount, &p.Currency, &p.Status, &p.ChargeID, &p.Reason, &p.RefundKey, &p.RefundID)
	if errors.Is(err, pgx.ErrNoRows) {
		return Payment{}, fmt.Errorf("payment of order %s: %w", orderID, ErrNoPayment)
	}
	if err != nil {
		return Payment{}, fmt.Errorf("read payment of order %s: %w", orderID, err)
	}
	return p, nil
}

// RecordPending writes the pending payment of an order before its charge
// is sent (a no-op when the row exists).
func RecordPending(ctx context.Context, db postgres.DB, orderID uuid.UUID, amount, currency string) error {
	if _, err := db.Exec(ctx, `
		INSERT INTO payments (order_id, idempotency_key, amount, currency, status)
		VALUES ($1, $2, $3::numeric, $4, 'pending')
		ON CONFLICT (order_id) DO NOTHING`, orderID, ChargeKey(orderID), amount, currency); err != nil {
		return fmt.Errorf("record pending payment of order %s: %w", orderID, err)
	}
	return nil
}

// Due is what PendingMany read of one order: its status, and what a
// charge of it is for.
type Due struct {
	Status   string
	Amount   string
	Currency string
}

// PendingMany reads the status, amount and currency of each of the orders
// and records the pending payment (as RecordPending does) of each one whose
// status is chargeable, in ONE statement: the payment step's reads of many
// concurrent messages, batched. An order that does not exist is absent from
// the map; an order named twice is read once. Each order is read under a
// share lock: a change of its status in flight (the compensator cancelling
// it) is waited for and read, never the status before it, so no pending
// payment (hence no charge) is recorded for an order cancelled meanwhile.
// The orders are taken in id order, so that two such statements at once
// never wait for each other's rows in a cycle. Each order is looked up
// through its key in a LATERAL subquery, also by a plan PostgreSQL cached
// while orders was nearly empty (see postgres.DB); the statement runs on
// its generic plan (postgres.QueryGeneric), so db is a pool or a
// connection, not a transaction.
func PendingMany(ctx context.Context, db postgres.Batcher, orderIDs []uuid.UUID, chargeable string) (map[uuid.UUID]Due, error) {
	ids, keys := make([][16]byte, len(orderIDs)), make([]string, len(orderIDs))
	for i, id := range orderIDs {
		ids[i], keys[i] = id, ChargeKey(id)
	}
	due := make(map[uuid.UUID]Due, len(orderIDs))
	err := postgres.QueryGeneric(ctx, db, func(rows pgx.Rows) error {
		for rows.Next() {
			var (
				id uuid.UUID
				d  Due
			)
			if err := rows.Scan(&id, &d.Status, &d.Amount, &d.Currency); err != nil {
				return err
			}
			due[id] = d
		}
		return rows.Err()
	}, `
		WITH o AS (
			SELECT k.order_id, o.status, o.amount, o.currency, k.key
			FROM (SELECT DISTINCT * FROM unnest($1::uuid[], $2::text[]) AS u(order_id, key) ORDER BY order_id) AS k
			CROSS JOIN LATERAL (SELECT status, amount, currency FROM orders WHERE order_id = k.order_id LIMIT 1 FOR SHARE) o
			ORDER BY k.order_id),
		pend AS (
			INSERT INTO payments (order_id, idempotency_key, amount, currency, status)
			SELECT order_id, key, amount, currency, 'pending' FROM o
			WHERE status = $3 ORDER BY order_id
			ON CONFLICT (order_id) DO NOTHING)
		SELECT order_id, status, amount::text, currency FROM o`, ids, keys, chargeable)
	if err != nil {
		return nil, fmt.Errorf("read %d orders and record their pending payments: %w", len(orderIDs), err)
	}
	return due, nil
}

// Record writes the provider's answer for the charge key (succeeded,
// declined or voided) on a pending payment; a payment that is no longer
// pending is left as it is (the answer for one key never changes).
func Record(ctx context.Context, db postgres.DB, orderID uuid.UUID, ans psp.Answer) error {
	return RecordMany(ctx, db, []uuid.UUID{orderID}, []psp.Answer{ans})
}

// RecordMany is Record for many orders (each once) in one statement: the
// payment step's batch. It runs in the step's transaction on a generic
// plan (postgres.GenericPlans). "p.order_id = ANY($1)" gives that plan the
// keys as an index condition: with only the join and "status =
// 'pending'", it was a scan of the whole partial index of unsettled
// payments, which keeps an entry for every payment's pending version
// until a vacuum (thousands of entries read per batch within a minute at
// 150 orders/s).
func RecordMany(ctx context.Context, db postgres.DB, orderIDs []uuid.UUID, answers []psp.Answer) error {
	statuses, ids, reasons := make([]string, len(answers)), make([]string, len(answers)), make([]string, len(answers))
	for i, a := range answers {
		statuses[i], ids[i], reasons[i] = a.Status, a.ID, a.Reason
	}
	_, err := db.Exec(ctx, `
		UPDATE payments p SET status = v.status, charge_id = NULLIF(v.charge_id, ''), decline_reason = NULLIF(v.reason, ''), updated_at = now()
		FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[]) AS v(order_id, status, charge_id, reason)
		WHERE p.order_id = ANY($1) AND p.order_id = v.order_id AND p.status = 'pending'`, orderIDs, statuses, ids, reasons)
	if err != nil {
		if len(orderIDs) == 1 {
			return fmt.Errorf("record %s charge of order %s: %w", answers[0].Status, orderIDs[0], err)
		}
		return fmt.Errorf("record the charges of %d orders: %w", len(orderIDs), err)
	}
	return nil
}

// RecordVoided records a pending payment as voided with the reason (the
// provider refused the charge and its key was voided).
func RecordVoided(ctx context.Context, db postgres.DB, orderID uuid.UUID, reason string) error {
	return Record(ctx, db, orderID, psp.Answer{Status: psp.StatusVoided, Reason: reason})
}

// MarkRefundDue records, in the caller's transaction, that what an order's
// payment holds must be given back (the order is being cancelled): the
// refund's key is set on a pending or succeeded payment. It returns the
// payment, or ErrNoPayment when there is nothing to give back.
func MarkRefundDue(ctx context.Context, tx pgx.Tx, orderID uuid.UUID) (Payment, error) {
	p := Payment{OrderID: orderID}
	err := tx.QueryRow(ctx, `
		UPDATE payments SET refund_key = coalesce(refund_key, $2), updated_at = now()
		WHERE order_id = $1 AND status IN ('pending', 'succeeded')
		RETURNING idempotency_key, status, coalesce(charge_id, ''), refund_key`, orderID, RefundKey(orderID)).
		Scan(&p.Key, &p.Status, &p.ChargeID, &p.RefundKey)
	if errors.Is(err, pgx.ErrNoRows) {
		return Payment{}, fmt.Errorf("refund of order %s: %w", orderID, ErrNoPayment)
	}
	if err != nil {
		return Payment{}, fmt.Errorf("mark refund due for order %s: %w", orderID, err)
	}
	return p, nil
}

// Settled says what Settle did.
type Settled struct {
	// ChargeID is the order's successful charge ("" when it had none).
	ChargeID string
	// RefundID is the provider's refund id (now or from before).
	RefundID string
	// Voided: the charge key was voided; nothing was ever charged.
	Voided bool
}

// Settle gives back what a cancelled order's payment holds, exactly once,
// and records it. It is safe to call any number of times, from any
// process: the provider sees the same keys every time.
//
//   - no payment row: the order never reached the provider; nothing to do.
//   - declined, voided or refunded: nothing (more) to do.
//   - pending (a charge may exist: its step died or is still running): the
//     key is voided. The provider answers "voided" when it never charged
//     (and never will under that key), or the key's stored answer, which
//     is recorded; a succeeded charge is then refunded. It never charges
//     in order to learn an outcome. 409 (the charge is in flight) is a
//     transient error: call again later.
//   - succeeded: refunded with RefundKey.
//
// The caller decides that the order must not keep its money (it is
// cancelled or rejected); Settle does not look at the order's status.
// Errors from the provider are *psp.Error (psp.IsTransient tells whether
// to retry).
func Settle(ctx context.Context, db postgres.DB, client *psp.Client, orderID uuid.UUID) (Settled, error) {
	p, err := Get(ctx, db, orderID, false)
	if errors.Is(err, ErrNoPayment) {
		return Settled{}, nil
	}
	if err != nil {
		return Settled{}, err
	}
	switch p.Status {
	case Declined:
		return Settled{}, nil
	case Voided:
		return Settled{Voided: true}, nil
	case Refunded:
		return Settled{ChargeID: p.ChargeID, RefundID: p.RefundID}, nil
	case Pending:
		ans, err := client.Void(ctx, p.Key, orderID.String())
		if err != nil {
			return Settled{}, fmt.Errorf("void the charge key of order %s: %w", orderID, err)
		}
		if err := Record(ctx, db, orderID, ans); err != nil {
			return Settled{}, err
		}
		switch ans.Status {
		case psp.StatusVoided:
			return Settled{Voided: true}, nil
		case psp.StatusDeclined:
			return Settled{}, nil
		}
		p.ChargeID = ans.ID
	}
	r, err := client.Refund(ctx, RefundKey(orderID), p.ChargeID)
	if err != nil {
		return Settled{}, fmt.Errorf("refund order %s: %w", orderID, err)
	}
	if _, err := db.Exec(ctx, `
		UPDATE payments SET status = 'refunded', refund_key = $2, refund_id = $3, refunded_at = now(), updated_at = now()
		WHERE order_id = $1 AND status = 'succeeded'`, orderID, RefundKey(orderID), r.ID); err != nil {
		return Settled{}, fmt.Errorf("record refund of order %s: %w", orderID, err)
	}
	return Settled{ChargeID: p.ChargeID, RefundID: r.ID}, nil
}

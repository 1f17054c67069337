// Package orderstore moves orders through their states in PostgreSQL. A
// move is a conditional update (WHERE status = expected), so a late or
// repeated message can never move an order backwards or twice, and it writes,
// in the caller's transaction, the order_events history row (with the next
// per-order sequence number) and the outbox event that announces the change.
package orderstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"orderpipe/shared/order"
	"orderpipe/shared/orderevent"
	"orderpipe/shared/outbox"
)

// Record writes the history row and the outbox event for an order that has
// just entered status (its row already says so) and returns the outbox row
// id, for the caller to publish right after its commit. The intake calls it
// for a new order; Transition calls it for every move.
func Record(ctx context.Context, tx pgx.Tx, orderID, clientID uuid.UUID, requestID string, status order.Status, reason string) (int64, error) {
	var seq int
	var at time.Time
	err := tx.QueryRow(ctx, `
		INSERT INTO order_events (order_id, seq, status, reason)
		SELECT $1, coalesce(max(seq), 0) + 1, $2, NULLIF($3, '') FROM order_events WHERE order_id = $1
		RETURNING seq, occurred_at`, orderID, string(status), reason).Scan(&seq, &at)
	if err != nil {
		return 0, fmt.Errorf("record %s of order %s: %w", status, orderID, err)
	}
	return outbox.Enqueue(ctx, tx, orderevent.Event{
		Version:    orderevent.Version,
		Name:       orderevent.ForStatus(status),
		OrderID:    orderID,
		ClientID:   clientID,
		RequestID:  requestID,
		Status:     status,
		Reason:     reason,
		OccurredAt: at.UTC(),
	})
}

// ErrNotFound is returned when no order has the id.
var ErrNotFound = errors.New("order not found")

// Moved says what Transition did.
type Moved struct {
	// OK is true when the order was in the expected state and moved.
	OK bool
	// Current is the order's status after the call (the new one when OK,
	// the one that stopped the move otherwise).
	Current order.Status
	// OutboxID is the event to publish after commit (when OK).
	OutboxID int64
}

// Transition moves an order from one status to another if, and only if, it
// is still in from. It locks the order row until the transaction ends. A move
// that the state machine forbids returns order.ErrInvalidTransition.
func Transition(ctx context.Context, tx pgx.Tx, id uuid.UUID, from, to order.Status, reason string) (Moved, error) {
	if err := order.CheckTransition(from, to); err != nil {
		return Moved{}, err
	}
	var clientID uuid.UUID
	var requestID string
	err := tx.QueryRow(ctx, `
		UPDATE orders SET status = $3, reason = NULLIF($4, ''), updated_at = now()
		WHERE order_id = $1 AND status = $2
		RETURNING client_id, request_id`, id, string(from), string(to), reason).Scan(&clientID, &requestID)
	if errors.Is(err, pgx.ErrNoRows) {
		var cur string
		err := tx.QueryRow(ctx, `SELECT status FROM orders WHERE order_id = $1`, id).Scan(&cur)
		if errors.Is(err, pgx.ErrNoRows) {
			return Moved{}, fmt.Errorf("move order %s: %w", id, ErrNotFound)
		}
		if err != nil {
			return Moved{}, fmt.Errorf("read status of order %s: %w", id, err)
		}
		return Moved{Current: order.Status(cur)}, nil
	}
	if err != nil {
		return Moved{}, fmt.Errorf("move order %s %s → %s: %w", id, from, to, err)
	}
	oid, err := Record(ctx, tx, id, clientID, requestID, to, reason)
	if err != nil {
		return Moved{}, err
	}
	return Moved{OK: true, Current: to, OutboxID: oid}, nil
}

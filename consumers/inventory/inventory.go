// Package inventory is the stock step: on orders.accepted it reserves every
// line of the order or none (shared/stock), and moves the order to
// reserved, or to rejected with the reason (out of stock, unknown SKU).
package inventory

import (
	"context"
	"fmt"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"orderpipe/consumers/step"
	"orderpipe/shared/order"
	"orderpipe/shared/orderevent"
	"orderpipe/shared/orderstore"
	"orderpipe/shared/stock"
)

// Name is the step's durable consumer name.
const Name = "inventory"

// Step returns the stock step.
func Step() step.Step {
	return step.TxStep(Name, []orderevent.Name{orderevent.Accepted}, func(ctx context.Context, tx pgx.Tx, m step.Message) ([]int64, error) {
		return reserve(ctx, tx, m.Event.OrderID)
	})
}

// reserve runs in the step's transaction.
func reserve(ctx context.Context, tx pgx.Tx, orderID uuid.UUID) ([]int64, error) {
	status, err := step.LockStatus(ctx, tx, orderID)
	if err != nil {
		return nil, err
	}
	if status != order.StatusProcessing {
		return nil, nil // moved on (a late or repeated message, or the compensator): nothing to do
	}
	var raw []byte
	if err := tx.QueryRow(ctx, `SELECT items FROM orders WHERE order_id = $1`, orderID).Scan(&raw); err != nil {
		return nil, fmt.Errorf("read items of order %s: %w", orderID, err)
	}
	ls, err := stock.Lines(raw)
	if err != nil {
		return nil, step.Permanent(fmt.Errorf("items of order %s: %w", orderID, err))
	}
	problems, err := stock.Reserve(ctx, tx, orderID, ls)
	if err != nil {
		return nil, err
	}
	if len(problems) > 0 {
		moved, err := orderstore.Transition(ctx, tx, orderID, order.StatusProcessing, order.StatusRejected, strings.Join(problems, "; "))
		if err != nil {
			return nil, err
		}
		return ids(moved), nil
	}
	moved, err := orderstore.Transition(ctx, tx, orderID, order.StatusProcessing, order.StatusReserved, "")
	if err != nil {
		return nil, err
	}
	return ids(moved), nil
}

func ids(m orderstore.Moved) []int64 {
	if !m.OK {
		return nil
	}
	return []int64{m.OutboxID}
}

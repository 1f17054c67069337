// Package confirm is the last step of the happy path: on orders.paid it
// moves the order to confirmed, its successful terminal state.
package confirm

import (
	"context"

	"github.com/jackc/pgx/v5"

	"orderpipe/consumers/step"
	"orderpipe/shared/order"
	"orderpipe/shared/orderevent"
	"orderpipe/shared/orderstore"
)

// Name is the step's durable consumer name.
const Name = "confirm"

// Step returns the confirmation step.
func Step() step.Step {
	return step.TxStep(Name, []orderevent.Name{orderevent.Paid}, func(ctx context.Context, tx pgx.Tx, m step.Message) ([]int64, error) {
		st, err := step.LockStatus(ctx, tx, m.Event.OrderID)
		if err != nil || st != order.StatusPaid {
			return nil, err // moved on already: nothing to do
		}
		moved, err := orderstore.Transition(ctx, tx, m.Event.OrderID, order.StatusPaid, order.StatusConfirmed, "")
		if err != nil || !moved.OK {
			return nil, err
		}
		return []int64{moved.OutboxID}, nil
	})
}

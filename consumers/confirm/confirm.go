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
	"orderpipe/shared/outbox"
)

// Name is the step's durable consumer name.
const Name = "confirm"

// Step returns the confirmation step.
func Step() step.Step {
	return step.BatchStep(Name, []orderevent.Name{orderevent.Paid}, func(ctx context.Context, tx pgx.Tx, ms []step.Message) ([]outbox.Row, error) {
		ms = step.FirstPerOrder(ms)
		moves := make([]orderstore.Move, len(ms))
		for i, m := range ms {
			// Conditional: an order that moved on already stays as it is.
			moves[i] = orderstore.Move{Ctx: m.Ctx, ID: m.Event.OrderID, From: order.StatusPaid, To: order.StatusConfirmed}
		}
		return step.Published(orderstore.TransitionMany(ctx, tx, moves))
	})
}

// Package inventory is the stock step: on orders.accepted it reserves every
// line of the order or none (shared/stock), and moves the order to
// reserved, or to rejected with the reason (out of stock, unknown SKU).
package inventory

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"orderpipe/consumers/step"
	"orderpipe/shared/order"
	"orderpipe/shared/orderevent"
	"orderpipe/shared/orderstore"
	"orderpipe/shared/outbox"
	"orderpipe/shared/stock"
)

// Name is the step's durable consumer name.
const Name = "inventory"

// Step returns the stock step.
func Step() step.Step {
	return step.BatchStep(Name, []orderevent.Name{orderevent.Accepted}, reserve)
}

// reserve runs in the step's transaction, for a batch of messages: it
// locks their orders (in id order), reserves the stock of those still
// processing (stock.ReserveMany, in the order the messages came) and moves
// each to reserved, or to rejected with the reason. An order that moved on
// (a late or repeated message, or the compensator) is left alone.
func reserve(ctx context.Context, tx pgx.Tx, ms []step.Message) ([]outbox.Row, error) {
	ms = step.FirstPerOrder(ms)
	got, err := step.LockOrders(ctx, tx, ms)
	if err != nil {
		return nil, err
	}
	var wants []stock.Want
	var todo []step.Message
	for _, m := range ms {
		l := got[m.Event.OrderID]
		if l.Status != order.StatusProcessing {
			continue
		}
		ls, err := stock.Lines(l.Items)
		if err != nil {
			return nil, step.Permanent(fmt.Errorf("items of order %s: %w", m.Event.OrderID, err))
		}
		wants, todo = append(wants, stock.Want{OrderID: m.Event.OrderID, Lines: ls}), append(todo, m)
	}
	if len(todo) == 0 {
		return nil, nil
	}
	problems, err := stock.ReserveMany(ctx, tx, wants)
	if err != nil {
		return nil, err
	}
	moves := make([]orderstore.Move, len(todo))
	for i, m := range todo {
		moves[i] = orderstore.Move{Ctx: m.Ctx, ID: m.Event.OrderID, From: order.StatusProcessing, To: order.StatusReserved}
		if len(problems[i]) > 0 {
			moves[i].To, moves[i].Reason = order.StatusRejected, strings.Join(problems[i], "; ")
		}
	}
	return step.Published(orderstore.TransitionMany(ctx, tx, moves))
}

package notify

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"orderpipe/consumers/step"
	"orderpipe/shared/orderstore"
	"orderpipe/shared/postgres"
)

// Step returns the notifier step for the consumers' router: on every status
// event, Apply in the transaction of the step's dedupe row. It publishes
// nothing. An event without its history row is permanent (dead-lettered),
// like an unknown order.
//
// An order without a callback URL gets no webhook, ever: the URL is set
// when the order is created and never changes. Its events are acked after
// one read on db, with no transaction and no dedupe row, since there is no
// effect to do once (most orders of a shop that polls or streams have none,
// and each would otherwise cost a commit per status change).
func Step(db postgres.DB) step.Step {
	return step.Step{Name: Name, Events: Events(), Handle: func(ctx context.Context, m step.Message, commit step.Commit) error {
		o, err := orderstore.Get(ctx, db, m.Event.ClientID, m.Event.OrderID)
		if err != nil {
			return fmt.Errorf("notify %s of order %s: %w", m.Event.Name, m.Event.OrderID, err)
		}
		if o.CallbackURL == "" {
			return nil
		}
		// The order as read above, not read again in the transaction: the
		// change itself comes from the history there, and the rest is
		// fixed at creation but for updated_at, which either read takes
		// after the change committed.
		_, err = commit(ctx, func(ctx context.Context, tx pgx.Tx) ([]int64, error) {
			_, err := applyTo(ctx, tx, o, m.Event)
			if errors.Is(err, ErrNoHistory) {
				return nil, step.Permanent(err)
			}
			return nil, err
		})
		return err
	}}
}

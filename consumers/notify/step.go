package notify

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"orderpipe/consumers/step"
)

// Step returns the notifier step for the consumers' router: on every status
// event, Apply in the transaction of the step's dedupe row. It publishes
// nothing. An event without its history row is permanent (dead-lettered),
// like an unknown order.
func Step() step.Step {
	return step.TxStep(Name, Events(), func(ctx context.Context, tx pgx.Tx, m step.Message) ([]int64, error) {
		_, err := Apply(ctx, tx, m.Event)
		if errors.Is(err, ErrNoHistory) {
			return nil, step.Permanent(err)
		}
		return nil, err
	})
}

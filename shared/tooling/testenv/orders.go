package testenv

import (
	"context"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"orderpipe/shared/order"
	"orderpipe/shared/orderstore"
)

// Move commits the status change of order id from from to to (with the
// reason a terminal state carries, or "") in a transaction of its own, as a
// consumer in another process would, and returns its error (the caller
// decides whether that ends the test).
func Move(ctx context.Context, pool *pgxpool.Pool, id uuid.UUID, from, to order.Status, reason string) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := orderstore.Transition(ctx, tx, id, from, to, reason)
		return err
	})
}

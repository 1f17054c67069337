package orderstore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"orderpipe/shared/order"
	"orderpipe/shared/postgres"
)

// Constraint names the intake matches on (migrations/00001_init.sql).
const (
	ConstraintOrderRequest = "uk_order_request"
	ConstraintOrderNo      = "uk_order_no"
)

// InsertOptions tune Insert; the zero value is the production setting.
type InsertOptions struct {
	// NewOrderNo generates order numbers; default order.NewOrderNo. Tests
	// replace it to force a collision.
	NewOrderNo func(time.Time) string
	// MaxOrderNoAttempts bounds the retries on a uk_order_no collision;
	// default 5.
	MaxOrderNoAttempts int
}

// Inserted is what Insert did.
type Inserted struct {
	// Order is the new order, or the existing one on a replay.
	Order order.Order
	// Replayed is true when the (client, request_id) existed with the same
	// fingerprint: nothing was written.
	Replayed bool
	// OutboxID is the accepted event to publish after the commit (0 on a
	// replay).
	OutboxID int64
	// OrderNoCollisions counts the order numbers that collided and were
	// replaced; the caller counts them in a metric.
	OrderNoCollisions int
	// RequestIDConflict is true when a concurrent insert of the same key
	// won the race and this one was answered from its row.
	RequestIDConflict bool
}

const orderColumns = `order_id, order_no, client_id, request_id, fingerprint, status, user_id, items, amount::text, currency,
	coalesce(callback_url, ''), coalesce(reason, ''), created_at, updated_at`

// Insert stores a new order for a client, in status processing, with its
// history row and its accepted event in the outbox, in one transaction. When
// the client's request_id is already taken it returns the existing order
// (Replayed) if the fingerprints match, and order.ErrRequestIDReused (with
// nothing changed) if they do not. The unique constraint uk_order_request
// decides under concurrency; a fast path reads first so that a replay costs
// one query.
func Insert(ctx context.Context, pool *pgxpool.Pool, clientID uuid.UUID, req order.CreateRequest, opts InsertOptions) (Inserted, error) {
	if opts.NewOrderNo == nil {
		opts.NewOrderNo = order.NewOrderNo
	}
	if opts.MaxOrderNoAttempts <= 0 {
		opts.MaxOrderNoAttempts = 5
	}
	fp := req.Fingerprint()
	existing, err := GetByRequestID(ctx, pool, clientID, req.RequestID)
	switch {
	case err == nil:
		return Replay(existing, fp)
	case !errors.Is(err, ErrNotFound):
		return Inserted{}, err
	}
	items, err := json.Marshal(req.Items)
	if err != nil {
		return Inserted{}, fmt.Errorf("encode items: %w", err)
	}
	var res Inserted
	for attempt := 1; ; attempt++ {
		id, err := uuid.NewV7()
		if err != nil {
			return Inserted{}, fmt.Errorf("new order id: %w", err)
		}
		o := order.Order{ID: id, No: opts.NewOrderNo(time.Now()), RequestID: req.RequestID, Status: order.StatusProcessing,
			UserID: req.UserID, Items: req.Items, Amount: req.Amount, Currency: req.Currency,
			ClientID: clientID, CallbackURL: req.CallbackURL, Fingerprint: fp}
		err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			err := tx.QueryRow(ctx, `
				INSERT INTO orders (order_id, order_no, client_id, request_id, fingerprint, status, user_id, items, amount, currency, callback_url)
				VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9::numeric, $10, NULLIF($11, ''))
				RETURNING created_at, updated_at`,
				o.ID, o.No, clientID, o.RequestID, fp, string(o.Status), o.UserID, items, o.Amount.String(), o.Currency, o.CallbackURL,
			).Scan(&o.CreatedAt, &o.UpdatedAt)
			if err != nil {
				return err
			}
			res.OutboxID, err = Record(ctx, tx, o.ID, clientID, o.RequestID, order.StatusProcessing, "")
			return err
		})
		switch {
		case err == nil:
			res.Order = o
			return res, nil
		case postgres.IsUniqueViolation(err, ConstraintOrderRequest):
			// A concurrent request with the same key committed first.
			existing, gerr := GetByRequestID(ctx, pool, clientID, req.RequestID)
			if gerr != nil {
				return Inserted{}, fmt.Errorf("read order of request %s after a duplicate insert: %w", req.RequestID, gerr)
			}
			r, err := Replay(existing, fp)
			r.OrderNoCollisions, r.RequestIDConflict = res.OrderNoCollisions, true
			return r, err
		case postgres.IsUniqueViolation(err, ConstraintOrderNo) && attempt < opts.MaxOrderNoAttempts:
			res.OrderNoCollisions++
			continue
		default:
			return Inserted{}, fmt.Errorf("insert order of request %s: %w", req.RequestID, err)
		}
	}
}

// Replay answers a create request whose (client, request_id) is taken by
// existing, a request with fingerprint fp: the order (Replayed) when the
// fingerprints match, order.ErrRequestIDReused when they do not.
func Replay(existing order.Order, fp []byte) (Inserted, error) {
	if !bytes.Equal(existing.Fingerprint, fp) {
		return Inserted{Order: existing}, fmt.Errorf("request %s (order %s): %w", existing.RequestID, existing.ID, order.ErrRequestIDReused)
	}
	return Inserted{Order: existing, Replayed: true}, nil
}

// Get returns a client's order by id; ErrNotFound when it does not exist
// or belongs to another client. The row is read by its primary key alone
// and its client checked here: with "client_id = $1" in the statement, a
// plan PostgreSQL cached while orders was nearly empty (see postgres.DB)
// walked the (client_id, request_id) index over every order of the
// client, which for one busy client is every order.
func Get(ctx context.Context, q postgres.DB, clientID, orderID uuid.UUID) (order.Order, error) {
	o, err := scanOrder(q.QueryRow(ctx, `SELECT `+orderColumns+` FROM orders WHERE order_id = $1`, orderID))
	if err == nil && o.ClientID != clientID {
		err = ErrNotFound
	}
	if err != nil {
		return order.Order{}, fmt.Errorf("get order %s: %w", orderID, err)
	}
	return o, nil
}

// GetByRequestID returns a client's order by request_id; ErrNotFound when
// the client has none with it.
func GetByRequestID(ctx context.Context, q postgres.DB, clientID uuid.UUID, requestID string) (order.Order, error) {
	o, err := scanOrder(q.QueryRow(ctx, `SELECT `+orderColumns+` FROM orders WHERE client_id = $1 AND request_id = $2`, clientID, requestID))
	if err != nil {
		return order.Order{}, fmt.Errorf("get order of request %s: %w", requestID, err)
	}
	return o, nil
}

func scanOrder(row pgx.Row) (order.Order, error) {
	var o order.Order
	var status, amount string
	var items []byte
	err := row.Scan(&o.ID, &o.No, &o.ClientID, &o.RequestID, &o.Fingerprint, &status, &o.UserID, &items, &amount,
		&o.Currency, &o.CallbackURL, &o.Reason, &o.CreatedAt, &o.UpdatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return order.Order{}, ErrNotFound
	}
	if err != nil {
		return order.Order{}, err
	}
	o.Status = order.Status(status)
	if err := json.Unmarshal(items, &o.Items); err != nil {
		return order.Order{}, fmt.Errorf("decode items of order %s: %w", o.ID, err)
	}
	if o.Amount, err = order.ParseAmount(amount); err != nil {
		return order.Order{}, fmt.Errorf("decode amount %q of order %s: %w", amount, o.ID, err)
	}
	o.CreatedAt, o.UpdatedAt = o.CreatedAt.UTC(), o.UpdatedAt.UTC()
	return o, nil
}

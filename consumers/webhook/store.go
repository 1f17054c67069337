package webhook

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"orderpipe/shared/postgres"
	"orderpipe/shared/tracing"
)

// NewDelivery is what the notifier stores for one status change.
type NewDelivery struct {
	OrderID  uuid.UUID
	Seq      int
	ClientID uuid.UUID
	URL      string
	// Payload is the JSON body, sent unchanged on every attempt.
	Payload []byte
	// RequestID of the order, for the logs.
	RequestID string
}

// ErrNotFound is returned for an unknown webhook id.
var ErrNotFound = errors.New("webhook delivery not found")

// Enqueue stores a delivery, due now, in the caller's transaction. A
// delivery of the same (order, seq) that already exists is left as it is;
// the result says whether a row was inserted.
func Enqueue(ctx context.Context, tx postgres.DB, d NewDelivery) (bool, error) {
	id := ID(d.OrderID, d.Seq)
	trace := map[string]string{}
	tracing.Inject(ctx, trace) // the delivery continues the change's trace
	tag, err := tx.Exec(ctx, `
		INSERT INTO webhook_deliveries (webhook_id, order_id, seq, client_id, url, payload, request_id, trace_context)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
		ON CONFLICT (webhook_id) DO NOTHING`,
		id, d.OrderID, d.Seq, d.ClientID, d.URL, string(d.Payload), d.RequestID, trace)
	if err != nil {
		return false, fmt.Errorf("enqueue webhook %s of order %s: %w", id, d.OrderID, err)
	}
	return tag.RowsAffected() == 1, nil
}

const deliveryColumns = `webhook_id, order_id, seq, client_id, url, payload, status, attempts,
	next_attempt_at, last_status_code, last_error, last_latency_ms, created_at, delivered_at`

func scanDelivery(row pgx.Row) (Delivery, error) {
	var d Delivery
	var payload []byte
	var status string
	err := row.Scan(&d.WebhookID, &d.OrderID, &d.Seq, &d.ClientID, &d.URL, &payload, &status, &d.Attempts,
		&d.NextAttemptAt, &d.LastStatusCode, &d.LastError, &d.LastLatencyMS, &d.CreatedAt, &d.DeliveredAt)
	d.Payload = payload
	d.Status = Status(status)
	return d, err
}

// notFound returns ErrNotFound in place of pgx.ErrNoRows (no delivery has
// the webhook id asked for) and any other error as it is.
func notFound(err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrNotFound
	}
	return err
}

// Get returns one delivery (without its attempt history).
func Get(ctx context.Context, q postgres.DB, webhookID string) (Delivery, error) {
	d, err := scanDelivery(q.QueryRow(ctx, `SELECT `+deliveryColumns+` FROM webhook_deliveries WHERE webhook_id = $1`, webhookID))
	if err != nil {
		return Delivery{}, fmt.Errorf("get webhook %s: %w", webhookID, notFound(err))
	}
	return d, nil
}

// List returns an order's deliveries in seq order, each with its attempts.
func List(ctx context.Context, q postgres.DB, orderID uuid.UUID) ([]Delivery, error) {
	rows, err := q.Query(ctx, `SELECT `+deliveryColumns+` FROM webhook_deliveries WHERE order_id = $1 ORDER BY seq`, orderID)
	if err != nil {
		return nil, fmt.Errorf("list webhooks of order %s: %w", orderID, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Delivery, error) { return scanDelivery(r) })
	if err != nil {
		return nil, fmt.Errorf("list webhooks of order %s: %w", orderID, err)
	}
	for i := range out {
		out[i].History, err = attempts(ctx, q, out[i].WebhookID)
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

func attempts(ctx context.Context, q postgres.DB, webhookID string) ([]Attempt, error) {
	rows, err := q.Query(ctx, `
		SELECT attempt, attempted_at, status_code, latency_ms, error
		FROM webhook_attempts WHERE webhook_id = $1 ORDER BY id`, webhookID)
	if err != nil {
		return nil, fmt.Errorf("list attempts of webhook %s: %w", webhookID, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Attempt, error) {
		var a Attempt
		err := r.Scan(&a.Attempt, &a.AttemptedAt, &a.StatusCode, &a.LatencyMS, &a.Error)
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("list attempts of webhook %s: %w", webhookID, err)
	}
	return out, nil
}

// Resend puts a delivery (delivered, failed or pending) back to pending,
// due now, with its attempt count reset and the same webhook id and body.
// Its attempt history is kept. A send of it still in flight records
// nothing when it ends (its lease token is cleared).
func Resend(ctx context.Context, q postgres.DB, webhookID string) (Delivery, error) {
	d, err := scanDelivery(q.QueryRow(ctx, `
		UPDATE webhook_deliveries
		SET status = 'pending', attempts = 0, next_attempt_at = now(), delivered_at = NULL,
			lease_token = NULL -- fences the outcome of a send in flight
		WHERE webhook_id = $1
		RETURNING `+deliveryColumns, webhookID))
	if err != nil {
		return Delivery{}, fmt.Errorf("resend webhook %s: %w", webhookID, notFound(err))
	}
	return d, nil
}

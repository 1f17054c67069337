// Package notify is the notifier step: for every status event of an order
// (accepted … cancelled) it stores a webhook delivery to the order's
// callback_url, in the same transaction as the step's processed_messages
// dedupe row. The consumers/webhook worker sends it.
//
// A status event is published from the outbox only after the change it
// announces committed, so a delivery row, and therefore a webhook, never
// exists for a change that is not committed. The delivery's webhook_id is
// derived from (order_id, seq) and inserted with ON CONFLICT DO NOTHING, so
// a redelivered event, a republish or a compensator re-drive (a new message
// id, hence a new dedupe row) never produces a second webhook with a new id.
package notify

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"orderpipe/consumers/webhook"
	"orderpipe/shared/order"
	"orderpipe/shared/orderevent"
	"orderpipe/shared/orderstore"
)

// Name is the step's name: its durable consumer and its processed_messages
// consumer column.
const Name = "notify"

// Events are the events the notifier reads: every status change.
func Events() []orderevent.Name { return orderevent.Names() }

// StatusChange is the "data" of a callback: the order as of the change
// (status and reason are the change's), with the change's sequence number
// and time. The same shape is each live stream (SSE) event's data.
type StatusChange struct {
	order.Order
	// Seq is the change's per-order sequence number (order_events.seq).
	Seq int `json:"seq"`
	// OccurredAt is when the change committed.
	OccurredAt time.Time `json:"occurred_at"`
}

// ErrNoHistory is returned when an event has no order_events row: the event
// did not come from orderstore (which writes both in one transaction).
var ErrNoHistory = errors.New("status event without its history row")

// Apply stores the webhook delivery of ev in tx, when the order has a
// callback_url, and reports whether a new delivery row was written. It also
// stores the delivery of every earlier change of the order that has none:
// the broker lost that change's event (a stream deleted, a store lost)
// after the order moved on, and the client must still hear of every
// status. The caller's transaction also holds the dedupe row. A missing
// order wraps orderstore.ErrNotFound; a missing history row wraps
// ErrNoHistory (both permanent).
func Apply(ctx context.Context, tx pgx.Tx, ev orderevent.Event) (bool, error) {
	o, err := orderstore.Get(ctx, tx, ev.ClientID, ev.OrderID)
	if err != nil {
		return false, fmt.Errorf("notify %s of order %s: %w", ev.Name, ev.OrderID, err)
	}
	return applyTo(ctx, tx, o, ev)
}

// applyTo is Apply for the order o, already read.
func applyTo(ctx context.Context, tx pgx.Tx, o order.Order, ev orderevent.Event) (bool, error) {
	if o.CallbackURL == "" {
		return false, nil
	}
	ch, err := change(ctx, tx, o, ev)
	if err != nil {
		return false, err
	}
	missed, err := missedChanges(ctx, tx, o, ch.Seq)
	if err != nil {
		return false, err
	}
	for _, m := range missed {
		if _, err := enqueue(ctx, tx, o, m); err != nil {
			return false, err
		}
	}
	return enqueue(ctx, tx, o, ch)
}

func enqueue(ctx context.Context, tx pgx.Tx, o order.Order, ch StatusChange) (bool, error) {
	data, err := json.Marshal(ch)
	if err != nil {
		return false, fmt.Errorf("encode webhook of order %s: %w", o.ID, err)
	}
	body, err := json.Marshal(webhook.Payload{Type: webhook.EventType, Timestamp: ch.OccurredAt, Data: data})
	if err != nil {
		return false, fmt.Errorf("encode webhook of order %s: %w", o.ID, err)
	}
	return webhook.Enqueue(ctx, tx, webhook.NewDelivery{
		OrderID: o.ID, Seq: ch.Seq, ClientID: o.ClientID, URL: o.CallbackURL, Payload: body, RequestID: o.RequestID,
	})
}

// missedChanges returns the order's changes before seq that have no
// webhook delivery.
func missedChanges(ctx context.Context, tx pgx.Tx, o order.Order, seq int) ([]StatusChange, error) {
	rows, err := tx.Query(ctx, `
		SELECT e.seq, e.status, coalesce(e.reason, ''), e.occurred_at FROM order_events e
		WHERE e.order_id = $1 AND e.seq < $2
		  AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.order_id = e.order_id AND d.seq = e.seq)
		ORDER BY e.seq`, o.ID, seq)
	if err != nil {
		return nil, fmt.Errorf("read missed changes of order %s: %w", o.ID, err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (StatusChange, error) {
		ch := StatusChange{Order: o}
		var status string
		err := r.Scan(&ch.Seq, &status, &ch.Reason, &ch.OccurredAt)
		ch.Status, ch.OccurredAt = order.Status(status), ch.OccurredAt.UTC()
		return ch, err
	})
}

// change finds the history row of the status the event announces (an
// order enters each status at most once).
func change(ctx context.Context, tx pgx.Tx, o order.Order, ev orderevent.Event) (StatusChange, error) {
	ch := StatusChange{Order: o}
	err := tx.QueryRow(ctx, `
		SELECT seq, coalesce(reason, ''), occurred_at FROM order_events
		WHERE order_id = $1 AND status = $2 ORDER BY seq LIMIT 1`, ev.OrderID, string(ev.Status)).
		Scan(&ch.Seq, &ch.Reason, &ch.OccurredAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return ch, fmt.Errorf("notify %s of order %s: %w", ev.Name, ev.OrderID, ErrNoHistory)
	}
	if err != nil {
		return ch, fmt.Errorf("read history of order %s: %w", ev.OrderID, err)
	}
	ch.Status = ev.Status
	ch.OccurredAt = ch.OccurredAt.UTC()
	return ch, nil
}

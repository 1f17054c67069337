// Package webhook delivers order status changes to clients' callback URLs,
// signed as Standard Webhooks with the client's whsec_ secret.
//
// A delivery is a row in webhook_deliveries, written by the notifier in the
// transaction of its dedupe row, after the status change it reports was
// committed. Its webhook_id is derived from (order_id, seq), so a
// redelivered or re-driven event, a retry and a manual resend all carry the
// same webhook-id and a receiver can deduplicate on it.
//
// The Worker claims due rows (FOR UPDATE SKIP LOCKED, in small batches, any
// number of replicas), sends them with bounded concurrency overall and per
// client through an SSRF-safe client (NewClient), records every attempt
// and retries on Schedule, then marks the delivery failed.
package webhook

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

// Status is where a delivery is.
type Status string

const (
	// StatusPending: not delivered yet; the worker sends it at
	// next_attempt_at.
	StatusPending Status = "pending"
	// StatusDelivered: the receiver answered 2xx.
	StatusDelivered Status = "delivered"
	// StatusFailed: every attempt of Schedule failed; `orderpipe webhooks
	// resend` puts it back to pending.
	StatusFailed Status = "failed"
)

// EventType is the Standard Webhooks "type" of every orderpipe callback.
const EventType = "order.status_changed"

// DefaultSchedule is the wait before each retry after a failed attempt: ten
// attempts over about 15h45m, then the delivery is failed.
var DefaultSchedule = []time.Duration{
	5 * time.Second,
	30 * time.Second,
	2 * time.Minute,
	10 * time.Minute,
	30 * time.Minute,
	time.Hour,
	2 * time.Hour,
	4 * time.Hour,
	8 * time.Hour,
}

// ID returns the webhook-id of an order's status change number seq. It is
// the same for every retry, redelivery and resend of that change.
func ID(orderID uuid.UUID, seq int) string {
	return "msg_" + strings.ReplaceAll(orderID.String(), "-", "") + "_" + strconv.Itoa(seq)
}

// ErrMalformedID is returned by ParseID.
var ErrMalformedID = errors.New("malformed webhook id: want msg_<32 hex>_<seq>")

// ParseID checks a webhook id given on a command line and returns its parts.
func ParseID(s string) (uuid.UUID, int, error) {
	rest, ok := strings.CutPrefix(s, "msg_")
	if !ok || len(rest) < 34 || rest[32] != '_' {
		return uuid.Nil, 0, ErrMalformedID
	}
	id, err := uuid.Parse(rest[:32])
	if err != nil {
		return uuid.Nil, 0, ErrMalformedID
	}
	seq, err := strconv.Atoi(rest[33:])
	if err != nil || seq <= 0 || ID(id, seq) != s {
		return uuid.Nil, 0, ErrMalformedID
	}
	return id, seq, nil
}

// Payload is the JSON body of a callback (Standard Webhooks' recommended
// shape: type, timestamp, data).
type Payload struct {
	// Type is EventType.
	Type string `json:"type"`
	// Timestamp is when the status change happened (not when it was sent).
	Timestamp time.Time `json:"timestamp"`
	// Data is the order as of the change, with its seq.
	Data json.RawMessage `json:"data"`
}

// Delivery is one row of webhook_deliveries.
type Delivery struct {
	WebhookID      string          `json:"webhook_id"`
	OrderID        uuid.UUID       `json:"order_id"`
	Seq            int             `json:"seq"`
	ClientID       uuid.UUID       `json:"client_id"`
	URL            string          `json:"url"`
	Payload        json.RawMessage `json:"payload"`
	Status         Status          `json:"status"`
	Attempts       int             `json:"attempts"`
	NextAttemptAt  time.Time       `json:"next_attempt_at"`
	LastStatusCode *int            `json:"last_status_code,omitempty"`
	LastError      *string         `json:"last_error,omitempty"`
	LastLatencyMS  *int            `json:"last_latency_ms,omitempty"`
	CreatedAt      time.Time       `json:"created_at"`
	DeliveredAt    *time.Time      `json:"delivered_at,omitempty"`
	// History is every recorded attempt, oldest first (List fills it).
	History []Attempt `json:"history,omitempty"`
}

// Attempt is one row of webhook_attempts.
type Attempt struct {
	Attempt     int       `json:"attempt"`
	AttemptedAt time.Time `json:"attempted_at"`
	StatusCode  *int      `json:"status_code,omitempty"`
	LatencyMS   int       `json:"latency_ms"`
	Error       *string   `json:"error,omitempty"`
}

// Signer signs bodies with one client's secret.
type Signer struct{ wh *standardwebhooks.Webhook }

// NewSigner returns a signer for a whsec_… secret.
func NewSigner(secret string) (*Signer, error) {
	if !strings.HasPrefix(secret, "whsec_") {
		return nil, errors.New("webhook secret must start with whsec_")
	}
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		return nil, fmt.Errorf("load webhook secret: %w", err)
	}
	return &Signer{wh: wh}, nil
}

// Sign returns the webhook-signature header value for (id, ts, body).
func (s *Signer) Sign(id string, ts time.Time, body []byte) (string, error) {
	sig, err := s.wh.Sign(id, ts, body)
	if err != nil {
		return "", fmt.Errorf("sign webhook %s: %w", id, err)
	}
	return sig, nil
}

// Header names of a signed callback.
const (
	HeaderID        = standardwebhooks.HeaderWebhookID
	HeaderTimestamp = standardwebhooks.HeaderWebhookTimestamp
	HeaderSignature = standardwebhooks.HeaderWebhookSignature
)

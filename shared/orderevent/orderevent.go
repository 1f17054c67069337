// Package orderevent is the wire contract of the ORDERS stream: event names,
// subjects, deterministic message ids, headers and the JSON payload.
//
// Every status change of an order produces one event named after the new
// status ("accepted" stands for the order entering processing). A message's
// Nats-Msg-Id is derived from (order, event), so a republish inside the
// stream's duplicate window is dropped by JetStream and one outside it is
// dropped by the consumer's processed_messages row.
package orderevent

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"

	"orderpipe/shared/order"
)

// Name names an event. Its subject is "<prefix>.<name>".
type Name string

const (
	// Accepted: the intake stored a new order (status processing).
	Accepted Name = "accepted"
	// Reserved: stock was reserved for every line.
	Reserved Name = "reserved"
	// Paid: the payment provider charged the order.
	Paid Name = "paid"
	// Confirmed: the order reached its successful terminal state.
	Confirmed Name = "confirmed"
	// Rejected: the order could not be taken (e.g. out of stock).
	Rejected Name = "rejected"
	// Cancelled: the order was unwound.
	Cancelled Name = "cancelled"
)

// Names lists every event name.
func Names() []Name {
	return []Name{Accepted, Reserved, Paid, Confirmed, Rejected, Cancelled}
}

// ForStatus returns the event that announces an order entering status s.
func ForStatus(s order.Status) Name {
	if s == order.StatusProcessing {
		return Accepted
	}
	return Name(s)
}

// Status returns the order status that the event announces.
func (n Name) Status() order.Status {
	if n == Accepted {
		return order.StatusProcessing
	}
	return order.Status(n)
}

// Valid reports whether n is one of Names.
func (n Name) Valid() bool {
	for _, v := range Names() {
		if n == v {
			return true
		}
	}
	return false
}

// Version is the payload version this build writes and understands.
const Version = 1

// Header names carried by every message besides Nats-Msg-Id.
const (
	HeaderMsgID     = "Nats-Msg-Id"
	HeaderRequestID = "Orderpipe-Request-Id"
	HeaderOrderID   = "Orderpipe-Order-Id"
	HeaderClientID  = "Orderpipe-Client-Id"
	HeaderEvent     = "Orderpipe-Event"
	// HeaderReplayOf is set on a dead-letter replay only: the dead
	// letter's id.
	HeaderReplayOf = "Orderpipe-Replay-Of"
)

// Event is the JSON payload of every message on the ORDERS stream. The
// order row in PostgreSQL is the record; the event says what changed so
// that a handler knows which step to run.
type Event struct {
	Version    int          `json:"version"`
	Name       Name         `json:"event"`
	OrderID    uuid.UUID    `json:"order_id"`
	ClientID   uuid.UUID    `json:"client_id"`
	RequestID  string       `json:"request_id"`
	Status     order.Status `json:"status"`
	Reason     string       `json:"reason,omitempty"`
	OccurredAt time.Time    `json:"occurred_at"`
	// Redrive is 0 for the first emission and n for the compensator's
	// n-th re-drive of the same event; it is part of the message id so
	// that a re-drive is not swallowed by the duplicate window.
	Redrive int `json:"redrive,omitempty"`
}

// MsgID is the deterministic message id of the event: the same event of the
// same order always gets the same id; a re-drive gets its own.
func (e Event) MsgID() string {
	return MsgID(e.OrderID, e.Name, e.Redrive)
}

// MsgID returns the deterministic message id of (order, event, re-drive).
func MsgID(orderID uuid.UUID, name Name, redrive int) string {
	if redrive == 0 {
		return orderID.String() + ":" + string(name)
	}
	return orderID.String() + ":" + string(name) + ":r" + strconv.Itoa(redrive)
}

// ErrMalformed marks a payload that can never be processed (bad JSON,
// unknown version or event, missing ids). Handlers treat it as permanent.
var ErrMalformed = errors.New("malformed order event")

// Encode returns the JSON payload of e.
func Encode(e Event) ([]byte, error) {
	if err := e.validate(); err != nil {
		return nil, err
	}
	return json.Marshal(e)
}

// Decode parses and validates a payload. Every failure wraps ErrMalformed.
func Decode(b []byte) (Event, error) {
	var e Event
	if err := json.Unmarshal(b, &e); err != nil {
		return Event{}, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	if err := e.validate(); err != nil {
		return Event{}, err
	}
	return e, nil
}

func (e Event) validate() error {
	switch {
	case e.Version != Version:
		return fmt.Errorf("%w: unknown version %d", ErrMalformed, e.Version)
	case !e.Name.Valid():
		return fmt.Errorf("%w: unknown event %q", ErrMalformed, e.Name)
	case e.OrderID == uuid.Nil:
		return fmt.Errorf("%w: missing order_id", ErrMalformed)
	case e.ClientID == uuid.Nil:
		return fmt.Errorf("%w: missing client_id", ErrMalformed)
	case order.ValidateRequestID(e.RequestID) != nil:
		return fmt.Errorf("%w: bad request_id", ErrMalformed)
	case !e.Status.Valid():
		return fmt.Errorf("%w: unknown status %q", ErrMalformed, e.Status)
	case e.Redrive < 0:
		return fmt.Errorf("%w: negative redrive", ErrMalformed)
	}
	return nil
}

// Headers returns the message headers of e (besides the trace context,
// which the transport adds).
func (e Event) Headers() map[string]string {
	// Room for the trace context that the outbox adds (tracing.Inject).
	h := make(map[string]string, 8)
	h[HeaderMsgID] = e.MsgID()
	h[HeaderRequestID] = e.RequestID
	h[HeaderOrderID] = e.OrderID.String()
	h[HeaderClientID] = e.ClientID.String()
	h[HeaderEvent] = string(e.Name)
	return h
}

// Topology names the stream and subjects. Production uses DefaultTopology;
// tests use one per test so that they can share one NATS server.
type Topology struct {
	// Stream is the JetStream stream name.
	Stream string
	// Prefix is the first subject token: subjects are "<Prefix>.<event>".
	Prefix string
}

// DefaultTopology is stream ORDERS with subjects orders.<event>.
var DefaultTopology = Topology{Stream: "ORDERS", Prefix: "orders"}

// Subject returns the subject of an event name.
func (t Topology) Subject(n Name) string { return t.Prefix + "." + string(n) }

// AllSubjects returns the wildcard that the stream captures.
func (t Topology) AllSubjects() string { return t.Prefix + ".>" }

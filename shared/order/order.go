// Package order holds orderpipe's domain: the order, its states and the
// rules that every entry point (HTTP, MCP, messages) applies to it. It imports
// no database, broker or router package.
package order

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
)

// Status is where an order is in its life. The database mirrors this list
// with a CHECK constraint on orders.status.
type Status string

const (
	// StatusProcessing is the state of an accepted order before stock is
	// reserved. The intake stores every new order in this state.
	StatusProcessing Status = "processing"

	// StatusReserved means stock for every line has been reserved and the
	// payment is next.
	StatusReserved Status = "reserved"

	// StatusPaid means the payment provider charged the order; confirmation
	// is next.
	StatusPaid Status = "paid"

	// StatusConfirmed is terminal: the order went through.
	StatusConfirmed Status = "confirmed"

	// StatusRejected is terminal: the order could not be taken (for example
	// out of stock); nothing was charged.
	StatusRejected Status = "rejected"

	// StatusCancelled is terminal: the order was unwound (payment declined,
	// or the compensator gave up), with whatever was done undone.
	StatusCancelled Status = "cancelled"
)

// Statuses lists every status in the order of the happy path, then the
// other terminal states.
func Statuses() []Status {
	return []Status{StatusProcessing, StatusReserved, StatusPaid, StatusConfirmed, StatusRejected, StatusCancelled}
}

// Terminal reports whether no transition leaves s.
func (s Status) Terminal() bool {
	return s == StatusConfirmed || s == StatusRejected || s == StatusCancelled
}

// Valid reports whether s is one of Statuses.
func (s Status) Valid() bool {
	for _, v := range Statuses() {
		if s == v {
			return true
		}
	}
	return false
}

// transitions lists the allowed moves: from → set of to.
var transitions = map[Status][]Status{
	StatusProcessing: {StatusReserved, StatusRejected, StatusCancelled},
	StatusReserved:   {StatusPaid, StatusCancelled},
	StatusPaid:       {StatusConfirmed, StatusCancelled},
}

// CanMove reports whether an order may go from one status to another.
func CanMove(from, to Status) bool {
	for _, s := range transitions[from] {
		if s == to {
			return true
		}
	}
	return false
}

// ErrInvalidTransition is returned when a move is not in the state machine.
var ErrInvalidTransition = errors.New("invalid status transition")

// CheckTransition returns ErrInvalidTransition (wrapped with the two states)
// when an order may not go from one status to the other.
func CheckTransition(from, to Status) error {
	if !CanMove(from, to) {
		return fmt.Errorf("%s → %s: %w", from, to, ErrInvalidTransition)
	}
	return nil
}

// MaxRequestIDLen is the longest request_id accepted.
const MaxRequestIDLen = 64

// RequestIDPattern is the JSON-schema/regexp form of the request_id rule,
// shared by the HTTP validator, the OpenAPI document and the MCP schema.
const RequestIDPattern = `^[A-Za-z0-9._:-]{1,64}$`

// ErrInvalidRequestID is returned by ValidateRequestID.
var ErrInvalidRequestID = errors.New("request_id must be 1-64 characters of A-Z a-z 0-9 . _ : -")

// ValidateRequestID checks the request_id rule of DESIGN.md.
func ValidateRequestID(id string) error {
	if !keyChars(id, MaxRequestIDLen, ':') {
		return ErrInvalidRequestID
	}
	return nil
}

// keyChars reports whether s is 1 to maxLen bytes of A-Z a-z 0-9 . _ - and,
// when extra is not 0, extra: the rule of RequestIDPattern (extra ':') and
// SKUPattern (extra 0), checked without a regular expression on the
// intake's path.
func keyChars(s string, maxLen int, extra byte) bool {
	if len(s) == 0 || len(s) > maxLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '.', c == '_', c == '-':
		case extra != 0 && c == extra:
		default:
			return false
		}
	}
	return true
}

// NewRequestID returns a request_id in the recommended form: "ORD", the UTC
// time to the second, and 16 random hex digits (64 bits), e.g.
// ORD20261202143022a3f9c1e07b4d2a58. Clients generate it once per order and
// keep it across retries. Two ids of one client must never meet: with 64
// random bits per second, a client sending a million orders a second
// meets a collision about once in 37 million seconds of that load (six hex
// digits, as the examples show, collided daily at 100 orders a second).
func NewRequestID(now time.Time) string {
	return "ORD" + now.UTC().Format("20060102150405") + randomHex(8)
}

// NewOrderNo returns a server-side order number: "ORD", the UTC time to the
// millisecond and 8 random hex digits. It is unique in practice; the
// database's unique constraint catches the rare collision, and the intake
// retries with a new number.
func NewOrderNo(now time.Time) string {
	now = now.UTC()
	return fmt.Sprintf("ORD%s%03d%s", now.Format("20060102150405"), now.Nanosecond()/1e6, randomHex(4))
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		// crypto/rand.Read does not fail on supported platforms (Go 1.24+).
		panic(err)
	}
	return hex.EncodeToString(b)
}

// Order is an order as clients see it (the JSON shape of DESIGN.md), plus
// the server-side fields that are never sent.
type Order struct {
	ID        uuid.UUID `json:"order_id"`
	No        string    `json:"order_no"`
	RequestID string    `json:"request_id"`
	Status    Status    `json:"status"`
	UserID    int64     `json:"user_id"`
	Items     []Item    `json:"items"`
	Amount    Amount    `json:"amount"`
	Currency  string    `json:"currency"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
	// Reason is set when the order was rejected or cancelled.
	Reason string `json:"reason,omitempty"`

	ClientID    uuid.UUID `json:"-"`
	CallbackURL string    `json:"-"`
	Fingerprint []byte    `json:"-"`
}

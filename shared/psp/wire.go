// Package psp is orderpipe's side of the payment provider wire contract (DESIGN.md, "The payment provider's wire contract"):
//
//	POST {PSP_URL}/v1/charges  Idempotency-Key: K  {"amount":"39.98","currency":"CNY","reference":"<order_id>"}
//	  201 {"id","status":"succeeded"}  402 {"id","status":"declined","reason"}
//	  409 while K is in flight  422 K reused with another body  5xx/timeout: outcome unknown
//	POST {PSP_URL}/v1/refunds  Idempotency-Key: K  {"charge_id":"..."}
//	  201 {"id","status":"succeeded"}, same rules
//	POST {PSP_URL}/v1/charges/void  Idempotency-Key: <the charge's key>  {"reference":"<order_id>"}
//	  200 {"status":"voided"} (never charged; the key is dead: a later charge gets 410)
//	  200 {"id","status":"succeeded"|"declined"} (the key's stored answer; nothing voided)
//	  409 while the key's charge is in flight  5xx/timeout: unknown, retry
//
// A repeated key returns the first answer, so a caller that does not know
// the outcome (5xx, timeout, 409) retries with the SAME key and never
// charges twice. Client classifies answers for the consumers and the
// compensator, and resolves a key whose outcome is unknown with Void,
// which never charges. The provider stand-in (`orderpipe psp`) is tooling:
// shared/tooling/pspserver.
package psp

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
)

// Statuses in provider answers.
const (
	StatusSucceeded = "succeeded"
	StatusDeclined  = "declined"
	// StatusVoided answers a void of a key that was never charged, and a
	// charge with a voided key (410).
	StatusVoided = "voided"
)

// HeaderIdempotencyKey carries the caller's key on every POST.
const HeaderIdempotencyKey = "Idempotency-Key"

// MaxBodyBytes bounds a request body.
const MaxBodyBytes = 16 << 10

// ChargeRequest is the body of POST /v1/charges.
type ChargeRequest struct {
	// Amount is a decimal string with at most 2 decimals, > 0.
	Amount string `json:"amount"`
	// Currency is an ISO 4217 code.
	Currency string `json:"currency"`
	// Reference is the caller's reference (orderpipe sends the order id).
	Reference string `json:"reference"`
}

// RefundRequest is the body of POST /v1/refunds.
type RefundRequest struct {
	ChargeID string `json:"charge_id"`
}

// VoidRequest is the body of POST /v1/charges/void.
type VoidRequest struct {
	// Reference is the caller's reference (orderpipe sends the order id).
	Reference string `json:"reference"`
}

// Answer is the body of a 201 or 402, and of a void's 200.
type Answer struct {
	// ID is the charge's or refund's id ("" for a voided key).
	ID string `json:"id,omitempty"`
	// Status is StatusSucceeded, StatusDeclined or StatusVoided.
	Status string `json:"status"`
	// Reason is a decline's reason.
	Reason string `json:"reason,omitempty"`
}

// Problem is the body of every other answer.
type Problem struct {
	Error string `json:"error"`
	Code  string `json:"code"`
}

// ErrInvalid marks a request that the provider refuses as malformed (400).
var ErrInvalid = errors.New("invalid payment request")

var (
	currencyRe = regexp.MustCompile(`^[A-Z]{3}$`)
	amountRe   = regexp.MustCompile(`^([0-9]{1,15})(?:\.([0-9]{1,2}))?$`)
)

// ValidKey reports whether k is an acceptable Idempotency-Key: 1–255
// printable ASCII characters.
func ValidKey(k string) bool {
	if len(k) == 0 || len(k) > 255 {
		return false
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x21 || k[i] > 0x7e {
			return false
		}
	}
	return true
}

// ParseAmount parses a decimal amount exactly (never through float64) into
// minor units (cents). It accepts "39.98", "39.9", "39"; it refuses signs,
// exponents, more than 2 decimals, zero and more than 15 integer digits.
func ParseAmount(s string) (int64, error) {
	m := amountRe.FindStringSubmatch(s)
	if m == nil {
		return 0, fmt.Errorf("%w: amount %q is not a decimal with at most 2 decimals", ErrInvalid, s)
	}
	units, err := strconv.ParseInt(m[1], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: amount %q: %w", ErrInvalid, s, err)
	}
	frac := m[2]
	for len(frac) < 2 {
		frac += "0"
	}
	cents, _ := strconv.ParseInt(frac, 10, 64)
	v := units*100 + cents
	if v <= 0 {
		return 0, fmt.Errorf("%w: amount must be > 0", ErrInvalid)
	}
	return v, nil
}

// FormatAmount writes minor units as a decimal string with 2 decimals.
func FormatAmount(cents int64) string {
	return fmt.Sprintf("%d.%02d", cents/100, cents%100)
}

// decodeStrict decodes one JSON object of at most MaxBodyBytes into v,
// refusing unknown fields and trailing data.
func decodeStrict(r io.Reader, v any) error {
	b, err := io.ReadAll(io.LimitReader(r, MaxBodyBytes+1))
	if err != nil {
		return fmt.Errorf("%w: read body: %w", ErrInvalid, err)
	}
	if len(b) > MaxBodyBytes {
		return fmt.Errorf("%w: body larger than %d bytes", ErrInvalid, MaxBodyBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if dec.More() {
		return fmt.Errorf("%w: trailing data after the JSON object", ErrInvalid)
	}
	return nil
}

// decodeChecked decodes a request body with decodeStrict and hands it to
// check, which validates it and may normalise it in place. It returns the
// zero T when either fails.
func decodeChecked[T any](r io.Reader, check func(*T) error) (T, error) {
	var v T
	if err := decodeStrict(r, &v); err != nil {
		return *new(T), err
	}
	if err := check(&v); err != nil {
		return *new(T), err
	}
	return v, nil
}

// DecodeCharge parses and validates a charge request body and returns it
// with the amount normalised ("39.9" → "39.90"). Every failure wraps
// ErrInvalid.
func DecodeCharge(r io.Reader) (ChargeRequest, error) {
	return decodeChecked(r, func(c *ChargeRequest) error {
		cents, err := ParseAmount(c.Amount)
		if err != nil {
			return err
		}
		c.Amount = FormatAmount(cents)
		if !currencyRe.MatchString(c.Currency) {
			return fmt.Errorf("%w: currency %q is not an ISO 4217 code", ErrInvalid, c.Currency)
		}
		return checkReference(c.Reference)
	})
}

func checkReference(ref string) error {
	if ref == "" || len(ref) > 255 || strings.ContainsAny(ref, "\x00\n\r") {
		return fmt.Errorf("%w: reference must be 1-255 characters on one line", ErrInvalid)
	}
	return nil
}

// DecodeVoid parses and validates a void request body.
func DecodeVoid(r io.Reader) (VoidRequest, error) {
	return decodeChecked(r, func(v *VoidRequest) error { return checkReference(v.Reference) })
}

// DecodeRefund parses and validates a refund request body.
func DecodeRefund(r io.Reader) (RefundRequest, error) {
	return decodeChecked(r, func(rr *RefundRequest) error {
		if !ValidKey(rr.ChargeID) {
			return fmt.Errorf("%w: charge_id must be 1-255 printable characters", ErrInvalid)
		}
		return nil
	})
}

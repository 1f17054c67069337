package psp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"orderpipe/shared/keepalive"
)

// Client calls a payment provider that speaks the wire contract. It is safe
// for concurrent use.
//
// Outcomes: a charge that succeeded or was declined is an answer (nil
// error): a decline is a business outcome, final for that key. Everything
// whose outcome is unknown — 409 (the same key is in flight), 429, 5xx, a
// timeout, a dropped connection — is an *Error with Transient set: retry
// with the SAME key, which returns the first answer once there is one.
// Other 4xx answers (a malformed request, a key reused with another body,
// 410 for a charge whose key was voided) are permanent *Errors: retrying
// cannot help.
type Client struct {
	// BaseURL is PSP_URL, e.g. http://127.0.0.1:8090.
	BaseURL string
	// HTTP is the transport; nil means the package's own (pooled), which
	// keeps a connection per concurrent call idle for the next one.
	HTTP *http.Client
	// Timeout bounds one attempt; default 10s.
	Timeout time.Duration
}

// pooled is the HTTP client of a Client without one of its own: it keeps
// a connection per concurrent call idle for the next one (the payment
// step calls the provider from each of its workers at once).
var pooled = &http.Client{Transport: keepalive.Transport()}

// NewClient returns a client of baseURL with the given per-attempt timeout
// (0: 10s).
func NewClient(baseURL string, timeout time.Duration) *Client {
	return &Client{BaseURL: strings.TrimRight(baseURL, "/"), Timeout: timeout}
}

// Error is a call that did not produce an answer.
type Error struct {
	// Op is "charge", "refund" or "void".
	Op string
	// Key is the Idempotency-Key of the call.
	Key string
	// HTTPStatus is the provider's status code (0 when there was none).
	HTTPStatus int
	// Transient: the outcome is unknown or temporary; retry with the same key.
	Transient bool
	// Msg says what happened.
	Msg string
	// Err is the transport error, if any.
	Err error
}

func (e *Error) Error() string {
	kind := "permanent"
	if e.Transient {
		kind = "transient"
	}
	s := fmt.Sprintf("payment provider %s (key %s): %s error", e.Op, e.Key, kind)
	if e.HTTPStatus != 0 {
		s += fmt.Sprintf(" %d", e.HTTPStatus)
	}
	if e.Msg != "" {
		s += ": " + e.Msg
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

func (e *Error) Unwrap() error { return e.Err }

// IsTransient reports whether err is a provider call whose outcome is
// unknown or temporary (retry with the same key).
func IsTransient(err error) bool {
	var pe *Error
	return errors.As(err, &pe) && pe.Transient
}

// Charge asks the provider to charge amount (a decimal string) in currency
// under key. The answer's Status is StatusSucceeded or StatusDeclined.
func (c *Client) Charge(ctx context.Context, key, amount, currency, reference string) (Answer, error) {
	return c.post(ctx, "charge", "/v1/charges", key, ChargeRequest{Amount: amount, Currency: currency, Reference: reference})
}

// Void resolves the charge key key without ever charging. The answer's
// Status is StatusVoided (the provider never charged under key, and never
// will: a later Charge with it gets a permanent 410), or the key's stored
// answer, StatusSucceeded (refund it) or StatusDeclined. 409 (the charge is
// in flight) and every unknown outcome are transient errors: call again.
func (c *Client) Void(ctx context.Context, key, reference string) (Answer, error) {
	return c.post(ctx, "void", "/v1/charges/void", key, VoidRequest{Reference: reference})
}

// IsVoided reports whether err is a charge refused because its key was
// voided (410): nothing was charged, and nothing ever will be under it.
func IsVoided(err error) bool {
	var pe *Error
	return errors.As(err, &pe) && pe.HTTPStatus == http.StatusGone
}

// Refund asks the provider to refund chargeID under key. The answer's
// Status is StatusSucceeded.
func (c *Client) Refund(ctx context.Context, key, chargeID string) (Answer, error) {
	return c.post(ctx, "refund", "/v1/refunds", key, RefundRequest{ChargeID: chargeID})
}

func (c *Client) post(ctx context.Context, op, path, key string, body any) (Answer, error) {
	fail := func(status int, transient bool, msg string, err error) (Answer, error) {
		return Answer{}, &Error{Op: op, Key: key, HTTPStatus: status, Transient: transient, Msg: msg, Err: err}
	}
	if !ValidKey(key) {
		return fail(0, false, "bad idempotency key", nil)
	}
	b, err := json.Marshal(body)
	if err != nil {
		return fail(0, false, "encode request", err)
	}
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	actx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(actx, http.MethodPost, strings.TrimRight(c.BaseURL, "/")+path, bytes.NewReader(b))
	if err != nil {
		return fail(0, false, "build request", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(HeaderIdempotencyKey, key)
	hc := c.HTTP
	if hc == nil {
		hc = pooled
	}
	resp, err := hc.Do(req)
	if err != nil {
		// Timeout, refused, reset, dropped: the outcome is unknown.
		return fail(0, true, "no answer", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, MaxBodyBytes))
	if err != nil {
		return fail(resp.StatusCode, true, "read answer", err)
	}
	switch {
	case op == "void" && resp.StatusCode == http.StatusOK:
		var a Answer
		if err := json.Unmarshal(raw, &a); err != nil {
			return fail(resp.StatusCode, true, "unreadable answer", err)
		}
		switch {
		case a.Status == StatusVoided:
		case (a.Status == StatusSucceeded || a.Status == StatusDeclined) && a.ID != "":
		default:
			return fail(resp.StatusCode, true, fmt.Sprintf("void answer status %q (id %q) is not a known outcome", a.Status, a.ID), nil)
		}
		return a, nil
	case op != "void" && (resp.StatusCode == http.StatusCreated || (op == "charge" && resp.StatusCode == http.StatusPaymentRequired)):
		// 402 declined is a charge's outcome only: a refund is done or
		// refused, and a refused one (402 included) is the default's error.
		var a Answer
		if err := json.Unmarshal(raw, &a); err != nil || a.ID == "" {
			return fail(resp.StatusCode, true, "unreadable answer", err)
		}
		want := StatusSucceeded
		if resp.StatusCode == http.StatusPaymentRequired {
			want = StatusDeclined
		}
		if a.Status != want {
			return fail(resp.StatusCode, true, fmt.Sprintf("answer status %q does not match %d", a.Status, resp.StatusCode), nil)
		}
		return a, nil
	case resp.StatusCode == http.StatusConflict, resp.StatusCode == http.StatusTooManyRequests,
		resp.StatusCode == http.StatusRequestTimeout, resp.StatusCode >= 500:
		return fail(resp.StatusCode, true, problemText(raw), nil)
	default:
		return fail(resp.StatusCode, false, problemText(raw), nil)
	}
}

func problemText(raw []byte) string {
	var p Problem
	if json.Unmarshal(raw, &p) == nil && p.Error != "" {
		return p.Error
	}
	s := strings.TrimSpace(string(raw))
	if len(s) > 200 {
		s = s[:200]
	}
	return s
}

// Package client is the Go client of orderpipe's intake API, for shop
// backends. It makes an order write safe to retry:
//
//   - the request_id is generated once per order (ORD + UTC time + random)
//     unless the caller gives one, and kept across every retry, so the
//     server stores one order however many attempts reach it;
//   - timeouts, connection errors, 5xx answers without a problem document
//     and problem codes 1xx are retried with exponential backoff and
//     jitter, never sooner than Retry-After says;
//   - problem codes 2xx (the request is wrong) are never retried;
//   - a replay (200 Idempotent-Replayed, or a code 3xx) is success;
//   - a caller without a stable id of its own can fetch a server-issued
//     token (NewToken) and use it as the request_id;
//   - the whole call is bounded by a time budget.
//
// Timeouts stack from the inside out (DESIGN.md): the server bounds its own
// work by ORDERPIPE_INTAKE_TIMEOUT (default 5s); a client attempt waits
// that long plus a margin (AttemptTimeout, default 5s + 2s = 7s), so the
// client gives up on an attempt only after the server has; the budget
// (default 30s) covers several attempts and their backoff. When you raise
// the server's deadline, raise AttemptTimeout with it.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"orderpipe/producer/problem"
	"orderpipe/shared/keepalive"
	"orderpipe/shared/order"
)

// Defaults; see the package comment for how they relate.
const (
	// ServerTimeout is the intake's default deadline for its own work.
	ServerTimeout = 5 * time.Second
	// Margin is what an attempt waits beyond the server deadline (network
	// time, queueing).
	Margin = 2 * time.Second
	// DefaultAttemptTimeout is ServerTimeout + Margin.
	DefaultAttemptTimeout = ServerTimeout + Margin
	// DefaultBudget bounds a whole call, retries included.
	DefaultBudget = 30 * time.Second
	// DefaultBaseBackoff is the first backoff; it doubles per retry up to
	// DefaultMaxBackoff.
	DefaultBaseBackoff = 200 * time.Millisecond
	// DefaultMaxBackoff caps one backoff.
	DefaultMaxBackoff = 5 * time.Second
)

// Client talks to one intake. Its zero value is not usable: use New. It is
// safe for concurrent use.
type Client struct {
	baseURL string
	apiKey  string
	// HTTP is the transport; its own Timeout should be 0 (the client sets
	// a deadline per attempt). New sets one of its own on a transport
	// that every client it returns shares, which keeps a connection per
	// concurrent call idle.
	HTTP *http.Client
	// AttemptTimeout bounds one attempt; keep it above the server deadline.
	AttemptTimeout time.Duration
	// Budget bounds a whole call, all attempts and backoff included.
	Budget time.Duration
	// BaseBackoff and MaxBackoff shape the exponential backoff.
	BaseBackoff, MaxBackoff time.Duration
	// OnRetry, when set, is called before each retry with the attempt that
	// failed (1-based), its error and the wait (logging, metrics, tests).
	OnRetry func(attempt int, err error, wait time.Duration)
}

// transport is the transport of every Client that New returns: it keeps
// a connection per concurrent call idle for the next one, where net/http's
// default keeps two per host (a backend's concurrent calls dialled, and
// shook TLS hands, again and again).
var transport = keepalive.Transport()

// New returns a client of the intake at baseURL (e.g. http://localhost:8080)
// authenticating with apiKey, with the default timeouts.
func New(baseURL, apiKey string) *Client {
	return &Client{
		baseURL: strings.TrimRight(baseURL, "/"), apiKey: apiKey,
		HTTP: &http.Client{Transport: transport}, AttemptTimeout: DefaultAttemptTimeout, Budget: DefaultBudget,
		BaseBackoff: DefaultBaseBackoff, MaxBackoff: DefaultMaxBackoff,
	}
}

// Item is one line of an order.
type Item struct {
	SKU      string `json:"sku"`
	Quantity int    `json:"quantity"`
}

// OrderRequest is an order to create. Amount is a decimal string ("39.98");
// the client never turns it into a float.
type OrderRequest struct {
	// RequestID identifies the order across retries. Leave it empty to get
	// a generated one (returned in the Result); set it when your own
	// system must be able to retry across process restarts (store it with
	// the cart before calling).
	RequestID   string `json:"request_id"`
	UserID      int64  `json:"user_id"`
	Items       []Item `json:"items"`
	Amount      string `json:"amount"`
	Currency    string `json:"currency"`
	CallbackURL string `json:"callback_url,omitempty"`
}

// Order is an order as the intake returns it.
type Order struct {
	OrderID   string    `json:"order_id"`
	OrderNo   string    `json:"order_no"`
	RequestID string    `json:"request_id"`
	Status    string    `json:"status"`
	UserID    int64     `json:"user_id"`
	Items     []Item    `json:"items"`
	Amount    string    `json:"amount"`
	Currency  string    `json:"currency"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
	Reason    string    `json:"reason,omitempty"`
}

// Result is the outcome of CreateOrder.
type Result struct {
	Order Order
	// RequestID is the request_id used (generated when the request had
	// none).
	RequestID string
	// Replayed is true when the answer was a replay: an earlier attempt
	// (this call's or another's) had already created the order.
	Replayed bool
	// Attempts is the number of HTTP attempts made.
	Attempts int
}

// FieldError is one invalid field of a request.
type FieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

// Problem is an error answer of the intake (RFC 9457 with code and
// retryable).
type Problem struct {
	Type       string        `json:"type"`
	Title      string        `json:"title"`
	Status     int           `json:"status"`
	Detail     string        `json:"detail"`
	Code       int           `json:"code"`
	Retryable  bool          `json:"retryable"`
	Errors     []FieldError  `json:"errors"`
	RetryAfter time.Duration `json:"-"`
}

func (p *Problem) Error() string {
	s := fmt.Sprintf("orderpipe: %d %s (code %d)", p.Status, p.Title, p.Code)
	if p.Detail != "" {
		s += ": " + p.Detail
	}
	for _, f := range p.Errors {
		s += "; " + f.Field + ": " + f.Message
	}
	return s
}

// Class returns the code's first digit: 1 retry later, 2 do not retry, 3
// already done.
func (p *Problem) Class() int { return p.Code / 100 }

// ErrBudgetExhausted wraps the last attempt's error when the budget ran
// out before an attempt succeeded. The order may or may not exist: retry
// later with the same request_id (Result.RequestID, also in the error) or
// look it up with GetOrderByRequestID.
var ErrBudgetExhausted = errors.New("orderpipe: time budget exhausted")

// BudgetError is returned when the budget ran out; it carries the
// request_id to retry with.
type BudgetError struct {
	RequestID string
	Attempts  int
	Last      error
}

func (e *BudgetError) Error() string {
	return fmt.Sprintf("%v after %d attempts (request_id %s): %v", ErrBudgetExhausted, e.Attempts, e.RequestID, e.Last)
}

// Unwrap returns ErrBudgetExhausted and the last error.
func (e *BudgetError) Unwrap() []error { return []error{ErrBudgetExhausted, e.Last} }

// CreateOrder sends the order, retrying safely until it is accepted, a
// problem of class 2 answers, ctx ends or the budget runs out.
func (c *Client) CreateOrder(ctx context.Context, req OrderRequest) (Result, error) {
	if req.RequestID == "" {
		req.RequestID = order.NewRequestID(time.Now())
	}
	body, err := json.Marshal(req)
	if err != nil {
		return Result{}, fmt.Errorf("encode order: %w", err)
	}
	res := Result{RequestID: req.RequestID}
	err = c.retry(ctx, req.RequestID, &res.Attempts, func(actx context.Context) (bool, error) {
		hreq, err := http.NewRequestWithContext(actx, http.MethodPost, c.baseURL+"/v1/orders", bytes.NewReader(body))
		if err != nil {
			return false, err
		}
		hreq.Header.Set("Content-Type", "application/json")
		hreq.Header.Set("Idempotency-Key", req.RequestID)
		status, hdr, data, err := c.do(hreq)
		if err != nil {
			return true, err
		}
		switch status {
		case http.StatusAccepted, http.StatusOK:
			if err := json.Unmarshal(data, &res.Order); err != nil {
				return true, fmt.Errorf("decode order (HTTP %d): %w", status, err)
			}
			res.Replayed = status == http.StatusOK || hdr.Get("Idempotent-Replayed") == "true"
			return false, nil
		}
		p := asProblem(status, hdr, data)
		if p.Class() == 3 { // already done: fetch the order as it is now
			o, gerr := c.getOnce(actx, "/v1/orders?request_id="+url.QueryEscape(req.RequestID))
			if gerr != nil {
				return true, gerr
			}
			res.Order, res.Replayed = o, true
			return false, nil
		}
		return p.Class() == 1, p
	})
	return res, err
}

// Token is a server-issued idempotency token.
type Token struct {
	// Token is opaque; use it as OrderRequest.RequestID.
	Token string `json:"token"`
	// ExpiresAt: an order must be created with the token before then.
	ExpiresAt time.Time `json:"expires_at"`
}

// NewToken asks the intake for an idempotency token (POST
// /v1/idempotency-tokens), for a caller with no stable id of its own that
// it could keep across its retries (a form rendered again, a job rebuilt
// after a crash). Fetch one per order, before the first attempt; pass
// Token as OrderRequest.RequestID on that attempt and every later one: a
// second attempt then gets the same order (Result.Replayed), and one that
// comes while the first is in flight is retried after the server's
// Retry-After (code 104). Never fetch a new token to retry: a new token
// is a new order. Transient failures are retried; a retry may leave an
// unused token behind, which expires.
func (c *Client) NewToken(ctx context.Context) (Token, error) {
	var t Token
	var attempts int
	err := c.retry(ctx, "", &attempts, func(actx context.Context) (bool, error) {
		hreq, err := http.NewRequestWithContext(actx, http.MethodPost, c.baseURL+"/v1/idempotency-tokens", nil)
		if err != nil {
			return false, err
		}
		status, hdr, data, err := c.do(hreq)
		if err != nil {
			return true, err
		}
		if status != http.StatusCreated {
			p := asProblem(status, hdr, data)
			return p.Class() == 1, p
		}
		if err := json.Unmarshal(data, &t); err != nil {
			return true, fmt.Errorf("decode token (HTTP %d): %w", status, err)
		}
		if t.Token == "" {
			return true, fmt.Errorf("decode token (HTTP %d): no token in the answer", status)
		}
		return false, nil
	})
	return t, err
}

// GetOrder returns one of the caller's orders (a *Problem with code 203
// when it is not the caller's). Transient failures are retried like
// CreateOrder's.
func (c *Client) GetOrder(ctx context.Context, orderID string) (Order, error) {
	return c.get(ctx, "/v1/orders/"+url.PathEscape(orderID))
}

// GetOrderByRequestID returns the caller's order with that request_id.
func (c *Client) GetOrderByRequestID(ctx context.Context, requestID string) (Order, error) {
	return c.get(ctx, "/v1/orders?request_id="+url.QueryEscape(requestID))
}

func (c *Client) get(ctx context.Context, path string) (Order, error) {
	var o Order
	var attempts int
	err := c.retry(ctx, "", &attempts, func(actx context.Context) (bool, error) {
		var err error
		o, err = c.getOnce(actx, path)
		var p *Problem
		if errors.As(err, &p) {
			return p.Class() == 1, err
		}
		return err != nil, err
	})
	return o, err
}

func (c *Client) getOnce(ctx context.Context, path string) (Order, error) {
	hreq, err := http.NewRequestWithContext(ctx, http.MethodGet, c.baseURL+path, nil)
	if err != nil {
		return Order{}, err
	}
	status, hdr, data, err := c.do(hreq)
	if err != nil {
		return Order{}, err
	}
	if status != http.StatusOK {
		return Order{}, asProblem(status, hdr, data)
	}
	var o Order
	if err := json.Unmarshal(data, &o); err != nil {
		return Order{}, fmt.Errorf("decode order: %w", err)
	}
	return o, nil
}

func (c *Client) do(req *http.Request) (int, http.Header, []byte, error) {
	req.Header.Set("Authorization", "Bearer "+c.apiKey)
	req.Header.Set("Accept", "application/json, application/problem+json")
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return 0, nil, nil, fmt.Errorf("read response: %w", err)
	}
	return resp.StatusCode, resp.Header, data, nil
}

// asProblem decodes a problem answer; an answer that is not one (a proxy's
// 502 page, a gateway's JSON with a code of its own) becomes a problem of
// class 1 for 5xx and 429, class 2 otherwise. A problem of the intake has
// its type under problem.TypePrefix and a code of class 1 to 3.
func asProblem(status int, hdr http.Header, data []byte) *Problem {
	p := &Problem{}
	if err := json.Unmarshal(data, p); err != nil || !strings.HasPrefix(p.Type, problem.TypePrefix) || p.Code < 100 || p.Code > 399 {
		p = &Problem{Status: status, Title: http.StatusText(status), Code: 200}
		if status >= 500 || status == http.StatusTooManyRequests {
			p.Code, p.Retryable = 100, true
		}
	}
	p.RetryAfter = retryAfter(hdr.Get("Retry-After"), time.Now())
	return p
}

// retryAfter reads a Retry-After header (RFC 9110): a number of seconds,
// or an HTTP date (which a proxy in front of the intake may send); 0 when
// it is absent, malformed or past.
func retryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.Atoi(v); err == nil {
		return max(time.Duration(s)*time.Second, 0)
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0)
	}
	return 0
}

// retry runs attempt until it returns retry=false, within the budget. The
// wait before retry n is a random duration in [d/2, d] with
// d = min(MaxBackoff, BaseBackoff·2^(n-1)), and at least Retry-After.
func (c *Client) retry(ctx context.Context, requestID string, attempts *int, attempt func(context.Context) (bool, error)) error {
	budget := c.Budget
	if budget <= 0 {
		budget = DefaultBudget
	}
	ctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	backoff := c.BaseBackoff
	if backoff <= 0 {
		backoff = DefaultBaseBackoff
	}
	maxBackoff := c.MaxBackoff
	if maxBackoff <= 0 {
		maxBackoff = DefaultMaxBackoff
	}
	at := c.AttemptTimeout
	if at <= 0 {
		at = DefaultAttemptTimeout
	}
	for {
		*attempts++
		actx, acancel := context.WithTimeout(ctx, at)
		retry, err := attempt(actx)
		acancel()
		if err == nil {
			return nil
		}
		if !retry {
			return err
		}
		if ctx.Err() != nil {
			return c.exhausted(ctx, requestID, *attempts, err)
		}
		wait := backoff/2 + rand.N(backoff/2+1)
		var p *Problem
		if errors.As(err, &p) && p.RetryAfter > wait {
			wait = p.RetryAfter
		}
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait {
			return c.exhausted(ctx, requestID, *attempts, err)
		}
		if c.OnRetry != nil {
			c.OnRetry(*attempts, err, wait)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return c.exhausted(ctx, requestID, *attempts, err)
		case <-t.C:
		}
		backoff = min(backoff*2, maxBackoff)
	}
}

func (c *Client) exhausted(ctx context.Context, requestID string, attempts int, last error) error {
	if parent := context.Cause(ctx); errors.Is(parent, context.Canceled) {
		return fmt.Errorf("orderpipe: cancelled after %d attempts (request_id %s): %w", attempts, requestID, last)
	}
	return &BudgetError{RequestID: requestID, Attempts: attempts, Last: last}
}

// Package problem is orderpipe's one table of application error codes and
// the RFC 9457 problem document that carries them. Every entry point (the
// intake HTTP API, the MCP tools) answers errors through it, so a client
// decides what to do from the first digit of the code alone:
//
//   - 1xx: retry later, with the same request_id (unavailable, rate
//     limited, overloaded); Retry-After says when.
//   - 2xx: do not retry, the request is wrong (invalid input,
//     unauthenticated, not found, request_id reused with another payload…).
//   - 3xx: already done; a replay of an accepted request, i.e. success.
//
// The package is transport-neutral: a Problem knows its HTTP status, and
// Write renders it for HTTP, but the MCP tools use Code, Title and
// Retryable as they are.
package problem

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"orderpipe/shared/idemtoken"
	"orderpipe/shared/order"
	"orderpipe/shared/orderstore"
	"orderpipe/shared/postgres"
	"orderpipe/shared/tenant"
)

// Code is an application error code. Its hundreds digit is its class.
type Code int

// The codes. Keep the table below, the README's error table and the
// OpenAPI document in step.
const (
	// Internal: an unexpected server error. The request is idempotent, so
	// retrying it with the same request_id is safe.
	Internal Code = 100
	// Unavailable: a dependency (PostgreSQL) is unreachable or the server's
	// deadline for its own work passed.
	Unavailable Code = 101
	// RateLimited: the client sent more requests than its rate allows.
	RateLimited Code = 102
	// Overloaded: the server is at its bound of requests in flight.
	Overloaded Code = 103
	// TokenInFlight: another request with the same idempotency token is
	// being handled; retry later with the same token.
	TokenInFlight Code = 104

	// InvalidInput: the request breaks a rule; the problem lists the fields.
	InvalidInput Code = 201
	// Unauthenticated: no, or an unknown, API key.
	Unauthenticated Code = 202
	// NotFound: no such order for this client (other clients' orders are
	// never visible).
	NotFound Code = 203
	// MethodNotAllowed: the path exists, the method does not.
	MethodNotAllowed Code = 204
	// TooLarge: the body is over the limit.
	TooLarge Code = 205
	// UnsupportedMediaType: the body is not application/json.
	UnsupportedMediaType Code = 206
	// RequestIDReused: the request_id was used before with another payload.
	RequestIDReused Code = 207
	// TokenUnknown: the idempotency token was never issued to this client
	// (or was swept); fetch a new one.
	TokenUnknown Code = 208
	// TokenExpired: the idempotency token expired unused; fetch a new one.
	TokenExpired Code = 209

	// Replayed: the request was accepted before; the answer is the order.
	Replayed Code = 301
)

// Class is the first digit of a code.
type Class int

// The classes.
const (
	ClassRetry      Class = 1
	ClassDoNotRetry Class = 2
	ClassDone       Class = 3
)

// Class returns the code's class.
func (c Code) Class() Class { return Class(c / 100) }

// Retryable reports whether a client should retry (class 1).
func (c Code) Retryable() bool { return c.Class() == ClassRetry }

// Entry is a row of the table.
type Entry struct {
	Code Code
	// Slug names the code in the problem type URI and in logs.
	Slug string
	// Status is the HTTP status that carries it.
	Status int
	// Title is the RFC 9457 title: the same for every occurrence.
	Title string
	// RetryAfter is the default Retry-After for class 1 codes.
	RetryAfter time.Duration
}

var table = []Entry{
	{Internal, "internal", http.StatusInternalServerError, "Internal error; retry with the same request_id", time.Second},
	{Unavailable, "unavailable", http.StatusServiceUnavailable, "Service unavailable; retry later with the same request_id", 2 * time.Second},
	{RateLimited, "rate-limited", http.StatusTooManyRequests, "Rate limit exceeded; retry later", time.Second},
	{Overloaded, "overloaded", http.StatusServiceUnavailable, "Too many requests in flight; retry later", time.Second},
	{TokenInFlight, "token-in-flight", http.StatusConflict, "A request with this idempotency token is still processing; retry later with the same token", time.Second},
	{InvalidInput, "invalid-input", http.StatusBadRequest, "Invalid request", 0},
	{Unauthenticated, "unauthenticated", http.StatusUnauthorized, "Missing or unknown API key", 0},
	{NotFound, "not-found", http.StatusNotFound, "Not found", 0},
	{MethodNotAllowed, "method-not-allowed", http.StatusMethodNotAllowed, "Method not allowed", 0},
	{TooLarge, "too-large", http.StatusRequestEntityTooLarge, "Request body too large", 0},
	{UnsupportedMediaType, "unsupported-media-type", http.StatusUnsupportedMediaType, "Unsupported media type; send application/json", 0},
	{RequestIDReused, "request-id-reused", http.StatusUnprocessableEntity, "request_id already used with a different payload", 0},
	{TokenUnknown, "token-unknown", http.StatusUnprocessableEntity, "Unknown idempotency token; fetch a new one", 0},
	{TokenExpired, "token-expired", http.StatusUnprocessableEntity, "Idempotency token expired unused; fetch a new one", 0},
	{Replayed, "replayed", http.StatusOK, "Already accepted; this is the same order", 0},
}

// Table returns every code, in code order.
func Table() []Entry { return append([]Entry(nil), table...) }

// Lookup returns the entry of a code.
func Lookup(c Code) (Entry, bool) {
	for _, e := range table {
		if e.Code == c {
			return e, true
		}
	}
	return Entry{}, false
}

// TypePrefix starts every problem type URI; the slug follows.
const TypePrefix = "urn:orderpipe:problem:"

// Problem is an RFC 9457 problem document with orderpipe's two extension
// members, code and retryable, and the field list of an invalid request.
type Problem struct {
	Type      string             `json:"type"`
	Title     string             `json:"title"`
	Status    int                `json:"status"`
	Detail    string             `json:"detail,omitempty"`
	Instance  string             `json:"instance,omitempty"`
	Code      Code               `json:"code"`
	Retryable bool               `json:"retryable"`
	Errors    []order.FieldError `json:"errors,omitempty"`
	// RetryAfter is sent as the Retry-After header (whole seconds, at
	// least 1) for class 1 codes.
	RetryAfter time.Duration `json:"-"`
	// Allow is sent as the Allow header with MethodNotAllowed.
	Allow string `json:"-"`
}

// New returns the problem of a code with a detail.
func New(c Code, detail string) *Problem {
	e, ok := Lookup(c)
	if !ok {
		e, _ = Lookup(Internal)
		detail = fmt.Sprintf("unknown problem code %d: %s", c, detail)
	}
	return &Problem{
		Type: TypePrefix + e.Slug, Title: e.Title, Status: e.Status, Detail: detail,
		Code: e.Code, Retryable: e.Code.Retryable(), RetryAfter: e.RetryAfter,
	}
}

// Newf is New with a formatted detail.
func Newf(c Code, format string, args ...any) *Problem { return New(c, fmt.Sprintf(format, args...)) }

// Error makes a Problem an error, so that it can be returned and mapped
// back by From.
func (p *Problem) Error() string {
	if p.Detail == "" {
		return fmt.Sprintf("%d %s", p.Code, p.Title)
	}
	return fmt.Sprintf("%d %s: %s", p.Code, p.Title, p.Detail)
}

// From maps an error to its problem: the one place where domain errors
// become codes. A *Problem in the chain is returned as is; an unknown error
// is Internal with a generic detail (its text stays in the server log).
func From(err error) *Problem {
	var p *Problem
	var ve *order.ValidationError
	var mbe *http.MaxBytesError
	var inFlight *idemtoken.InFlightError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &p):
		return p
	case errors.As(err, &ve):
		p := New(InvalidInput, "the request breaks the rules listed in errors")
		p.Errors = ve.Fields
		return p
	case errors.As(err, &mbe):
		return Newf(TooLarge, "the body is over %d bytes", mbe.Limit)
	case errors.Is(err, order.ErrRequestIDReused):
		return New(RequestIDReused, "this request_id was used for another order; nothing was changed. Use a new request_id for a new order.")
	case errors.As(err, &inFlight):
		p := New(TokenInFlight, "another request with this idempotency token is still processing; retry after Retry-After with the same token")
		p.RetryAfter = inFlight.RetryAfter
		return p
	case errors.Is(err, idemtoken.ErrUnknown):
		return New(TokenUnknown, "this idempotency token is unknown to this client; fetch a new one (POST /v1/idempotency-tokens) and use it for this order")
	case errors.Is(err, idemtoken.ErrExpired):
		return New(TokenExpired, "this idempotency token expired unused; fetch a new one (POST /v1/idempotency-tokens) and use it for this order")
	case errors.Is(err, orderstore.ErrNotFound):
		return New(NotFound, "no such order")
	case errors.Is(err, tenant.ErrUnauthenticated):
		return New(Unauthenticated, "send Authorization: Bearer <api key>")
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return New(Unavailable, "the server could not finish within its deadline; retry with the same request_id")
	case postgres.IsTransient(err):
		return New(Unavailable, "the database is unreachable; retry with the same request_id")
	}
	return New(Internal, "unexpected error; retry with the same request_id")
}

// MediaType is the content type of a problem document.
const MediaType = "application/problem+json"

// Write sends p as an HTTP response, with Retry-After for class 1 codes
// and Allow for MethodNotAllowed.
func Write(w http.ResponseWriter, p *Problem) {
	h := w.Header()
	h.Set("Content-Type", MediaType)
	h.Set("Cache-Control", "no-store")
	h.Del("Content-Length")
	if p.Retryable {
		secs := int((p.RetryAfter + time.Second - 1) / time.Second)
		if secs < 1 {
			secs = 1
		}
		h.Set("Retry-After", strconv.Itoa(secs))
	}
	if p.Allow != "" {
		h.Set("Allow", p.Allow)
	}
	w.WriteHeader(p.Status)
	_ = json.NewEncoder(w).Encode(p)
}

// WriteError maps err with From and writes it.
func WriteError(w http.ResponseWriter, err error) { Write(w, From(err)) }

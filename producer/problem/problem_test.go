package problem

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"orderpipe/shared/order"
	"orderpipe/shared/orderstore"
	"orderpipe/shared/tenant"
	"orderpipe/shared/tooling/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func TestTableFollowsTheRule(t *testing.T) {
	t.Parallel()
	seen := map[Code]bool{}
	slugs := map[string]bool{}
	for _, e := range Table() {
		if seen[e.Code] || slugs[e.Slug] {
			t.Errorf("code %d or slug %s twice", e.Code, e.Slug)
		}
		seen[e.Code], slugs[e.Slug] = true, true
		switch e.Code.Class() {
		case ClassRetry:
			// 409 for a token in flight: the conflict is the client's own
			// concurrent request, and it resolves by itself.
			if (e.Status < 429 && e.Code != TokenInFlight) || e.RetryAfter <= 0 || !e.Code.Retryable() {
				t.Errorf("%d: class 1 wants a 429/5xx status (409 for a token in flight), a Retry-After and retryable", e.Code)
			}
		case ClassDoNotRetry:
			if e.Status < 400 || e.Status >= 500 || e.Code.Retryable() {
				t.Errorf("%d: class 2 wants a 4xx status and not retryable", e.Code)
			}
		case ClassDone:
			if e.Status >= 300 {
				t.Errorf("%d: class 3 wants a 2xx status", e.Code)
			}
		default:
			t.Errorf("%d: no such class", e.Code)
		}
		if e.Title == "" || http.StatusText(e.Status) == "" {
			t.Errorf("%d: title %q status %d", e.Code, e.Title, e.Status)
		}
	}
}

func TestFrom(t *testing.T) {
	t.Parallel()
	cases := []struct {
		err  error
		want Code
	}{
		{&order.ValidationError{Fields: []order.FieldError{{Field: "amount", Message: "x"}}}, InvalidInput},
		{fmt.Errorf("create: %w", order.ErrRequestIDReused), RequestIDReused},
		{fmt.Errorf("get: %w", orderstore.ErrNotFound), NotFound},
		{tenant.ErrUnauthenticated, Unauthenticated},
		{&http.MaxBytesError{Limit: 65536}, TooLarge},
		{fmt.Errorf("insert: %w", context.DeadlineExceeded), Unavailable},
		{fmt.Errorf("insert: %w", context.Canceled), Unavailable},
		{fmt.Errorf("insert: %w", &pgconn.PgError{Code: "08006"}), Unavailable},
		{fmt.Errorf("insert: %w", &pgconn.PgError{Code: "57P01"}), Unavailable},
		{fmt.Errorf("wrapped: %w", New(RateLimited, "slow down")), RateLimited},
		{errors.New("boom"), Internal},
	}
	for _, c := range cases {
		if got := From(c.err); got.Code != c.want {
			t.Errorf("From(%v) = %d, want %d", c.err, got.Code, c.want)
		}
	}
	if From(nil) != nil {
		t.Error("From(nil) != nil")
	}
	p := From(&order.ValidationError{Fields: []order.FieldError{{Field: "amount", Message: "x"}}})
	if len(p.Errors) != 1 || p.Errors[0].Field != "amount" {
		t.Errorf("field errors lost: %+v", p)
	}
	if New(Code(999), "x").Code != Internal {
		t.Error("unknown code not mapped to Internal")
	}
}

func TestWrite(t *testing.T) {
	t.Parallel()
	rec := httptest.NewRecorder()
	p := New(RateLimited, "slow down")
	p.RetryAfter = 1500e6
	Write(rec, p)
	if rec.Code != 429 || rec.Header().Get("Retry-After") != "2" || rec.Header().Get("Content-Type") != MediaType {
		t.Fatalf("%d %v", rec.Code, rec.Header())
	}
	var body map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatal(err)
	}
	if body["code"] != float64(102) || body["retryable"] != true || body["type"] != "urn:orderpipe:problem:rate-limited" ||
		body["title"] == "" || body["status"] != float64(429) || body["detail"] != "slow down" {
		t.Fatalf("body %v", body)
	}

	rec = httptest.NewRecorder()
	p = New(MethodNotAllowed, "use GET")
	p.Allow = "GET, HEAD"
	Write(rec, p)
	if rec.Code != 405 || rec.Header().Get("Allow") != "GET, HEAD" || rec.Header().Get("Retry-After") != "" {
		t.Fatalf("%d %v", rec.Code, rec.Header())
	}
}

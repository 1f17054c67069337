package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"orderpipe/producer/client"
	"orderpipe/shared/order"
	"orderpipe/shared/tooling/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// script is a scripted intake: each attempt gets the next answer. The
// retry rules are about the client's reading of answers, so a script is
// the precise tool; the producer package tests the client against the
// real intake.
type script struct {
	mu      sync.Mutex
	answers []func(w http.ResponseWriter)
	keys    []string
	times   []time.Time
}

func (s *script) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var req map[string]any
	_ = json.Unmarshal(body, &req)
	s.mu.Lock()
	n := len(s.keys)
	s.keys = append(s.keys, r.Header.Get("Idempotency-Key")+"|"+asString(req["request_id"]))
	s.times = append(s.times, time.Now())
	a := s.answers[min(n, len(s.answers)-1)]
	s.mu.Unlock()
	a(w)
}

func asString(v any) string { s, _ := v.(string); return s }

func problemAnswer(status, code int, retryAfter string) func(w http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		if retryAfter != "" {
			w.Header().Set("Retry-After", retryAfter)
		}
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(map[string]any{"type": "urn:orderpipe:problem:x", "title": "t", "status": status, "code": code, "retryable": code < 200})
	}
}

func orderAnswer(status int) func(w http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		if status == 200 {
			w.Header().Set("Idempotent-Replayed", "true")
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, `{"order_id":"0190b0b0-0000-7000-8000-000000000001","order_no":"ORDX","request_id":"r","status":"processing","amount":"39.98","currency":"CNY","user_id":1,"items":[{"sku":"A","quantity":1}]}`)
	}
}

// jsonAnswer answers status with a JSON body as given.
func jsonAnswer(status int, body string) func(w http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}
}

func hang(d time.Duration) func(w http.ResponseWriter) {
	return func(w http.ResponseWriter) { time.Sleep(d); orderAnswer(202)(w) }
}

func newClient(t *testing.T, s *script) *client.Client {
	t.Helper()
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	c := client.New(srv.URL, "opk_test")
	c.BaseBackoff, c.MaxBackoff = 10*time.Millisecond, 40*time.Millisecond
	return c
}

var req = client.OrderRequest{UserID: 1, Items: []client.Item{{SKU: "A", Quantity: 1}}, Amount: "39.98", Currency: "CNY"}

// TestAGatewaysJSONIsNotAProblem: a proxy or gateway in front of the intake
// may answer 5xx with JSON that has a numeric "code" of its own (Envoy's
// 503, a gRPC gateway's 14). That is not an orderpipe problem: the client
// goes by the HTTP status and retries, as for a proxy's HTML page.
func TestAGatewaysJSONIsNotAProblem(t *testing.T) {
	t.Parallel()
	gateway := func(body string) func(w http.ResponseWriter) { return jsonAnswer(http.StatusServiceUnavailable, body) }
	s := &script{answers: []func(http.ResponseWriter){
		gateway(`{"code":503,"message":"no healthy upstream"}`), gateway(`{"code":14,"message":"unavailable"}`), orderAnswer(202),
	}}
	res, err := newClient(t, s).CreateOrder(t.Context(), req)
	if err != nil || res.Attempts != 3 {
		t.Fatalf("%+v %v; want the gateway's 503s retried, then the order", res, err)
	}
}

func TestRetriesClassOneAndKeepsTheRequestID(t *testing.T) {
	t.Parallel()
	s := &script{answers: []func(http.ResponseWriter){
		problemAnswer(503, 101, ""), problemAnswer(429, 102, ""), problemAnswer(502, 0, ""), orderAnswer(202),
	}}
	c := newClient(t, s)
	res, err := c.CreateOrder(t.Context(), req)
	if err != nil || res.Attempts != 4 || res.Replayed || res.Order.Amount != "39.98" {
		t.Fatalf("%+v %v", res, err)
	}
	if order.ValidateRequestID(res.RequestID) != nil || !strings.HasPrefix(res.RequestID, "ORD") {
		t.Fatalf("generated request_id %q", res.RequestID)
	}
	for _, k := range s.keys {
		if k != res.RequestID+"|"+res.RequestID {
			t.Fatalf("request_id changed across retries: %v", s.keys)
		}
	}
}

func TestNeverRetriesClassTwo(t *testing.T) {
	t.Parallel()
	for _, code := range []int{201, 202, 203, 205, 206, 207} {
		s := &script{answers: []func(http.ResponseWriter){problemAnswer(400, code, "")}}
		c := newClient(t, s)
		_, err := c.CreateOrder(t.Context(), req)
		var p *client.Problem
		if !errors.As(err, &p) || p.Code != code || p.Class() != 2 || len(s.keys) != 1 {
			t.Fatalf("code %d: %v after %d attempts", code, err, len(s.keys))
		}
	}
}

func TestReplayIsSuccess(t *testing.T) {
	t.Parallel()
	c := newClient(t, &script{answers: []func(http.ResponseWriter){orderAnswer(200)}})
	res, err := c.CreateOrder(t.Context(), client.OrderRequest{RequestID: "mine", Amount: "1"})
	if err != nil || !res.Replayed || res.RequestID != "mine" {
		t.Fatalf("%+v %v", res, err)
	}
	// A class 3 problem is success too: the client fetches the order.
	c = newClient(t, &script{answers: []func(http.ResponseWriter){problemAnswer(200, 301, ""), orderAnswer(200)}})
	if res, err = c.CreateOrder(t.Context(), req); err != nil || !res.Replayed || res.Order.OrderNo != "ORDX" {
		t.Fatalf("class 3: %+v %v", res, err)
	}
}

// TestHonoursRetryAfter: the client waits at least as long as
// Retry-After says, given in seconds (as the intake sends it) or as an
// HTTP date (RFC 9110 allows it, and a proxy or load balancer in front of
// the intake may send one).
func TestHonoursRetryAfter(t *testing.T) {
	t.Parallel()
	for name, first := range map[string]func(http.ResponseWriter){
		"seconds": problemAnswer(429, 102, "1"),
		// The date has whole seconds: at least one of the two is left.
		"date": func(w http.ResponseWriter) {
			problemAnswer(503, 0, time.Now().Add(2*time.Second).UTC().Format(http.TimeFormat))(w)
		},
	} {
		s := &script{answers: []func(http.ResponseWriter){first, orderAnswer(202)}}
		c := newClient(t, s)
		if _, err := c.CreateOrder(t.Context(), req); err != nil {
			t.Fatal(err)
		}
		if gap := s.times[1].Sub(s.times[0]); gap < 900*time.Millisecond {
			t.Fatalf("Retry-After as %s: retried after %s, want at least about 1s", name, gap)
		}
	}
}

func TestTimeoutsAreRetriedWithinTheBudget(t *testing.T) {
	t.Parallel()
	s := &script{answers: []func(http.ResponseWriter){hang(300 * time.Millisecond), orderAnswer(200)}}
	c := newClient(t, s)
	c.AttemptTimeout = 100 * time.Millisecond
	res, err := c.CreateOrder(t.Context(), req)
	if err != nil || res.Attempts != 2 || !res.Replayed {
		t.Fatalf("%+v %v", res, err)
	}

	// A server that never answers in time: the budget ends the call.
	s = &script{answers: []func(http.ResponseWriter){hang(300 * time.Millisecond)}}
	c = newClient(t, s)
	c.AttemptTimeout, c.Budget = 50*time.Millisecond, 400*time.Millisecond
	t0 := time.Now()
	_, err = c.CreateOrder(t.Context(), client.OrderRequest{RequestID: "keep-me"})
	var be *client.BudgetError
	if !errors.Is(err, client.ErrBudgetExhausted) || !errors.As(err, &be) || be.RequestID != "keep-me" || be.Attempts < 2 {
		t.Fatalf("%v", err)
	}
	if el := time.Since(t0); el > time.Second {
		t.Fatalf("budget 400ms, call took %s", el)
	}
}

func TestConnectionErrorsAreRetried(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close() // nothing listens there now
	c := client.New(url, "k")
	c.BaseBackoff, c.Budget = 10*time.Millisecond, 300*time.Millisecond
	var retries int
	c.OnRetry = func(int, error, time.Duration) { retries++ }
	_, err := c.CreateOrder(t.Context(), req)
	if !errors.Is(err, client.ErrBudgetExhausted) || retries < 2 {
		t.Fatalf("%v after %d retries", err, retries)
	}
}

func TestCancelStopsRetrying(t *testing.T) {
	t.Parallel()
	c := newClient(t, &script{answers: []func(http.ResponseWriter){problemAnswer(503, 101, "5")}})
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	_, err := c.CreateOrder(ctx, req)
	if err == nil || time.Since(t0) > 2*time.Second {
		t.Fatalf("%v after %s", err, time.Since(t0))
	}
}

func TestGetOrder(t *testing.T) {
	t.Parallel()
	c := newClient(t, &script{answers: []func(http.ResponseWriter){problemAnswer(503, 101, ""), orderAnswer(200)}})
	o, err := c.GetOrder(t.Context(), "0190b0b0-0000-7000-8000-000000000001")
	if err != nil || o.Status != "processing" {
		t.Fatalf("%+v %v", o, err)
	}
	c = newClient(t, &script{answers: []func(http.ResponseWriter){problemAnswer(404, 203, "")}})
	_, err = c.GetOrderByRequestID(t.Context(), "x")
	var p *client.Problem
	if !errors.As(err, &p) || p.Code != 203 {
		t.Fatalf("%v", err)
	}
}

// NewToken retries class 1 and an undecodable 201, and never class 2.
func TestNewTokenRetriesOnlyWhatIsTransient(t *testing.T) {
	t.Parallel()
	tokenAnswer := func(body string) func(w http.ResponseWriter) { return jsonAnswer(http.StatusCreated, body) }
	s := &script{answers: []func(w http.ResponseWriter){
		problemAnswer(503, 101, "0"), tokenAnswer(`{"token":`), tokenAnswer(`{}`),
		tokenAnswer(`{"token":"opt1.abc","expires_at":"2026-12-03T19:00:00Z"}`),
	}}
	tok, err := newClient(t, s).NewToken(t.Context())
	if err != nil || tok.Token != "opt1.abc" || tok.ExpiresAt.IsZero() || len(s.keys) != 4 {
		t.Fatalf("token %+v, err %v, attempts %d", tok, err, len(s.keys))
	}
	s = &script{answers: []func(w http.ResponseWriter){problemAnswer(401, 202, "")}}
	var p *client.Problem
	if _, err := newClient(t, s).NewToken(t.Context()); !errors.As(err, &p) || p.Code != 202 || len(s.keys) != 1 {
		t.Fatalf("unauthenticated: %v after %d attempts", err, len(s.keys))
	}
}

// TestConcurrentCallsReuseTheirConnections: a shop backend creates orders
// from many goroutines through one client. Each round of concurrent calls
// must find the connections of the round before idle, not dial (and shake
// TLS hands with the intake) again because the client keeps only a couple
// of them.
func TestConcurrentCallsReuseTheirConnections(t *testing.T) {
	t.Parallel()
	const callers, rounds = 32, 5
	srv, opened := testenv.CountingServer(t, &script{answers: []func(http.ResponseWriter){orderAnswer(202)}}, false)
	c := client.New(srv.URL, "opk_test")
	testenv.ConcurrentRounds(t, rounds, callers, func(int, int) error {
		_, err := c.CreateOrder(t.Context(), req)
		return err
	})
	if n := opened.Load(); n > 2*callers {
		t.Fatalf("%d rounds of %d concurrent calls opened %d connections; want at most %d", rounds, callers, n, 2*callers)
	}
	t.Logf("%d calls over %d connections", rounds*callers, opened.Load())
	// The pool is shared, the http.Client is each client's own to change.
	if a, b := client.New(srv.URL, "k"), client.New(srv.URL, "k"); a.HTTP == b.HTTP || a.HTTP.Transport != b.HTTP.Transport {
		t.Fatal("two clients of New share their http.Client, or not their transport")
	}
}

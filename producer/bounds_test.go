package producer_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"orderpipe/producer"
	"orderpipe/producer/mcp"
	"orderpipe/shared/tooling/testenv"
)

// runIntake serves the whole intake (producer.Run: the order routes, the
// events stream and /mcp) on a free port until the test ends.
func runIntake(t *testing.T, opts producer.Options) *harness {
	t.Helper()
	db := testenv.DB(t)
	n := testenv.NATS(t)
	env := testenv.Env(t, db, n)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	testenv.Go(t, "producer.Run", func(ctx context.Context) error { return producer.Run(ctx, env, l, opts) })
	h := &harness{t: t, env: env, pool: db.Pool, js: n.JS, topo: n.Topology, srv: &httptest.Server{URL: "http://" + l.Addr().String()}}
	h.creds = h.newClient("shop")
	return h
}

// openStream opens the events stream of an order with key; the caller
// closes the body (which ends the stream).
func (h *harness) openStream(key, orderID string) *http.Response {
	h.t.Helper()
	req, _ := http.NewRequest("GET", h.srv.URL+"/v1/orders/"+orderID+"/events", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// problemOf returns the status and problem code of a refused request (an
// open stream is not read: 200, 0).
func problemOf(t *testing.T, resp *http.Response) (int, int) {
	t.Helper()
	if resp.StatusCode == http.StatusOK {
		return resp.StatusCode, 0
	}
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, response{status: resp.StatusCode, header: resp.Header, body: b}.code(t)
}

// TestStreamsAndMCPAreBounded: the events stream and /mcp count against
// MaxStreams (503, code 103) and MaxStreamsPerClient (429, code 102).
// Before, they were not counted at all.
func TestStreamsAndMCPAreBounded(t *testing.T) {
	t.Parallel()
	h := runIntake(t, producer.Options{MaxStreams: 3, MaxStreamsPerClient: 2})
	b := h.newClient("other")
	r := h.post(orderBody("streamed"))
	if r.status != http.StatusAccepted {
		t.Fatalf("POST: %d %s", r.status, r.body)
	}
	mine := r.json(t)["order_id"].(string)
	r = h.post(orderBody("streamed"), "Authorization", "Bearer "+b.APIKey)
	theirs := r.json(t)["order_id"].(string)

	s1 := h.openStream(h.creds.APIKey, mine)
	s2 := h.openStream(h.creds.APIKey, mine)
	if s1.StatusCode != 200 || s2.StatusCode != 200 {
		t.Fatalf("streams within the bound: %d %d", s1.StatusCode, s2.StatusCode)
	}
	if st, code := problemOf(t, h.openStream(h.creds.APIKey, mine)); st != http.StatusTooManyRequests || code != 102 {
		t.Fatalf("a client's third stream: %d code %d, want 429 code 102", st, code)
	}
	if s := h.openStream(b.APIKey, theirs); s.StatusCode != 200 {
		t.Fatalf("another client's first stream: %d", s.StatusCode)
	}
	if st, code := problemOf(t, h.openStream(b.APIKey, theirs)); st != http.StatusServiceUnavailable || code != 103 {
		t.Fatalf("a stream past the total bound: %d code %d, want 503 code 103", st, code)
	}
	mcpReq := func() *http.Response {
		req, _ := http.NewRequest(http.MethodPost, h.srv.URL+mcp.Path, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
		req.Header.Set("Authorization", "Bearer "+b.APIKey)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	if st, code := problemOf(t, mcpReq()); st != http.StatusServiceUnavailable || code != 103 {
		t.Fatalf("/mcp past the total bound: %d code %d, want 503 code 103", st, code)
	}
	// Closing a stream frees its slot (once its handler has returned).
	s1.Body.Close()
	testenv.WaitFor(t, 10*time.Second, "/mcp served once a stream closed", func() bool {
		resp := mcpReq()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode != http.StatusServiceUnavailable
	})
}

// TestMCPBodyIsLimitedLikeTheIntake: /mcp refuses a body over the
// intake's 64 KiB with 413, whether it announces its length or not.
// Before, /mcp read up to 1 MiB.
func TestMCPBodyIsLimitedLikeTheIntake(t *testing.T) {
	t.Parallel()
	if mcp.MaxBodyBytes != producer.MaxBodyBytes {
		t.Fatalf("mcp.MaxBodyBytes %d, producer.MaxBodyBytes %d", mcp.MaxBodyBytes, producer.MaxBodyBytes)
	}
	h := runIntake(t, producer.Options{})
	big := `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"pad":"` + strings.Repeat("x", 70<<10) + `"}}`
	for _, chunked := range []bool{false, true} {
		var body io.Reader = strings.NewReader(big)
		if chunked {
			body = io.MultiReader(body) // hides the length: sent chunked
		}
		req, _ := http.NewRequest(http.MethodPost, h.srv.URL+mcp.Path, body)
		req.Header.Set("Authorization", "Bearer "+h.creds.APIKey)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Errorf("chunked=%v: %d, want 413", chunked, resp.StatusCode)
		}
	}
}

// TestMCPBatchIsRefused: a JSON-RPC batch on /mcp is refused as a whole
// (400, a JSON-RPC error) and runs nothing. The rate limit and the bounds
// on streams count HTTP requests, so a batch of 50 tools/call messages ran
// 50 creates at once for one token and one slot; before, the batch below
// created 10 orders within a rate of one request a second.
func TestMCPBatchIsRefused(t *testing.T) {
	t.Parallel()
	h := runIntake(t, producer.Options{RateLimit: 1, RateBurst: 1})
	msgs := make([]string, 10)
	for i := range msgs {
		msgs[i] = fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"create_order","arguments":%s}}`,
			i+1, orderBody(fmt.Sprintf("batched-%d", i)))
	}
	// No MCP-Protocol-Version header: taken for 2025-03-26, whose
	// transport allowed batches.
	r := h.do(http.MethodPost, mcp.Path, "["+strings.Join(msgs, ",")+"]", "Accept", "application/json, text/event-stream")
	var rpc struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if r.status != http.StatusBadRequest || r.header.Get("Content-Type") != "application/json" ||
		json.Unmarshal(r.body, &rpc) != nil || rpc.JSONRPC != "2.0" || string(rpc.ID) != "null" || rpc.Error.Code != -32600 ||
		!strings.Contains(rpc.Error.Message, "batch") {
		t.Errorf("batch of 10 create_order calls: %d %s %s, want 400 and a JSON-RPC error", r.status, r.header.Get("Content-Type"), r.body)
	}
	h.wantCount(0, `SELECT count(*) FROM orders`)
}

// TestUnknownKeysAreLimitedBeforeTheDatabase: past its budget of unknown
// keys, an address is answered 429 without a query. The api_clients table
// is locked meanwhile, so a query would wait for the deadline and answer
// 503. A key that authenticated before still gets through.
func TestUnknownKeysAreLimitedBeforeTheDatabase(t *testing.T) {
	t.Parallel()
	h := setup(t, producer.Options{AuthFailureRate: 0.001, AuthFailureBurst: 3, Timeout: time.Second})
	if r := h.do("GET", "/v1/orders?request_id=x", ""); r.status != http.StatusNotFound {
		t.Fatalf("good key: %d %s", r.status, r.body)
	}
	for i := range 3 {
		if r := h.do("GET", "/v1/orders?request_id=x", "", "Authorization", "Bearer opk_guess"); r.status != http.StatusUnauthorized {
			t.Fatalf("unknown key %d: %d %s", i, r.status, r.body)
		}
	}
	release := h.lockTable("api_clients")
	r := h.do("GET", "/v1/orders?request_id=x", "", "Authorization", "Bearer opk_guess-again")
	if r.status != http.StatusTooManyRequests || r.code(t) != 102 || r.header.Get("Retry-After") == "" {
		t.Fatalf("unknown key past the budget: %d %v %s, want 429 code 102 without a query", r.status, r.header, r.body)
	}
	if err := release(); err != nil {
		t.Fatal(err)
	}
	if r := h.do("GET", "/v1/orders?request_id=x", ""); r.status != http.StatusNotFound {
		t.Fatalf("good key from the same address: %d %s", r.status, r.body)
	}
	if r := h.do("GET", "/v1/orders?request_id=x", "", "Authorization", "Bearer opk_third"); r.status != http.StatusTooManyRequests {
		t.Fatalf("unknown key: %d, still want 429", r.status)
	}
}

// TestReadyzShowsNoRawErrors: /readyz on the public port names each
// dependency's state in one word; the error (hosts, users, databases) is
// only logged.
func TestReadyzShowsNoRawErrors(t *testing.T) {
	t.Parallel()
	n := testenv.NATS(t)
	bad, err := pgxpool.New(t.Context(), "postgres://secretuser@127.0.0.1:1/secretdb?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(bad.Close)
	env := testenv.Env(t, nil, n)
	env.Pool = bad
	srv := newServer(t, producer.Handler(env, producer.Options{}))
	resp, err := http.Get(srv.URL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	r := response{status: resp.StatusCode, header: resp.Header, body: b}
	m := r.json(t)
	if m["postgres"] != "unavailable" || m["nats"] != "ok" {
		t.Errorf("readyz %s: want postgres unavailable, nats ok", b)
	}
	for _, leak := range []string{"secretuser", "secretdb", "127.0.0.1", "connect"} {
		if strings.Contains(string(b), leak) {
			t.Errorf("readyz shows %q: %s", leak, b)
		}
	}
}

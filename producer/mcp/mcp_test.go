package mcp_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"orderpipe/producer"
	"orderpipe/producer/mcp"
	"orderpipe/producer/orderstream"
	"orderpipe/shared/app"
	"orderpipe/shared/config"
	"orderpipe/shared/idemtoken"
	"orderpipe/shared/order"
	"orderpipe/shared/orderstore"
	"orderpipe/shared/tenant"
	"orderpipe/shared/tooling/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

type harness struct {
	t       *testing.T
	env     *app.Env
	pool    *pgxpool.Pool
	natsURL string
	dbURL   string
	creds   tenant.Credentials
	svc     *producer.Service
}

func setup(t *testing.T) *harness {
	t.Helper()
	db := testenv.DB(t)
	n := testenv.NATS(t)
	env := testenv.Env(t, db, n)
	env.Config.AllowPrivateCallbacks = true
	creds, err := tenant.Create(t.Context(), db.Pool, "agent")
	if err != nil {
		t.Fatal(err)
	}
	return &harness{t: t, env: env, pool: db.Pool, natsURL: n.URL, dbURL: db.URL, creds: creds, svc: producer.NewService(env, producer.Options{})}
}

// progress collects progress notifications.
type progress struct {
	mu   sync.Mutex
	msgs []*sdk.ProgressNotificationParams
	got  chan struct{}
}

func newProgress() *progress { return &progress{got: make(chan struct{}, 100)} }

func (p *progress) handler(_ context.Context, req *sdk.ProgressNotificationClientRequest) {
	p.mu.Lock()
	p.msgs = append(p.msgs, req.Params)
	p.mu.Unlock()
	select {
	case p.got <- struct{}{}:
	default:
	}
}

func newClient(p *progress) *sdk.Client {
	return sdk.NewClient(&sdk.Implementation{Name: "test-agent", Version: "1"}, &sdk.ClientOptions{ProgressNotificationHandler: p.handler})
}

// inMemory connects a client to a server for the harness's client, over
// in-memory transports (what stdio carries, without the pipes).
func (h *harness) inMemory(p *progress) *sdk.ClientSession {
	h.t.Helper()
	hub := orderstream.NewHub(h.pool, testenv.Logger(h.t))
	runHub(h.t, hub)
	clientID := h.creds.ClientID
	srv, err := mcp.NewServer(mcp.Options{Intake: h.svc, Waker: hub, Logger: testenv.Logger(h.t), Poll: 50 * time.Millisecond,
		ProgressEvery: 100 * time.Millisecond,
		Client:        func(context.Context, *sdk.CallToolRequest) (uuid.UUID, bool) { return clientID, true }})
	if err != nil {
		h.t.Fatal(err)
	}
	st, ct := sdk.NewInMemoryTransports()
	ctx := context.Background() // the sessions are closed by a cleanup, which t.Context() would precede
	ss, err := srv.Connect(ctx, st, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	cs, err := newClient(p).Connect(ctx, ct, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() {
		_ = cs.Close()
		_ = ss.Wait()
	})
	return cs
}

// setupSession is setup plus an in-memory session whose progress
// notifications nobody reads.
func setupSession(t *testing.T) (*harness, *sdk.ClientSession) {
	t.Helper()
	h := setup(t)
	return h, h.inMemory(newProgress())
}

func runHub(t *testing.T, hub *orderstream.Hub) {
	testenv.Go(t, "hub", hub.Run)
}

// overHTTP serves the intake with the extra routes (events stream and
// /mcp) and connects a client to /mcp with the harness's API key.
func (h *harness) overHTTP(p *progress) (*sdk.ClientSession, *httptest.Server) {
	h.t.Helper()
	ctx, cancel := context.WithCancel(context.Background()) // stopped by a cleanup, which t.Context() would precede
	clientID := func(r *http.Request) (uuid.UUID, bool) {
		c, ok := producer.ClientFrom(r.Context())
		return c.ID, ok
	}
	extra, wait, err := mcp.Routes(ctx, h.env, h.svc, clientID)
	if err != nil {
		cancel()
		h.t.Fatal(err)
	}
	srv := httptest.NewServer(producer.Handler(h.env, producer.Options{Extra: extra}))
	h.t.Cleanup(func() { cancel(); wait() })
	h.t.Cleanup(srv.Close)
	tr := &http.Transport{}
	h.t.Cleanup(tr.CloseIdleConnections)
	// The session is closed by a cleanup, which t.Context() would precede.
	cs, err := newClient(p).Connect(context.Background(), &sdk.StreamableClientTransport{
		Endpoint:   srv.URL + mcp.Path,
		HTTPClient: &http.Client{Transport: testenv.BearerTransport{Key: h.creds.APIKey, Next: tr}},
		MaxRetries: -1,
	}, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { _ = cs.Close() })
	return cs, srv
}

type toolProblem struct {
	Code      int    `json:"code"`
	Retryable bool   `json:"retryable"`
	Detail    string `json:"detail"`
	Errors    []struct {
		Field   string `json:"field"`
		Message string `json:"message"`
	} `json:"errors"`
}

type callResult struct {
	isError bool
	problem toolProblem
	result  mcp.OrderResult
	raw     string
}

func call(t *testing.T, cs *sdk.ClientSession, tool string, args any, progressToken any) callResult {
	t.Helper()
	params := &sdk.CallToolParams{Name: tool, Arguments: args}
	if progressToken != nil {
		params.SetProgressToken(progressToken)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, params)
	if err != nil {
		t.Fatalf("%s: protocol error %v", tool, err)
	}
	b, _ := json.Marshal(res.StructuredContent)
	out := callResult{isError: res.IsError, raw: string(b)}
	if len(res.Content) == 0 {
		t.Fatalf("%s: no content", tool)
	}
	if res.IsError {
		if err := json.Unmarshal(b, &out.problem); err != nil || out.problem.Code == 0 {
			t.Fatalf("%s: error result without a problem: %s", tool, b)
		}
		return out
	}
	if err := json.Unmarshal(b, &out.result); err != nil {
		t.Fatalf("%s: result %s: %v", tool, b, err)
	}
	return out
}

func createArgs(requestID string) map[string]any {
	return map[string]any{"request_id": requestID, "user_id": 42, "items": []any{map[string]any{"sku": "SKU-1", "quantity": 2}},
		"amount": "39.98", "currency": "CNY"}
}

// wantOrders fails the test unless want orders are stored (a failed query
// fails it too).
// postMCP sends body to srv's /mcp as h's client, as an MCP client would
// (JSON, answers as JSON or a stream), and returns the answer read whole.
func (h *harness) postMCP(srv *httptest.Server, body io.Reader) (int, http.Header, string) {
	h.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, srv.URL+mcp.Path, body)
	req.Header.Set("Authorization", "Bearer "+h.creds.APIKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode, resp.Header, string(b)
}

func (h *harness) wantOrders(want int) {
	h.t.Helper()
	var n int
	if err := h.pool.QueryRow(h.t.Context(), `SELECT count(*) FROM orders`).Scan(&n); err != nil {
		h.t.Fatalf("count orders: %v", err)
	}
	if n != want {
		h.t.Fatalf("%d orders, want %d", n, want)
	}
}

func (h *harness) move(id uuid.UUID, from, to order.Status) {
	h.t.Helper()
	if err := testenv.Move(h.t.Context(), h.pool, id, from, to, ""); err != nil {
		h.t.Error(err)
	}
}

// drive runs create_order → wait_for_order on a session: the order moves
// on (in the database, as the pipeline would) once the waiter reported
// progress, and the wait returns at the terminal state.
func (h *harness) drive(cs *sdk.ClientSession, p *progress) uuid.UUID {
	t := h.t
	rid := order.NewRequestID(time.Now())
	first := call(t, cs, mcp.ToolCreateOrder, createArgs(rid), nil)
	if first.isError || first.result.Order.Status != order.StatusProcessing || first.result.Replayed || first.result.Order.RequestID != rid {
		t.Fatalf("create_order: %s", first.raw)
	}
	// A retry with the same request_id: the same order, nothing new.
	again := call(t, cs, mcp.ToolCreateOrder, createArgs(rid), nil)
	if again.isError || !again.result.Replayed || again.result.Order.ID != first.result.Order.ID {
		t.Fatalf("retried create_order: %s", again.raw)
	}
	id := first.result.Order.ID
	moved := make(chan struct{})
	go func() {
		defer close(moved)
		select {
		case <-p.got:
		case <-time.After(20 * time.Second):
		}
		h.move(id, order.StatusProcessing, order.StatusReserved)
		h.move(id, order.StatusReserved, order.StatusPaid)
		h.move(id, order.StatusPaid, order.StatusConfirmed)
	}()
	done := call(t, cs, mcp.ToolWaitForOrder, map[string]any{"order_id": id.String(), "timeout_seconds": 60}, "wait-1")
	// The last move may still be reading its commit's answer when the
	// waiter sees the order confirmed: the test's context must outlive it.
	<-moved
	if done.isError || !done.result.Terminal || done.result.Order.Status != order.StatusConfirmed || done.result.TimedOut {
		t.Fatalf("wait_for_order: %s", done.raw)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.msgs) == 0 || p.msgs[0].ProgressToken != "wait-1" || !strings.Contains(p.msgs[0].Message, "processing") {
		t.Fatalf("progress notifications: %+v", p.msgs)
	}
	for i := 1; i < len(p.msgs); i++ {
		if p.msgs[i].Progress <= p.msgs[i-1].Progress {
			t.Fatalf("progress did not increase: %+v", p.msgs)
		}
	}
	return id
}

func TestCreateAndWaitInMemory(t *testing.T) {
	t.Parallel()
	h := setup(t)
	p := newProgress()
	h.drive(h.inMemory(p), p)
}

func TestCreateAndWaitOverHTTP(t *testing.T) {
	t.Parallel()
	h := setup(t)
	p := newProgress()
	cs, srv := h.overHTTP(p)
	id := h.drive(cs, p)

	// The events stream is mounted by the same Routes: the whole history
	// of the (now confirmed) order, then the end of the stream.
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/v1/orders/"+id.String()+"/events", nil)
	req.Header.Set("Authorization", "Bearer "+h.creds.APIKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" ||
		strings.Count(string(body), "\nid: ") != 4 || !strings.Contains(string(body), `"status":"confirmed"`) {
		t.Fatalf("events stream: %d %s", resp.StatusCode, body)
	}
}

// TestStdio runs the real stdio entry point (RunStdio: key from the
// environment, its own connections) on pipes.
func TestStdio(t *testing.T) {
	t.Parallel()
	h := setup(t)
	cfg := config.Config{DatabaseURL: h.dbURL, NATSURL: h.natsURL, LogFormat: "text", LogLevel: "debug", StreamReplicas: 1,
		ShutdownTimeout: 5 * time.Second, AllowPrivateCallbacks: true}
	newIntake := func(env *app.Env) (mcp.Intake, error) { return producer.NewService(env, producer.Options{}), nil }

	// Refusals before serving.
	if err := mcp.RunStdio(t.Context(), cfg, "", strings.NewReader(""), io.Discard, io.Discard, newIntake); err == nil || !strings.Contains(err.Error(), "ORDERPIPE_API_KEY") {
		t.Fatalf("without a key: %v", err)
	}
	if err := mcp.RunStdio(t.Context(), cfg, "opk_unknown", strings.NewReader(""), io.Discard, io.Discard, newIntake); err == nil || !strings.Contains(err.Error(), "ORDERPIPE_API_KEY") {
		t.Fatalf("with an unknown key: %v", err)
	}
	if err := mcp.RunStdio(t.Context(), config.Config{}, h.creds.APIKey, strings.NewReader(""), io.Discard, io.Discard, newIntake); err == nil || !strings.Contains(err.Error(), "DATABASE_URL") {
		t.Fatalf("without DATABASE_URL: %v", err)
	}

	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- mcp.RunStdio(t.Context(), cfg, h.creds.APIKey, inR, outW, testenv.Writer(t), newIntake)
		_ = outW.Close()
	}()
	p := newProgress()
	cs, err := newClient(p).Connect(t.Context(), &sdk.IOTransport{Reader: outR, Writer: inW}, nil)
	if err != nil {
		t.Fatal(err)
	}
	rid := order.NewRequestID(time.Now())
	res := call(t, cs, mcp.ToolCreateOrder, createArgs(rid), nil)
	if res.isError || res.result.Order.RequestID != rid {
		t.Fatalf("create_order over stdio: %s", res.raw)
	}
	o, err := orderstore.GetByRequestID(t.Context(), h.pool, h.creds.ClientID, rid)
	if err != nil || o.ID != res.result.Order.ID {
		t.Fatalf("the order is not the client's: %v", err)
	}
	h.move(o.ID, order.StatusProcessing, order.StatusRejected)
	w := call(t, cs, mcp.ToolWaitForOrder, map[string]any{"order_id": o.ID.String()}, nil)
	if w.isError || w.result.Order.Status != order.StatusRejected {
		t.Fatalf("wait_for_order over stdio: %s", w.raw)
	}
	_ = cs.Close() // closes stdin: the server returns
	if err := testenv.Receive(t, done, 20*time.Second, "RunStdio to return after stdin closed"); err != nil {
		t.Fatalf("RunStdio: %v", err)
	}
}

// listTools returns the tools a client lists, by name.
func listTools(t *testing.T, cs *sdk.ClientSession) map[string]*sdk.Tool {
	t.Helper()
	res, err := cs.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	tools := map[string]*sdk.Tool{}
	for _, tl := range res.Tools {
		tools[tl.Name] = tl
	}
	return tools
}

// TestNoToolSchemaHasARootCombinator: the Anthropic Messages API refuses
// a tool whose input schema has oneOf, anyOf or allOf at its root, and
// with it every request of an agent that lists this server's tools. Every
// input schema is a plain object schema, and create_order requires
// request_id (DESIGN.md). Before, create_order and get_order had a root
// oneOf and create_order did not require request_id.
func TestNoToolSchemaHasARootCombinator(t *testing.T) {
	t.Parallel()
	_, cs := setupSession(t)
	tools := listTools(t, cs)
	for _, name := range []string{mcp.ToolCreateOrder, mcp.ToolNewToken, mcp.ToolGetOrder, mcp.ToolWaitForOrder} {
		if tools[name] == nil {
			t.Errorf("no %s tool", name)
		}
	}
	for name, tl := range tools {
		b, _ := json.Marshal(tl.InputSchema)
		var root map[string]json.RawMessage
		if err := json.Unmarshal(b, &root); err != nil {
			t.Fatalf("%s: input schema %s: %v", name, b, err)
		}
		for _, k := range []string{"oneOf", "anyOf", "allOf"} {
			if _, ok := root[k]; ok {
				t.Errorf("%s: input schema has %s at the top level: %s", name, k, b)
			}
		}
		if string(root["type"]) != `"object"` {
			t.Errorf("%s: input schema is not of type object: %s", name, b)
		}
	}
	if create := tools[mcp.ToolCreateOrder]; create != nil {
		b, _ := json.Marshal(create.InputSchema)
		var schema struct {
			Required []string `json:"required"`
		}
		if err := json.Unmarshal(b, &schema); err != nil || !slices.Contains(schema.Required, "request_id") {
			t.Errorf("create_order does not require request_id: %s", b)
		}
	}
}

// TestSchemaRequiresRequestID: create_order's schema requires request_id,
// with the HTTP contract's rule; a token from new_order_token is sent as
// the request_id, and both descriptions say so.
func TestSchemaRequiresRequestID(t *testing.T) {
	t.Parallel()
	h, cs := setupSession(t)
	tools := listTools(t, cs)
	create, token := tools[mcp.ToolCreateOrder], tools[mcp.ToolNewToken]
	if create == nil || token == nil {
		t.Fatalf("tools: %v", tools)
	}
	b, _ := json.Marshal(create.InputSchema)
	var schema struct {
		Required   []string `json:"required"`
		Properties map[string]struct {
			MinLength *int   `json:"minLength"`
			MaxLength *int   `json:"maxLength"`
			Pattern   string `json:"pattern"`
		} `json:"properties"`
		AdditionalProperties any `json:"additionalProperties"`
	}
	if err := json.Unmarshal(b, &schema); err != nil {
		t.Fatal(err)
	}
	rid := schema.Properties["request_id"]
	if !slices.Equal(schema.Required, []string{"request_id", "user_id", "items", "amount", "currency"}) ||
		rid.MinLength == nil || *rid.MinLength != 1 || rid.MaxLength == nil || *rid.MaxLength != 64 || rid.Pattern != order.RequestIDPattern ||
		schema.AdditionalProperties != false {
		t.Fatalf("create_order schema: %s", b)
	}
	if _, ok := schema.Properties["token"]; ok {
		t.Fatalf("create_order schema has a token member beside request_id: %s", b)
	}
	if !idemtoken.Valid("opt1."+strings.Repeat("a", 48)) || order.ValidateRequestID("opt1."+strings.Repeat("a", 48)) != nil {
		t.Fatal("a token is not a valid request_id")
	}
	if !strings.Contains(create.Description, "reuse the SAME request_id on every retry") ||
		!strings.Contains(create.Description, "new_order_token") || !strings.Contains(token.Description, "as request_id") {
		t.Fatalf("descriptions:\n%s\n%s", create.Description, token.Description)
	}

	// Without request_id (or with an empty one, or with the token in a
	// member of its own) the call is refused by the schema, with the
	// invalid-input code, and nothing is created.
	noID := createArgs("x")
	delete(noID, "request_id")
	tokenMember := createArgs("x")
	delete(tokenMember, "request_id")
	tokenMember["token"] = "opt1." + strings.Repeat("0", 48)
	for _, args := range []map[string]any{noID, createArgs(""), tokenMember} {
		r := call(t, cs, mcp.ToolCreateOrder, args, nil)
		if !r.isError || r.problem.Code != 201 || r.problem.Retryable {
			t.Fatalf("create without a request_id: %s", r.raw)
		}
	}
	h.wantOrders(0)
}

// TestMalformedArguments: every tool refuses bad arguments with code 201
// (do not retry) and creates nothing.
func TestMalformedArguments(t *testing.T) {
	t.Parallel()
	h, cs := setupSession(t)
	with := func(k string, v any) map[string]any {
		a := createArgs(order.NewRequestID(time.Now()))
		if v == nil {
			delete(a, k)
		} else {
			a[k] = v
		}
		return a
	}
	many := make([]any, 101)
	for i := range many {
		many[i] = map[string]any{"sku": "S" + uuid.NewString()[:8], "quantity": 1}
	}
	cases := map[string]map[string]any{
		"request_id too long":      with("request_id", strings.Repeat("a", 65)),
		"request_id bad character": with("request_id", "a b"),
		"request_id not a string":  with("request_id", 12),
		"no user_id":               with("user_id", nil),
		"user_id 0":                with("user_id", 0),
		"user_id fraction":         with("user_id", 1.5),
		"user_id string":           with("user_id", "42"),
		"no items":                 with("items", nil),
		"empty items":              with("items", []any{}),
		"101 items":                with("items", many),
		"quantity 0":               with("items", []any{map[string]any{"sku": "SKU-1", "quantity": 0}}),
		"quantity 10001":           with("items", []any{map[string]any{"sku": "SKU-1", "quantity": 10001}}),
		"bad sku":                  with("items", []any{map[string]any{"sku": "SKU 1", "quantity": 1}}),
		"item extra field":         with("items", []any{map[string]any{"sku": "SKU-1", "quantity": 1, "price": 3}}),
		"repeated sku":             with("items", []any{map[string]any{"sku": "SKU-1", "quantity": 1}, map[string]any{"sku": "SKU-1", "quantity": 1}}),
		"amount 0":                 with("amount", "0"),
		"amount 3 decimals":        with("amount", "1.234"),
		"amount negative":          with("amount", -1),
		"amount words":             with("amount", "ten"),
		"currency lower case":      with("currency", "cny"),
		"currency unknown":         with("currency", "XXX"),
		"callback ftp":             with("callback_url", "ftp://shop.example/h"),
		"callback not a URL":       with("callback_url", "shop"),
		"unknown field":            with("coupon", "FREE"),
		"token beside request_id":  with("token", "opt1."+strings.Repeat("a", 48)),
	}
	for name, args := range cases {
		r := call(t, cs, mcp.ToolCreateOrder, args, nil)
		if !r.isError || r.problem.Code != 201 || r.problem.Retryable {
			t.Errorf("create_order %s: %s", name, r.raw)
		}
	}
	for name, args := range map[string]map[string]any{
		"neither":        {},
		"both":           {"order_id": uuid.NewString(), "request_id": "r1"},
		"bad order_id":   {"order_id": "42"},
		"bad request_id": {"request_id": "a/b"},
		"extra":          {"order_id": uuid.NewString(), "x": 1},
	} {
		r := call(t, cs, mcp.ToolGetOrder, args, nil)
		if !r.isError || r.problem.Code != 201 {
			t.Errorf("get_order %s: %s", name, r.raw)
		}
	}
	if r := call(t, cs, mcp.ToolNewToken, map[string]any{"ttl": 5}, nil); !r.isError || r.problem.Code != 201 {
		t.Errorf("new_order_token with an argument: %s", r.raw)
	}
	for name, args := range map[string]map[string]any{
		"no order_id":   {"timeout_seconds": 5},
		"bad order_id":  {"order_id": "zz"},
		"timeout 0":     {"order_id": uuid.NewString(), "timeout_seconds": 0},
		"timeout 301":   {"order_id": uuid.NewString(), "timeout_seconds": 301},
		"timeout text":  {"order_id": uuid.NewString(), "timeout_seconds": "5"},
		"timeout float": {"order_id": uuid.NewString(), "timeout_seconds": 1.5},
	} {
		r := call(t, cs, mcp.ToolWaitForOrder, args, nil)
		if !r.isError || r.problem.Code != 201 {
			t.Errorf("wait_for_order %s: %s", name, r.raw)
		}
	}
	h.wantOrders(0)
}

// TestAmountsTheHTTPIntakeAccepts: DESIGN.md gives MCP the same rules as
// HTTP, so an amount the HTTP intake accepts (ParseAmount: trailing zeros
// past the hundredths, leading zeros, a JSON number) is accepted by
// create_order too, not refused by the tool's schema first.
func TestAmountsTheHTTPIntakeAccepts(t *testing.T) {
	t.Parallel()
	h, cs := setupSession(t)
	for _, amount := range []any{"1.500", "0039.98", "7", "12.3", 39.98} {
		want, err := order.ParseAmount(fmt.Sprint(amount))
		if err != nil {
			t.Fatalf("the HTTP intake refuses %v: %v", amount, err)
		}
		args := createArgs(order.NewRequestID(time.Now()))
		args["amount"] = amount
		r := call(t, cs, mcp.ToolCreateOrder, args, nil)
		if r.isError || r.result.Order.Amount != want {
			t.Errorf("create_order with amount %#v: %s, want an order of %s", amount, r.raw, want)
		}
	}
	h.wantOrders(5)
}

// An agent that rebuilds its call after a timeout: it fetched a token once
// and sends it on every attempt; every attempt after the first gets the
// same order back. An unknown token is code 208 (fetch a new one).
func TestCreateWithToken(t *testing.T) {
	t.Parallel()
	h, cs := setupSession(t)
	r := call(t, cs, mcp.ToolNewToken, map[string]any{}, nil)
	var tok idemtoken.Token
	if err := json.Unmarshal([]byte(r.raw), &tok); r.isError || err != nil || tok.Token == "" || tok.ExpiresAt.IsZero() {
		t.Fatalf("new_order_token: %s (%v)", r.raw, err)
	}
	args := createArgs(tok.Token)
	var ids []string
	for i := range 3 {
		r := call(t, cs, mcp.ToolCreateOrder, args, nil)
		var res mcp.OrderResult
		if err := json.Unmarshal([]byte(r.raw), &res); r.isError || err != nil || res.Replayed != (i > 0) || res.Order.RequestID != tok.Token {
			t.Fatalf("attempt %d: %s (%v)", i, r.raw, err)
		}
		ids = append(ids, res.Order.ID.String())
	}
	if ids[0] != ids[1] || ids[1] != ids[2] {
		t.Fatalf("order ids %v", ids)
	}
	// An unknown token, and a request_id that only looks like one, are
	// answered as over HTTP: code 208.
	for _, unknown := range []string{"opt1." + strings.Repeat("5", 48), "opt1.xyz"} {
		if r := call(t, cs, mcp.ToolCreateOrder, createArgs(unknown), nil); !r.isError || r.problem.Code != 208 || r.problem.Retryable {
			t.Fatalf("unknown token %s: %s", unknown, r.raw)
		}
	}
	h.wantOrders(1)
}

// TestDuplicateMembersAreRefused: create_order refuses arguments that
// give a member twice, as POST /v1/orders does, whichever way the
// idempotency key comes; nothing is created. Before, arguments with a
// token member were decoded into a map (the last duplicate won) and
// encoded again, so {"token":T,"amount":"1.00","amount":"9.99",...}
// created an order for 9.99.
func TestDuplicateMembersAreRefused(t *testing.T) {
	t.Parallel()
	h, cs := setupSession(t)
	tok := call(t, cs, mcp.ToolNewToken, map[string]any{}, nil)
	var issued idemtoken.Token
	if err := json.Unmarshal([]byte(tok.raw), &issued); tok.isError || err != nil {
		t.Fatalf("new_order_token: %s (%v)", tok.raw, err)
	}
	rest := `"user_id":42,"items":[{"sku":"SKU-1","quantity":2}],"currency":"CNY"`
	for name, args := range map[string]string{
		"request_id":      `{"request_id":"` + order.NewRequestID(time.Now()) + `","amount":"1.00","amount":"9.99",` + rest + `}`,
		"token as key":    `{"request_id":"` + issued.Token + `","amount":"1.00","amount":"9.99",` + rest + `}`,
		"token member":    `{"token":"` + issued.Token + `","amount":"1.00","amount":"9.99",` + rest + `}`,
		"twice the key":   `{"request_id":"a1","request_id":"a2","amount":"1.00",` + rest + `}`,
		"in an item line": `{"request_id":"` + order.NewRequestID(time.Now()) + `","amount":"1.00","user_id":42,"items":[{"sku":"SKU-1","quantity":1,"quantity":9}],"currency":"CNY"}`,
	} {
		r := call(t, cs, mcp.ToolCreateOrder, json.RawMessage(args), nil)
		// The token member is refused by the schema (no such member);
		// every other case names the member given twice.
		if !r.isError || r.problem.Code != 201 || r.problem.Retryable || (name != "token member" && !strings.Contains(r.raw, "twice")) {
			t.Errorf("%s: %s, want code 201", name, r.raw)
		}
	}
	h.wantOrders(0)
}

func TestErrorsCarryTheHTTPCodes(t *testing.T) {
	t.Parallel()
	h, cs := setupSession(t)
	rid := order.NewRequestID(time.Now())
	first := call(t, cs, mcp.ToolCreateOrder, createArgs(rid), nil)
	if first.isError {
		t.Fatal(first.raw)
	}
	changed := createArgs(rid)
	changed["amount"] = "1.00"
	if r := call(t, cs, mcp.ToolCreateOrder, changed, nil); !r.isError || r.problem.Code != 207 || r.problem.Retryable {
		t.Fatalf("same request_id, other payload: %s", r.raw)
	}
	if r := call(t, cs, mcp.ToolGetOrder, map[string]any{"order_id": uuid.NewString()}, nil); !r.isError || r.problem.Code != 203 {
		t.Fatalf("unknown order: %s", r.raw)
	}
	if r := call(t, cs, mcp.ToolGetOrder, map[string]any{"request_id": rid}, nil); r.isError || r.result.Order.ID != first.result.Order.ID {
		t.Fatalf("get by request_id: %s", r.raw)
	}
	if r := call(t, cs, mcp.ToolGetOrder, map[string]any{"order_id": first.result.Order.ID.String()}, nil); r.isError || r.result.Order.RequestID != rid {
		t.Fatalf("get by order_id: %s", r.raw)
	}
	// Another client cannot see it.
	other, err := tenant.Create(t.Context(), h.pool, "other")
	if err != nil {
		t.Fatal(err)
	}
	h.creds = other
	cs2 := h.inMemory(newProgress())
	if r := call(t, cs2, mcp.ToolGetOrder, map[string]any{"order_id": first.result.Order.ID.String()}, nil); !r.isError || r.problem.Code != 203 {
		t.Fatalf("another client's order: %s", r.raw)
	}
	if r := call(t, cs2, mcp.ToolWaitForOrder, map[string]any{"order_id": first.result.Order.ID.String(), "timeout_seconds": 1}, nil); !r.isError || r.problem.Code != 203 {
		t.Fatalf("waiting for another client's order: %s", r.raw)
	}
	// A wait that times out returns the order as it is.
	if r := call(t, cs, mcp.ToolWaitForOrder, map[string]any{"order_id": first.result.Order.ID.String(), "timeout_seconds": 1}, nil); r.isError || !r.result.TimedOut || r.result.Terminal {
		t.Fatalf("timed-out wait: %s", r.raw)
	}
}

// TestBatchesAreRefused: /mcp refuses a JSON-RPC batch of any size,
// after white space too, with 400 and a JSON-RPC error, and runs none of
// its messages; white space before it counts against the body limit (413)
// and a single message is served as before.
func TestBatchesAreRefused(t *testing.T) {
	t.Parallel()
	h := setup(t)
	_, srv := h.overHTTP(newProgress())
	post := func(body io.Reader) (int, string) {
		st, _, b := h.postMCP(srv, body)
		return st, b
	}
	msg := func(id int) string {
		args, _ := json.Marshal(createArgs(order.NewRequestID(time.Now())))
		return fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"create_order","arguments":%s}}`, id, args)
	}
	for name, body := range map[string]string{
		"one message":      "[" + msg(1) + "]",
		"after whitespace": " \r\n\t [" + msg(1) + "," + msg(2) + "]",
	} {
		st, b := post(strings.NewReader(body))
		if st != http.StatusBadRequest || !strings.Contains(b, `"code":-32600`) || !strings.Contains(b, `"id":null`) {
			t.Errorf("batch, %s: %d %s", name, st, b)
		}
	}
	// Chunked, so that only the reader's limit applies.
	if st, b := post(io.MultiReader(strings.NewReader(strings.Repeat(" ", mcp.MaxBodyBytes+1) + "[" + msg(1) + "]"))); st != http.StatusRequestEntityTooLarge {
		t.Errorf("white space past the limit: %d %s", st, b)
	}
	h.wantOrders(0)
	if st, b := post(strings.NewReader(" " + msg(1))); st != http.StatusOK || !strings.Contains(b, `"status":"processing"`) {
		t.Errorf("one message: %d %s", st, b)
	}
	h.wantOrders(1)
}

func TestHTTPRequiresTheAPIKey(t *testing.T) {
	t.Parallel()
	h := setup(t)
	_, srv := h.overHTTP(newProgress())
	for _, key := range []string{"", "opk_wrong"} {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+mcp.Path, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != 401 || !strings.Contains(string(body), `"code":202`) {
			t.Errorf("key %q: %d %s", key, resp.StatusCode, body)
		}
	}
}

// TestReadToolsRefuseDuplicateMembers: get_order and wait_for_order refuse
// arguments that give a member twice, as create_order does; the last one
// won before, so {"order_id":A,"order_id":B} read order B.
func TestReadToolsRefuseDuplicateMembers(t *testing.T) {
	t.Parallel()
	_, cs := setupSession(t)
	a := call(t, cs, mcp.ToolCreateOrder, createArgs(order.NewRequestID(time.Now())), nil)
	b := call(t, cs, mcp.ToolCreateOrder, createArgs(order.NewRequestID(time.Now())), nil)
	if a.isError || b.isError {
		t.Fatalf("create: %s / %s", a.raw, b.raw)
	}
	ida, idb := a.result.Order.ID.String(), b.result.Order.ID.String()
	for _, c := range []struct{ tool, args string }{
		{mcp.ToolGetOrder, `{"order_id":"` + ida + `","order_id":"` + idb + `"}`},
		{mcp.ToolGetOrder, `{"request_id":"` + a.result.Order.RequestID + `","request_id":"` + b.result.Order.RequestID + `"}`},
		{mcp.ToolWaitForOrder, `{"order_id":"` + ida + `","order_id":"` + idb + `","timeout_seconds":1}`},
		{mcp.ToolWaitForOrder, `{"order_id":"` + ida + `","timeout_seconds":1,"timeout_seconds":2}`},
	} {
		r := call(t, cs, c.tool, json.RawMessage(c.args), nil)
		if !r.isError || r.problem.Code != 201 || !strings.Contains(r.raw, "twice") {
			t.Errorf("%s %s: %s, want code 201 naming the member given twice", c.tool, c.args, r.raw)
		}
	}
}

// TestMalformedMessagesGetJSONRPCErrors: a body that is not one JSON-RPC
// 2.0 message is answered 400 with a JSON-RPC error (Parse error or
// Invalid Request, with the message's id when it could be read) and runs
// nothing. Before, the SDK answered most of them in plain text, and
// accepted a message with an id but no method (202) and dropped it.
func TestMalformedMessagesGetJSONRPCErrors(t *testing.T) {
	t.Parallel()
	h := setup(t)
	_, srv := h.overHTTP(newProgress())
	args, _ := json.Marshal(createArgs(order.NewRequestID(time.Now())))
	call := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"create_order","arguments":` + string(args) + `}}`
	for _, c := range []struct {
		name, body string
		code       int
		id         string
	}{
		{"empty", "", -32700, "null"},
		{"white space", " \r\n\t ", -32700, "null"},
		{"not JSON", "not json", -32700, "null"},
		{"cut off", call[:len(call)-1], -32700, "null"},
		{"two messages", call + call, -32700, "null"},
		{"a string", `"tools/list"`, -32600, "null"},
		{"a number", `42`, -32600, "null"},
		{"a method that is a number", `{"jsonrpc":"2.0","id":1,"method":5}`, -32600, "null"},
		{"no version", `{"id":1,"method":"tools/list"}`, -32600, "1"},
		{"version 1.0", `{"jsonrpc":"1.0","id":"a","method":"tools/list"}`, -32600, `"a"`},
		{"an id and no method", `{"jsonrpc":"2.0","id":3}`, -32600, "3"},
		{"an object for an id", `{"jsonrpc":"2.0","id":{"x":1}}`, -32600, "null"},
	} {
		st, hdr, b := h.postMCP(srv, strings.NewReader(c.body))
		var got struct {
			JSONRPC string          `json:"jsonrpc"`
			ID      json.RawMessage `json:"id"`
			Error   struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if st != http.StatusBadRequest || hdr.Get("Content-Type") != "application/json" ||
			json.Unmarshal([]byte(b), &got) != nil || got.JSONRPC != "2.0" || got.Error.Code != c.code || string(got.ID) != c.id || got.Error.Message == "" {
			t.Errorf("%s: %d %s %s; want 400 and a JSON-RPC error %d with id %s", c.name, st, hdr.Get("Content-Type"), b, c.code, c.id)
		}
	}
	h.wantOrders(0)
	if st, _, b := h.postMCP(srv, strings.NewReader(call)); st != http.StatusOK || !strings.Contains(b, `"status":"processing"`) {
		t.Fatalf("a well-formed call after them: %d %s", st, b)
	}
	h.wantOrders(1)
}

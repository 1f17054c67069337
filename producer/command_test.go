package producer_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"orderpipe/producer"
	"orderpipe/producer/client"
	"orderpipe/producer/mcp"
	"orderpipe/shared/config"
	"orderpipe/shared/order"
	"orderpipe/shared/tooling/testenv"
)

func runProducer(t *testing.T, cfg config.Config, args ...string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	return testenv.RunCommand(ctx, producer.Command(), cfg, nil, nil, args...)
}

// Not parallel: it sets environment variables.
func TestProducerCommandLineAndEnvironment(t *testing.T) {
	testenv.WantUsageErrors(t, producer.Command(), config.Config{}, []string{"extra"}, []string{"--port", "1"})
	for _, kv := range [][2]string{
		{producer.EnvTimeout.Name, "soon"}, {producer.EnvTimeout.Name, "-1s"}, {producer.EnvRateLimit.Name, "0"},
		{producer.EnvRateLimit.Name, "fast"}, {producer.EnvRateBurst.Name, "-5"}, {producer.EnvMaxInFlight.Name, "0"},
		{producer.EnvMaxStreams.Name, "0"}, {producer.EnvMaxStreams.Name, "many"}, {producer.EnvMaxStreamsPerClient.Name, "-1"},
	} {
		t.Run(kv[0]+"="+kv[1], func(t *testing.T) {
			t.Setenv(kv[0], kv[1])
			err := runProducer(t, config.Config{})
			if err == nil || !strings.Contains(err.Error(), kv[0]) {
				t.Errorf("want an error naming %s, got %v", kv[0], err)
			}
		})
	}
	// Good environment, but nowhere to connect to.
	if err := runProducer(t, config.Config{}); err == nil || !strings.Contains(err.Error(), "DATABASE_URL") {
		t.Errorf("without DATABASE_URL: %v", err)
	}
	t.Setenv(producer.EnvTimeout.Name, "2s")
	t.Setenv(producer.EnvRateLimit.Name, "7")
	t.Setenv(producer.EnvMaxStreamsPerClient.Name, "3")
	o, err := producer.OptionsFromEnv()
	if err != nil || o.Timeout != 2*time.Second || o.RateLimit != 7 || o.RateBurst != producer.DefaultRateBurst ||
		o.MaxStreams != producer.DefaultMaxStreams || o.MaxStreamsPerClient != 3 {
		t.Errorf("OptionsFromEnv: %+v %v", o, err)
	}
}

// The dev part serves the intake on HTTP_ADDR and stops when its context
// ends.
func TestStart(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	n := testenv.NATS(t)
	env := testenv.Env(t, db, n)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	// Reserve a port for the part to listen on.
	probe := newServer(t, http.NotFoundHandler())
	addr := strings.TrimPrefix(probe.URL, "http://")
	probe.Close()
	env.Config.HTTPAddr = addr
	wait, err := producer.Start(ctx, env)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + addr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("healthz: %d", resp.StatusCode)
	}
	// The process serves the events stream and the MCP endpoint too,
	// behind the intake's authentication.
	h := &harness{t: t, env: env, pool: db.Pool, js: n.JS, topo: n.Topology, srv: &httptest.Server{URL: "http://" + addr}}
	h.creds = h.newClient("shop")
	r := h.post(orderBody("dev-part"))
	if r.status != 202 {
		t.Fatalf("POST: %d %s", r.status, r.body)
	}
	events := "/v1/orders/" + r.json(t)["order_id"].(string) + "/events"
	for _, path := range []string{events, "/mcp"} {
		if r := h.do("GET", path, "", "Authorization", "-"); r.status != http.StatusUnauthorized || r.code(t) != 202 {
			t.Errorf("GET %s without a key: %d %s", path, r.status, r.body)
		}
	}
	req, _ := http.NewRequest("GET", "http://"+addr+events, nil)
	req.Header.Set("Authorization", "Bearer "+h.creds.APIKey)
	stream, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Body.Close()
	if stream.StatusCode != 200 || !strings.HasPrefix(stream.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("events: %d %s", stream.StatusCode, stream.Header.Get("Content-Type"))
	}
	// Stopping ends the open stream at once; it does not hold the drain.
	t0 := time.Now()
	cancel()
	if err := wait(); err != nil {
		t.Fatalf("wait: %v", err)
	}
	if el := time.Since(t0); el > 4*time.Second {
		t.Fatalf("stopping with an open stream took %s", el)
	}
}

// TestStopAnswersAWaitForOrder: stopping the producer answers a
// wait_for_order in progress at once, as its wait had timed out (the order
// as it is, timed_out true: the agent calls again, on another replica),
// and the drain does not wait for it. Before, the call waited for its own
// timeout (60 s here), the drain (20 s) ran out and cut it off: the agent
// saw a dropped connection.
func TestStopAnswersAWaitForOrder(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	n := testenv.NATS(t)
	env := testenv.Env(t, db, n)
	env.Config.ShutdownTimeout = config.DefaultShutdownTimeout
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	var runErr error
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		runErr = producer.Run(ctx, env, l, producer.Options{})
	}()
	t.Cleanup(func() { cancel(); <-stopped })
	h := &harness{t: t, env: env, pool: db.Pool, js: n.JS, topo: n.Topology, srv: &httptest.Server{URL: "http://" + l.Addr().String()}}
	h.creds = h.newClient("agent")
	r := h.post(orderBody("waited-for"))
	if r.status != http.StatusAccepted {
		t.Fatalf("POST: %d %s", r.status, r.body)
	}
	orderID := r.json(t)["order_id"].(string) // no consumer runs: it stays processing

	progressed := make(chan struct{}, 1)
	cl := sdk.NewClient(&sdk.Implementation{Name: "test-agent", Version: "1"}, &sdk.ClientOptions{
		ProgressNotificationHandler: func(context.Context, *sdk.ProgressNotificationClientRequest) {
			select {
			case progressed <- struct{}{}:
			default:
			}
		},
	})
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	// The session outlives the server: not t.Context(), which ends first.
	cs, err := cl.Connect(context.Background(), &sdk.StreamableClientTransport{
		Endpoint: h.srv.URL + mcp.Path, HTTPClient: &http.Client{Transport: testenv.BearerTransport{Key: h.creds.APIKey, Next: tr}},
		MaxRetries: -1, DisableStandaloneSSE: true,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	type answer struct {
		res *sdk.CallToolResult
		err error
	}
	answered := make(chan answer, 1)
	go func() {
		params := &sdk.CallToolParams{Name: mcp.ToolWaitForOrder, Arguments: map[string]any{"order_id": orderID, "timeout_seconds": 60}}
		params.SetProgressToken("wait")
		cctx, ccancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer ccancel()
		res, err := cs.CallTool(cctx, params)
		answered <- answer{res, err}
	}()
	testenv.Receive(t, progressed, 20*time.Second, "wait_for_order to report progress")

	cancel()
	// The bound is the wait's 60 s, far less, and more than net/http's
	// grace for a connection that has not sent its first request: a
	// client's transport may have dialled one it did not use (more often
	// on a loaded machine), and Shutdown waits 5 to 6 s for it.
	testenv.Receive(t, stopped, 15*time.Second, "the producer to stop with a wait_for_order in progress")
	if runErr != nil {
		t.Fatalf("Run: %v", runErr)
	}
	a := testenv.Receive(t, answered, 5*time.Second, "the answer to wait_for_order")
	if a.err != nil || a.res == nil || a.res.IsError {
		t.Fatalf("wait_for_order at shutdown: %+v %v", a.res, a.err)
	}
	b, _ := json.Marshal(a.res.StructuredContent)
	var res mcp.OrderResult
	if err := json.Unmarshal(b, &res); err != nil || !res.TimedOut || res.Terminal || res.Order.ID.String() != orderID || res.Order.Status != order.StatusProcessing {
		t.Fatalf("wait_for_order at shutdown: %s (%v), want the order as it is with timed_out", b, err)
	}
}

// The client's defaults follow the server's deadline: an attempt outlasts
// it by the margin, and the budget holds several attempts.
func TestClientTimeoutsFollowTheServerDeadline(t *testing.T) {
	t.Parallel()
	if client.ServerTimeout != producer.DefaultTimeout {
		t.Fatalf("client assumes a %s server deadline, the intake's default is %s", client.ServerTimeout, producer.DefaultTimeout)
	}
	if client.DefaultAttemptTimeout <= producer.DefaultTimeout+producer.DefaultInlinePublishTimeout/2 || client.Margin < time.Second {
		t.Fatalf("attempt timeout %s leaves no margin over %s", client.DefaultAttemptTimeout, producer.DefaultTimeout)
	}
	if client.DefaultBudget < 3*client.DefaultAttemptTimeout {
		t.Fatalf("budget %s holds fewer than 3 attempts of %s", client.DefaultBudget, client.DefaultAttemptTimeout)
	}
	c := client.New("http://x", "k")
	if c.AttemptTimeout != client.DefaultAttemptTimeout || c.Budget != client.DefaultBudget {
		t.Fatalf("New: %+v", c)
	}
}

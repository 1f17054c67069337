package main

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"orderpipe/producer/client"
	"orderpipe/shared/app"
	"orderpipe/shared/config"
	"orderpipe/shared/tenant"
	"orderpipe/shared/tooling/testenv"
	"orderpipe/shared/tracing"
)

type hook struct {
	header http.Header
	body   map[string]any
	raw    []byte
}

// TestPipelineEndToEnd runs every part of `orderpipe dev` in this process
// against real servers, sends orders through the Go client with a callback
// URL, and checks what ops rely on: each order's trace id runs from the
// intake through every handler into the webhook request; every log line
// about an order names it (request_id, order_id, client_id, trace_id); and
// no secret ever reaches the log; and every event and webhook matches its
// published schema (checkContract).
func TestPipelineEndToEnd(t *testing.T) {
	db, n := testenv.DB(t), testenv.NATS(t)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) }) // t.Context() is done in a cleanup
	tracing.Install(tp)

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	cfg, err := config.FromEnv()
	if err != nil {
		t.Fatal(err)
	}
	cfg.DatabaseURL, cfg.NATSURL, cfg.HTTPAddr = db.URL, n.URL, addr
	cfg.AllowPrivateCallbacks, cfg.LogFormat, cfg.LogLevel, cfg.ShutdownTimeout = true, "json", "debug", 5*time.Second
	logs := &testenv.Buffer{}
	t.Cleanup(func() {
		if t.Failed() { // context.Background below: t.Context() is done in a cleanup
			t.Logf("process log:\n%s", logs.String())
			if st, err := n.JS.Stream(context.Background(), n.Topology.Stream); err == nil {
				info, _ := st.Info(context.Background())
				t.Logf("stream %s: %+v", n.Topology.Stream, info.State)
				for name := range st.ConsumerNames(context.Background()).Name() {
					ci, _ := st.Consumer(context.Background(), name)
					if ci != nil {
						t.Logf("consumer %s: %+v", name, ci.CachedInfo())
					}
				}
			}
		}
	})
	env := testenv.Env(t, db, n)
	env.Config, env.Logger = cfg, app.NewLogger(cfg, logs)

	// The parts live until stop (a cleanup) cancels them, after the
	// receiver and the other later cleanups: not t.Context(), which ends
	// before any cleanup runs.
	ctx, cancel := context.WithCancel(context.Background())
	var waits []func() error
	stop := func() {
		cancel()
		for _, w := range waits {
			if err := w(); err != nil && !strings.Contains(err.Error(), "context canceled") {
				t.Errorf("part stopped with: %v", err)
			}
		}
		waits = nil
	}
	t.Cleanup(stop)
	for _, p := range devParts() {
		if p.Seed != nil {
			if err := p.Seed(ctx, db.Pool); err != nil {
				t.Fatalf("seed %s: %v", p.Name, err)
			}
		}
	}
	for _, p := range devParts() {
		w, err := p.Start(ctx, env)
		if err != nil {
			t.Fatalf("start %s: %v", p.Name, err)
		}
		waits = append(waits, w)
	}

	var (
		mu    sync.Mutex
		hooks []hook
	)
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var body map[string]any
		_ = json.Unmarshal(b, &body)
		mu.Lock()
		hooks = append(hooks, hook{header: r.Header.Clone(), body: body, raw: b})
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(receiver.Close)

	creds, err := tenant.Create(ctx, db.Pool, "e2e")
	if err != nil {
		t.Fatal(err)
	}
	c := client.New("http://"+addr, creds.APIKey)
	const orders = 5
	ids := map[string]string{} // order_id → request_id
	for i := range orders {
		res, err := c.CreateOrder(ctx, client.OrderRequest{UserID: int64(i + 1), Items: []client.Item{{SKU: "SKU-1", Quantity: 1}},
			Amount: "10.00", Currency: "CNY", CallbackURL: receiver.URL + "/hooks"})
		if err != nil {
			t.Fatalf("create order %d: %v", i, err)
		}
		ids[res.Order.OrderID] = res.RequestID
	}
	testenv.WaitFor(t, 60*time.Second, "every order confirmed and its four webhooks delivered", func() bool {
		for id := range ids {
			o, err := c.GetOrder(ctx, id)
			if err != nil || o.Status != "confirmed" {
				return false
			}
		}
		mu.Lock()
		defer mu.Unlock()
		return len(hooks) >= orders*4
	})
	stop()

	// The contract: every event on the stream and every webhook received
	// match the AsyncAPI and OpenAPI documents.
	mu.Lock()
	checkContract(t, n, hooks, orders)
	mu.Unlock()

	// Traces: the intake's trace id for each order, from its log line.
	acceptedTrace := map[string]string{}
	var lines []map[string]any
	sc := bufio.NewScanner(strings.NewReader(logs.String()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("log line is not JSON: %q", sc.Text())
		}
		lines = append(lines, m)
		if m["msg"] == "order accepted" {
			acceptedTrace[fmt.Sprint(m["order_id"])] = fmt.Sprint(m["trace_id"])
		}
	}
	for id := range ids {
		tid := acceptedTrace[id]
		if tid == "" || tid == "<nil>" {
			t.Fatalf("no trace id logged for the acceptance of %s", id)
		}
		spanNames := map[string]bool{}
		for _, s := range exp.GetSpans() {
			if s.SpanContext.TraceID().String() == tid {
				spanNames[s.Name] = true
			}
		}
		if len(spanNames) < 4 {
			t.Errorf("order %s: trace %s has spans %v; want the intake's and every handler's", id, tid, spanNames)
		}
		mu.Lock()
		for _, h := range hooks {
			data, _ := h.body["data"].(map[string]any)
			if data == nil || fmt.Sprint(data["order_id"]) != id {
				continue
			}
			if tp := h.header.Get("traceparent"); !strings.Contains(tp, tid) {
				t.Errorf("order %s: webhook carries traceparent %q, want trace %s", id, tp, tid)
			}
		}
		mu.Unlock()
	}

	// Logs: every line about an order names it fully; no secret anywhere.
	for _, m := range lines {
		if _, about := m["order_id"]; !about {
			continue
		}
		for _, k := range []string{"request_id", "client_id", "trace_id"} {
			if v, ok := m[k]; !ok || v == "" {
				t.Errorf("log line about an order lacks %s: %v", k, m)
				break
			}
		}
	}
	all := logs.String()
	secretB64 := strings.TrimPrefix(creds.WebhookSecret, tenant.WebhookSecretPrefix)
	raw, _ := base64.StdEncoding.DecodeString(secretB64)
	for name, s := range map[string]string{"API key": creds.APIKey, "API key body": strings.TrimPrefix(creds.APIKey, tenant.APIKeyPrefix),
		"webhook secret": secretB64, "webhook secret (raw)": string(raw)} {
		if strings.Contains(all, s) {
			t.Errorf("the %s appears in the log", name)
		}
	}
	if len(lines) < orders {
		t.Fatalf("only %d log lines: the test would prove nothing", len(lines))
	}
}

package producer_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"orderpipe/producer"
	"orderpipe/producer/client"
	"orderpipe/shared/failpoint"
	"orderpipe/shared/natsjs"
	"orderpipe/shared/orderevent"
	"orderpipe/shared/outbox"
	"orderpipe/shared/tenant"
	"orderpipe/shared/tooling/testenv"
)

// child is an `orderpipe producer` process.
type child struct {
	cmd    *exec.Cmd
	addr   string
	exited chan struct{}
	err    error
	mu     sync.Mutex
	log    strings.Builder
}

// startProducer starts the producer with the given extra environment and
// returns once it listens.
func startProducer(t *testing.T, env ...string) *child {
	t.Helper()
	cmd := testenv.ChildCommand(nil, append([]string{"HTTP_ADDR=127.0.0.1:0", "ORDERPIPE_LOG_FORMAT=json", "ORDERPIPE_SHUTDOWN_TIMEOUT=5s"}, env...)...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, exited: make(chan struct{})}
	addrc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			c.mu.Lock()
			c.log.WriteString(line + "\n")
			c.mu.Unlock()
			var rec struct {
				Msg  string `json:"msg"`
				Addr string `json:"addr"`
			}
			if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "http server listening" {
				select {
				case addrc <- rec.Addr:
				default:
				}
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
		c.err = cmd.Wait()
		close(c.exited)
	}()
	testenv.KillAtEnd(t, cmd, c.exited, "producer", c.logText)
	select {
	case c.addr = <-addrc:
	case <-c.exited:
		t.Fatalf("producer exited at start (%v):\n%s", c.err, c.logText())
	case <-time.After(60 * time.Second):
		t.Fatalf("producer did not listen within 60s:\n%s", c.logText())
	}
	return c
}

func (c *child) logText() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.log.String()
}

func (c *child) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	testenv.WaitExited(t, c.exited, timeout, "producer")
	var ee *exec.ExitError
	if errors.As(c.err, &ee) {
		return ee.ExitCode()
	}
	if c.err != nil {
		t.Fatalf("producer: %v", c.err)
	}
	return 0
}

// The process dies after the commit and before the publish. The order is
// there, its event is in the outbox; the restarted producer's relay
// publishes it, once; the client's retry gets the order back as a replay.
func TestCrashAfterCommitBeforePublish(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	ns := testenv.OwnNATS(t)
	creds, err := tenant.Create(t.Context(), db.Pool, "shop")
	if err != nil {
		t.Fatal(err)
	}
	base := []string{"DATABASE_URL=" + db.URL, "NATS_URL=" + ns.URL()}

	p := startProducer(t, append(base, failpoint.EnvVar+"="+producer.FailAfterCommit+"=exit")...)
	body := orderBody("crash-1")
	req, _ := http.NewRequest("POST", "http://"+p.addr+"/v1/orders", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+creds.APIKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err == nil {
		resp.Body.Close()
		t.Fatalf("the producer answered %d; it should have died", resp.StatusCode)
	}
	if code := p.wait(t, 30*time.Second); code != failpoint.ExitCode {
		t.Fatalf("exit code %d, want %d", code, failpoint.ExitCode)
	}
	var orderID string
	if err := db.Pool.QueryRow(t.Context(), `SELECT order_id::text FROM orders WHERE request_id = 'crash-1'`).Scan(&orderID); err != nil {
		t.Fatalf("the committed order is not there: %v", err)
	}
	pending, err := outbox.Pending(t.Context(), db.Pool)
	if err != nil || pending != 1 {
		t.Fatalf("pending outbox rows: %d %v", pending, err)
	}
	_, js := testenv.Connect(t, ns.URL())
	subject := orderevent.DefaultTopology.Subject(orderevent.Accepted)
	if n := streamCount(t, js, orderevent.DefaultTopology.Stream, subject, orderID+":accepted"); n != 0 {
		t.Fatalf("%d accepted events before the restart", n)
	}

	p = startProducer(t, base...)
	testenv.WaitFor(t, 30*time.Second, "the relay to publish the accepted event", func() bool {
		n, err := outbox.Pending(t.Context(), db.Pool)
		return err == nil && n == 0
	})
	c := client.New("http://"+p.addr, creds.APIKey)
	res, err := c.CreateOrder(t.Context(), client.OrderRequest{RequestID: "crash-1", UserID: 42,
		Items: []client.Item{{SKU: "SKU-1", Quantity: 2}}, Amount: "39.98", Currency: "CNY"})
	if err != nil || !res.Replayed || res.Order.OrderID != orderID {
		t.Fatalf("retry after the crash: %+v %v", res, err)
	}
	if n := streamCount(t, js, orderevent.DefaultTopology.Stream, subject, orderID+":accepted"); n != 1 {
		t.Fatalf("%d accepted events in the stream, want exactly 1", n)
	}
	var orders int
	if err := db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM orders`).Scan(&orders); err != nil || orders != 1 {
		t.Fatalf("%d orders", orders)
	}

	// SIGTERM: the producer drains and exits cleanly.
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t, 20*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM", code)
	}
}

// NATS down refuses nothing: the order is committed and answered 202, its
// event waits in the outbox and goes out once NATS is back.
func TestNATSDownKeepsAccepting(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	ns := testenv.OwnNATS(t)
	nc, js := testenv.Connect(t, ns.URL())
	topo := orderevent.Topology{Stream: "NATSDOWN", Prefix: "natsdown"}
	if _, err := natsjs.EnsureStream(t.Context(), js, topo, 1); err != nil {
		t.Fatal(err)
	}
	env := testenv.Env(t, db, &testenv.NATSEnv{URL: ns.URL(), Topology: topo, Conn: nc, JS: js})
	h := &harness{t: t, env: env, pool: db.Pool, js: js, topo: topo}
	h.srv = newServer(t, producer.Handler(env, producer.Options{}))
	h.creds = h.newClient("shop")

	ns.Stop()
	testenv.WaitFor(t, 10*time.Second, "the client to notice NATS is gone", func() bool { return !nc.IsConnected() })
	t0 := time.Now()
	r := h.post(orderBody("while-nats-down"))
	if r.status != http.StatusAccepted {
		t.Fatalf("%d %s", r.status, r.body)
	}
	if el := time.Since(t0); el > 3*time.Second {
		t.Fatalf("accepting took %s with NATS down", el)
	}
	id := r.json(t)["order_id"].(string)
	if n, _ := outbox.Pending(t.Context(), db.Pool); n != 1 {
		t.Fatalf("%d pending events", n)
	}

	ns.Start()
	testenv.WaitFor(t, 30*time.Second, "the reconnect", nc.IsConnected)
	relay := &outbox.Relay{Pool: db.Pool, JS: js, Topology: topo, Logger: testenv.Logger(t)}
	testenv.WaitFor(t, 30*time.Second, "the relay to publish", func() bool {
		_, _ = relay.PublishPending(t.Context(), 0)
		n, err := outbox.Pending(t.Context(), db.Pool)
		return err == nil && n == 0
	})
	// A republish (relay died before stamping) is dropped by the broker.
	if _, err := db.Pool.Exec(t.Context(), `UPDATE outbox SET published_at = NULL`); err != nil {
		t.Fatal(err)
	}
	if _, err := relay.PublishPending(t.Context(), 0); err != nil {
		t.Fatal(err)
	}
	if n := streamCount(t, js, topo.Stream, topo.Subject(orderevent.Accepted), id+":accepted"); n != 1 {
		t.Fatalf("%d accepted events, want 1", n)
	}
}

// PostgreSQL down: 503 with a class 1 code and Retry-After; after the
// restart, the client's retry of the same request yields exactly one
// order.
func TestPostgresDownThenBack(t *testing.T) {
	t.Parallel()
	pg := testenv.Postgres(t)
	pool := testenv.Pool(t, pg.URL("postgres"))
	n := testenv.NATS(t)
	env := testenv.Env(t, nil, n)
	env.Pool = pool
	h := &harness{t: t, env: env, pool: pool, js: n.JS, topo: n.Topology}
	h.srv = newServer(t, producer.Handler(env, producer.Options{Timeout: 2 * time.Second}))
	h.creds = h.newClient("shop")

	if err := pg.Stop(); err != nil {
		t.Fatal(err)
	}
	r := h.post(orderBody("pg-down"))
	if r.status != http.StatusServiceUnavailable || r.code(t) != 101 || r.header.Get("Retry-After") == "" || r.json(t)["retryable"] != true {
		t.Fatalf("%d %v %s", r.status, r.header, r.body)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	if err := pg.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	c := client.New(h.srv.URL, h.creds.APIKey)
	c.BaseBackoff = 50 * time.Millisecond
	res, err := c.CreateOrder(ctx, client.OrderRequest{RequestID: "pg-down", UserID: 42,
		Items: []client.Item{{SKU: "SKU-1", Quantity: 2}}, Amount: "39.98", Currency: "CNY"})
	if err != nil {
		t.Fatalf("retry after the restart: %v", err)
	}
	if rows := h.count(`SELECT count(*) FROM orders WHERE request_id = 'pg-down'`); rows != 1 || res.Order.RequestID != "pg-down" {
		t.Fatalf("%d orders", rows)
	}
}

package consumers_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"orderpipe/consumers"
	"orderpipe/consumers/payment"
	"orderpipe/consumers/pipetest"
	"orderpipe/consumers/step"
	"orderpipe/shared/app"
	"orderpipe/shared/failpoint"
	"orderpipe/shared/order"
	"orderpipe/shared/orderevent"
	"orderpipe/shared/outbox"
	"orderpipe/shared/tooling/pspserver"
	"orderpipe/shared/tooling/testenv"
)

// lines are what every fault test orders: two SKUs, so "all or none" matters.
var lines = []pipetest.Line{{SKU: "SKU-1", Qty: 2}, {SKU: "SKU-2", Qty: 1}}

func stock(t *testing.T, e *pipetest.Env) {
	e.Stock(t, "SKU-1", 1000)
	e.Stock(t, "SKU-2", 1000)
}

// createOrders creates n orders of lines, each of amount.
func createOrders(t *testing.T, e *pipetest.Env, n int, amount string) {
	t.Helper()
	for range n {
		e.CreateOrder(t, amount, lines...)
	}
}

// waitConsumed waits until the durable consumer of e's stream has nothing
// pending and nothing delivered but unacknowledged.
func waitConsumed(t *testing.T, e *pipetest.Env, durable, what string) {
	t.Helper()
	testenv.WaitFor(t, 30*time.Second, what, func() bool {
		c, err := e.NATS.JS.Consumer(t.Context(), e.App.Topology.Stream, durable)
		if err != nil {
			return false
		}
		ci, err := c.Info(t.Context())
		return err == nil && ci.NumPending == 0 && ci.NumAckPending == 0
	})
}

// onOwnNATS is a stocked pipeline environment on a NATS server of the
// test's own (for tests that stop it or run `orderpipe consumers` on it).
func onOwnNATS(t *testing.T) (*testenv.NATSServer, *pipetest.Env) {
	t.Helper()
	ns := testenv.OwnNATS(t)
	e := pipetest.NewOn(t, testenv.DB(t), pipetest.OwnNATS(t, ns.URL()), pspserver.Options{})
	stock(t, e)
	return ns, e
}

// startConsumers runs `orderpipe consumers` as a child process on e's
// database and provider and on ns, with env added to its environment. The
// channel gets its exit.
func startConsumers(t *testing.T, e *pipetest.Env, ns *testenv.NATSServer, env ...string) (*exec.Cmd, *testenv.Buffer, <-chan error) {
	t.Helper()
	cmd := testenv.ChildCommand(nil, append([]string{
		"DATABASE_URL=" + e.DB.URL,
		"NATS_URL=" + ns.URL(),
		"PSP_URL=" + e.PSPURL,
		"HTTP_ADDR=127.0.0.1:0",
		"ORDERPIPE_LOG_LEVEL=warn",
	}, env...)...)
	out := &testenv.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	return cmd, out, done
}

// waitExit waits up to timeout for the child's exit and returns it; after
// that it kills the child and reports exited false.
func waitExit(t *testing.T, cmd *exec.Cmd, done <-chan error, timeout time.Duration) (exited bool, err error) {
	t.Helper()
	select {
	case err := <-done:
		return true, err
	case <-time.After(timeout):
		_ = cmd.Process.Kill()
		if err := <-done; err != nil {
			t.Logf("killed child: %v", err)
		}
		return false, nil
	}
}

// TestDuplicatesInjected republishes every message of the stream twice
// more, with new Nats-Msg-Ids so that the broker lets them through, and
// runs the outbox relay a second time over everything: every step sees
// each event at least three times.
func TestDuplicatesInjected(t *testing.T) {
	t.Parallel()
	e := pipetest.New(t, pspserver.Options{DeclineRate: 0.2, Seed: 7})
	stock(t, e)
	var copies atomic.Int64
	sub, err := e.NATS.Conn.Subscribe(e.App.Topology.AllSubjects(), func(m *nats.Msg) {
		if m.Header.Get("Test-Copy") != "" {
			return
		}
		for i := 1; i <= 2; i++ {
			c := &nats.Msg{Subject: m.Subject, Data: m.Data, Header: nats.Header{}}
			for k, v := range m.Header {
				c.Header[k] = v
			}
			id := fmt.Sprintf("%s:copy%d", m.Header.Get(orderevent.HeaderMsgID), i)
			c.Header.Set(orderevent.HeaderMsgID, id)
			c.Header.Set("Test-Copy", "1")
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			if _, err := e.NATS.JS.PublishMsg(ctx, c, jetstream.WithMsgID(id)); err == nil {
				copies.Add(1)
			}
			cancel()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	pipetest.Start(t, e.App, pipetest.Config(), e.Steps(5*time.Second)...)
	createOrders(t, e, 30, "12.34")
	e.WaitTerminal(t, 60*time.Second)
	// Publish every outbox row once more (a relay that lost its stamps).
	if _, err := e.DB.Pool.Exec(t.Context(), `UPDATE outbox SET published_at = NULL`); err != nil {
		t.Fatal(err)
	}
	if _, err := pipetest.Start(t, e.App, pipetest.Config(), e.Steps(5*time.Second)...).P.Relay().PublishPending(t.Context(), 0); err != nil {
		t.Fatal(err)
	}
	// The subscriber publishes its copies one after another, behind the
	// messages it receives: wait for them before waiting for the steps.
	testenv.WaitFor(t, 30*time.Second, "at least 60 copies injected", func() bool { return copies.Load() >= 60 })
	waitConsumed(t, e, "confirm", "the copies to be consumed")
	e.CheckInvariants(t)
}

// TestCrashAfterCommitAndAfterCharge kills `orderpipe consumers` (a child
// process) right after a step's commit, before its ack and before its
// inline publish; then a second one right after the provider charged and
// before the charge was recorded; then a healthy router finishes the
// orders: nothing is done twice, nothing is lost.
func TestCrashAfterCommitAndAfterCharge(t *testing.T) {
	t.Parallel()
	ns, e := onOwnNATS(t)
	var ids []uuid.UUID
	for range 5 {
		ids = append(ids, e.CreateOrder(t, "20.00", lines...))
	}
	crash := func(failpoints string) {
		t.Helper()
		cmd, out, done := startConsumers(t, e, ns, "ORDERPIPE_CONSUMER_ACK_WAIT=1s", failpoint.EnvVar+"="+failpoints)
		exited, err := waitExit(t, cmd, done, 60*time.Second)
		if !exited {
			t.Fatalf("child with %s did not reach its failpoint; output:\n%s", failpoints, out.String())
		}
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != failpoint.ExitCode {
			t.Fatalf("child with %s: %v, want exit %d; output:\n%s", failpoints, err, failpoint.ExitCode, out.String())
		}
	}
	crash(consumers.FailAfterCommit + "=exit")
	var committed int
	if err := e.DB.Pool.QueryRow(t.Context(), `SELECT count(*) FROM processed_messages`).Scan(&committed); err != nil || committed < 1 {
		t.Fatalf("after the first crash: %d dedupe rows (%v), want the one that committed before the crash", committed, err)
	}
	crash(payment.FailAfterCharge + "=exit")
	var charged int
	if err := e.DB.Pool.QueryRow(t.Context(), `SELECT count(*) FROM psp_charges WHERE state = 'succeeded'`).Scan(&charged); err != nil || charged < 1 {
		t.Fatalf("after the second crash: %d charges (%v), want at least 1", charged, err)
	}
	pipetest.Start(t, e.App, pipetest.Config(), e.Steps(5*time.Second)...)
	e.WaitTerminal(t, 90*time.Second)
	for _, id := range ids {
		if s := e.Status(t, id); s != order.StatusConfirmed {
			t.Errorf("order %s: %s, want confirmed", id, s)
		}
	}
	e.CheckInvariants(t)
}

// TestFailpointsInProcess arms both crash points to return an error once
// (the process survives): the commit stays, the message is retried, the
// dedupe row absorbs it, and the relay publishes what the inline publish
// skipped.
func TestFailpointsInProcess(t *testing.T) {
	// Not parallel: failpoints are per process.
	e := pipetest.New(t, pspserver.Options{})
	stock(t, e)
	defer failpoint.Enable(consumers.FailAfterCommit, 1)()
	defer failpoint.Enable(payment.FailAfterCharge, 1)()
	pipetest.Start(t, e.App, pipetest.Config(), e.Steps(5*time.Second)...)
	id := e.CreateOrder(t, "5.00", lines...)
	e.WaitTerminal(t, 30*time.Second)
	if s := e.Status(t, id); s != order.StatusConfirmed {
		t.Fatalf("order: %s, want confirmed", s)
	}
	e.CheckInvariants(t)
}

// TestNATSRestartedMidStream stops the NATS server (same store dir) while
// orders flow, creates orders while it is down (their events wait in the
// outbox), and starts it again.
func TestNATSRestartedMidStream(t *testing.T) {
	t.Parallel()
	ns, e := onOwnNATS(t)
	cfg := pipetest.Config()
	r := pipetest.Start(t, e.App, cfg, e.Steps(5*time.Second)...)
	r.P.Relay().Interval = 200 * time.Millisecond
	createOrders(t, e, 20, "3.00")
	ns.Stop()
	for range 10 {
		e.InsertOrder(t, "3.00", lines...) // published by the relay once NATS is back
	}
	ns.Start()
	createOrders(t, e, 20, "3.00")
	e.WaitTerminal(t, 90*time.Second)
	e.CheckInvariants(t)
}

// TestPostgresRestartedMidStream restarts the PostgreSQL server (the
// record, the dedupe rows and the provider's store) while orders flow.
func TestPostgresRestartedMidStream(t *testing.T) {
	t.Parallel()
	pg := testenv.Postgres(t)
	db := &testenv.Database{Name: "postgres", URL: pg.URL("postgres"), Pool: testenv.Pool(t, pg.URL("postgres"))}
	e := pipetest.NewOn(t, db, testenv.NATS(t), pspserver.Options{Latency: 5 * time.Millisecond})
	stock(t, e)
	pipetest.Start(t, e.App, pipetest.Config(), e.Steps(5*time.Second)...)
	createOrders(t, e, 30, "8.00")
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := pg.Restart(ctx); err != nil {
		t.Fatalf("restart PostgreSQL: %v", err)
	}
	createOrders(t, e, 10, "8.00")
	e.WaitTerminal(t, 120*time.Second)
	e.CheckInvariants(t)
}

// TestProviderDeclinesErrorsAndTimeouts runs orders against a provider
// that declines, fails and charges-then-times-out.
func TestProviderDeclinesErrorsAndTimeouts(t *testing.T) {
	t.Parallel()
	e := pipetest.New(t, pspserver.Options{DeclineRate: 0.25, ErrorRate: 0.25, TimeoutRate: 0.2, Hang: 5 * time.Second, Seed: 42})
	stock(t, e)
	pipetest.Start(t, e.App, pipetest.Config(), e.Steps(300*time.Millisecond)...)
	createOrders(t, e, 40, "1.50")
	e.WaitTerminal(t, 120*time.Second)
	c := e.Counts(t)
	if c[order.StatusCancelled] == 0 || c[order.StatusConfirmed] == 0 {
		t.Errorf("counts %v: want some cancelled (declined) and some confirmed", c)
	}
	var declinedReason int
	if err := e.DB.Pool.QueryRow(t.Context(), `SELECT count(*) FROM orders WHERE status = 'cancelled' AND reason LIKE 'payment declined:%'`).Scan(&declinedReason); err != nil {
		t.Fatal(err)
	}
	if declinedReason != c[order.StatusCancelled] {
		t.Errorf("%d of %d cancelled orders say why", declinedReason, c[order.StatusCancelled])
	}
	e.CheckInvariants(t)
}

// TestTwoRoutersOnTheSameDurables runs two routers (own connections, own
// pools, like two processes) on the same durable consumers.
func TestTwoRoutersOnTheSameDurables(t *testing.T) {
	t.Parallel()
	e := pipetest.New(t, pspserver.Options{Latency: 2 * time.Millisecond})
	stock(t, e)
	second := &app.Env{Config: e.App.Config, Logger: e.App.Logger, Topology: e.App.Topology, Metrics: app.NewRegistry()}
	second.NC, second.JS = testenv.Connect(t, e.NATS.URL)
	second.Pool = testenv.Pool(t, e.DB.URL)
	var handled [2]atomic.Int64
	counted := func(i int) []step.Step {
		steps := e.Steps(5 * time.Second)
		for j := range steps {
			if inner := steps[j].Prepare; inner != nil {
				steps[j].Prepare = func(ctx context.Context, m step.Message, c step.CommitIntent) error {
					handled[i].Add(1)
					return inner(ctx, m, c)
				}
				continue
			}
			if inner := steps[j].Batch; inner != nil {
				steps[j].Batch = func(ctx context.Context, tx pgx.Tx, ms []step.Message) ([]outbox.Row, error) {
					handled[i].Add(int64(len(ms)))
					return inner(ctx, tx, ms)
				}
				continue
			}
			inner := steps[j].Handle
			steps[j].Handle = func(ctx context.Context, m step.Message, c step.Commit) error {
				handled[i].Add(1)
				return inner(ctx, m, c)
			}
		}
		return steps
	}
	pipetest.Start(t, e.App, pipetest.Config(), counted(0)...)
	pipetest.Start(t, second, pipetest.Config(), counted(1)...)
	createOrders(t, e, 100, "4.00")
	e.WaitTerminal(t, 90*time.Second)
	if handled[0].Load() == 0 || handled[1].Load() == 0 {
		t.Errorf("work not shared: %d and %d messages handled", handled[0].Load(), handled[1].Load())
	}
	e.CheckInvariants(t)
}

// TestThousandOrders sends 1,000 orders through the whole pipeline with
// the provider at 5% declines and 5% errors.
func TestThousandOrders(t *testing.T) {
	t.Parallel()
	e := pipetest.New(t, pspserver.Options{DeclineRate: 0.05, ErrorRate: 0.05, Seed: 1000})
	e.Quiet(t)
	e.Stock(t, "SKU-1", 1_000_000)
	e.Stock(t, "SKU-2", 1_000_000)
	e.Stock(t, "SKU-3", 500) // runs out: some orders are rejected
	cfg := pipetest.Config()
	cfg.Workers = 16
	pipetest.Start(t, e.App, cfg, e.Steps(5*time.Second)...)
	t0 := time.Now()
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < 1000; i += 4 {
				if i%3 == 0 {
					e.CreateOrder(t, "99.99", pipetest.Line{SKU: "SKU-1", Qty: 1}, pipetest.Line{SKU: "SKU-3", Qty: 2})
				} else {
					e.CreateOrder(t, "19.99", lines...)
				}
			}
		}()
	}
	wg.Wait()
	e.WaitTerminal(t, 120*time.Second)
	c := e.Counts(t)
	t.Logf("1000 orders in %s: %v", time.Since(t0).Round(time.Millisecond), c)
	if c[order.StatusConfirmed] < 700 || c[order.StatusCancelled] == 0 || c[order.StatusRejected] == 0 {
		t.Errorf("counts %v: want most confirmed, some cancelled (declines) and some rejected (SKU-3 ran out)", c)
	}
	e.CheckInvariants(t)
}

// TestCommandDrainsOnSIGTERM runs `orderpipe consumers` as a child process,
// lets it work, and stops it with SIGTERM: it drains and exits 0.
func TestCommandDrainsOnSIGTERM(t *testing.T) {
	t.Parallel()
	ns, e := onOwnNATS(t)
	cmd, out, done := startConsumers(t, e, ns, "ORDERPIPE_SHUTDOWN_TIMEOUT=10s")
	createOrders(t, e, 10, "2.00")
	e.WaitTerminal(t, 60*time.Second)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	exited, err := waitExit(t, cmd, done, 30*time.Second)
	if !exited {
		t.Fatalf("consumers did not stop within 30s of SIGTERM; output:\n%s", out.String())
	}
	if err != nil {
		t.Fatalf("consumers after SIGTERM: %v; output:\n%s", err, out.String())
	}
	e.CheckInvariants(t)
}

// TestConsumersStopWhenTheirAddressIsTaken: `orderpipe consumers` whose
// HTTP_ADDR cannot be bound exits with an error at start, as the other
// processes do, instead of running without /healthz, /readyz and /metrics
// (probes and scrapes would then reach whatever holds the port).
func TestConsumersStopWhenTheirAddressIsTaken(t *testing.T) {
	t.Parallel()
	ns, e := onOwnNATS(t)
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	cmd, out, done := startConsumers(t, e, ns, "HTTP_ADDR="+held.Addr().String(), "ORDERPIPE_SHUTDOWN_TIMEOUT=5s")
	// Generous: under a loaded machine the child's start (connections,
	// provisioning) and its drain take a while; before the fix it never
	// exited at all.
	exited, err := waitExit(t, cmd, done, 60*time.Second)
	if !exited {
		t.Fatalf("consumers kept running without their HTTP address:\n%s", out.String())
	}
	if err == nil || !strings.Contains(out.String(), "address already in use") {
		t.Fatalf("consumers exited with %v, want an error naming the taken address:\n%s", err, out.String())
	}
}

// TestTheDrainIsBoundedOnce: at shutdown the pipeline waits for in-flight
// messages for the drain timeout once, however many steps still hold one;
// it does not wait the timeout again for each step's consumer after the
// router's own wait.
func TestTheDrainIsBoundedOnce(t *testing.T) {
	t.Parallel()
	e := pipetest.New(t, pspserver.Options{})
	release := make(chan struct{})
	var once sync.Once
	letGo := func() { once.Do(func() { close(release) }) }
	t.Cleanup(letGo) // also when the test fails before it lets them go
	started := make(chan string, 8)
	hold := func(name string) step.Step {
		return step.Step{Name: name, Events: []orderevent.Name{orderevent.Accepted}, Handle: func(ctx context.Context, m step.Message, commit step.Commit) error {
			started <- name
			<-release // a handler that outlives any drain
			return nil
		}}
	}
	cfg := pipetest.Config()
	cfg.DrainTimeout = 2 * time.Second
	r := pipetest.Start(t, e.App, cfg, hold("hold-a"), hold("hold-b"), hold("hold-c"))
	ev := orderevent.Event{Version: orderevent.Version, Name: orderevent.Accepted, OrderID: uuid.New(), ClientID: e.ClientID,
		RequestID: "req-1", Status: orderevent.Accepted.Status(), OccurredAt: time.Now().UTC()}
	b, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	publishRaw(t, e, e.App.Topology.Subject(orderevent.Accepted), b, "")
	for range 3 {
		testenv.Receive(t, started, 30*time.Second, "each step to hold the message")
	}
	t0 := time.Now()
	r.Stop(t)
	took := time.Since(t0)
	// The held messages are settled before the test ends, so that nothing
	// logs to it afterwards.
	letGo()
	if err := consumers.WaitSettled(r.P, 30*time.Second); err != nil {
		t.Error(err)
	}
	// Three steps each waiting a whole drain timeout after the router's
	// took four.
	if took > 2*cfg.DrainTimeout {
		t.Fatalf("the drain took %s with a drain timeout of %s", took.Round(time.Millisecond), cfg.DrainTimeout)
	}
}

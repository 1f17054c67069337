package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"orderpipe/shared/orderevent"
	"orderpipe/shared/tooling/testenv"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(runChild())
	}
	testenv.Main(m)
}

// childEnv marks this test binary running as the subscriber program for the
// crash test (the pattern of the compensator's and the consumers' crash
// tests: the child runs the same run() as main).
const childEnv = "SUBSCRIBER_TEST_CHILD"

// parkEnv makes the child stop after its k-th commit, before that
// message's ack, print parkedMarker and wait to be killed.
const parkEnv = "SUBSCRIBER_TEST_PARK_AFTER"

const parkedMarker = "PARKED after commit, before ack:"

func runChild() int {
	if k, _ := strconv.Atoi(os.Getenv(parkEnv)); k > 0 {
		commits := 0
		afterCommit = func(msgID string) {
			commits++ // messages are handled one at a time
			if commits == k {
				fmt.Printf("%s %s\n", parkedMarker, msgID)
				<-make(chan struct{}) // until kill -9
			}
		}
	}
	// The child process runs no test: it has no t.Context().
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return run(ctx, os.Args[1:], os.Getenv, os.Stderr)
}

func noEnv(string) string { return "" }

// argsFor points the subscriber at the test's database and stream.
func argsFor(db *testenv.Database, n *testenv.NATSEnv, durable string, extra ...string) []string {
	return append([]string{
		"--database-url", db.URL, "--nats-url", n.URL,
		"--stream", n.Topology.Stream, "--subject-prefix", n.Topology.Prefix,
		"--durable", durable,
	}, extra...)
}

// startInProcess runs the program in this process until the test ends; it
// must then stop cleanly with exit code 0.
func startInProcess(t *testing.T, args ...string) *testenv.Buffer {
	t.Helper()
	logs := &testenv.Buffer{}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan int, 1)
	go func() { done <- run(ctx, args, noEnv, logs) }()
	t.Cleanup(func() {
		cancel()
		select {
		case code := <-done:
			if code != exitOK {
				t.Errorf("subscriber exited %d", code)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("subscriber did not stop within 30s of its context ending")
		}
		if t.Failed() {
			t.Logf("subscriber log:\n%s", logs.String())
		}
	})
	return logs
}

// child is the program running as a child process.
type child struct {
	cmd  *exec.Cmd
	out  *testenv.Buffer
	done chan struct{}
	err  error
}

func startChild(t *testing.T, env []string, args ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(append(os.Environ(), childEnv+"=1"), env...)
	c := &child{cmd: cmd, out: &testenv.Buffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = c.out, c.out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { c.err = cmd.Wait(); close(c.done) }()
	testenv.KillAtEnd(t, cmd, c.done, fmt.Sprintf("child %v", env), c.out.String)
	return c
}

// wait returns the child's exit status once it ended.
func (c *child) wait(t *testing.T, timeout time.Duration) syscall.WaitStatus {
	t.Helper()
	testenv.WaitExited(t, c.done, timeout, "child")
	var ee *exec.ExitError
	if c.err != nil && !errors.As(c.err, &ee) {
		t.Fatalf("child: %v", c.err)
	}
	return c.cmd.ProcessState.Sys().(syscall.WaitStatus)
}

// publish sends ev as orderpipe's relay does: its subject, its headers.
func publish(t *testing.T, n *testenv.NATSEnv, ev orderevent.Event) *jetstream.PubAck {
	t.Helper()
	data, err := orderevent.Encode(ev)
	if err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg(n.Topology.Subject(ev.Name))
	m.Data = data
	for k, v := range ev.Headers() {
		m.Header.Set(k, v)
	}
	return publishMsg(t, n, m)
}

func publishMsg(t *testing.T, n *testenv.NATSEnv, m *nats.Msg) *jetstream.PubAck {
	t.Helper()
	ack, err := n.JS.PublishMsg(t.Context(), m)
	if err != nil {
		t.Fatalf("publish: %v", err)
	}
	return ack
}

func count(t *testing.T, pool *pgxpool.Pool, query string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(t.Context(), query, args...).Scan(&n); err != nil {
		// The tables appear when the subscriber starts.
		if strings.Contains(err.Error(), "does not exist") {
			return -1
		}
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

func consumerInfo(t *testing.T, n *testenv.NATSEnv, durable string) *jetstream.ConsumerInfo {
	t.Helper()
	c, err := n.JS.Consumer(t.Context(), n.Topology.Stream, durable)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return info
}

// settled reports whether the consumer exists and holds nothing pending
// and nothing delivered-but-unacked.
func settled(t *testing.T, n *testenv.NATSEnv, durable string) bool {
	info := consumerInfo(t, n, durable)
	return info != nil && info.NumPending == 0 && info.NumAckPending == 0
}

// checkOneShipmentEach fails unless every order in ids has exactly one
// shipment and there is no other.
func checkOneShipmentEach(t *testing.T, pool *pgxpool.Pool, ids []uuid.UUID) {
	t.Helper()
	rows, err := pool.Query(t.Context(), `SELECT order_id, count(*) FROM shipments GROUP BY order_id`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[uuid.UUID]int{}
	for rows.Next() {
		var id uuid.UUID
		var c int
		if err := rows.Scan(&id, &c); err != nil {
			t.Fatal(err)
		}
		got[id] = c
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if got[id] != 1 {
			t.Errorf("order %s: %d shipments, want 1", id, got[id])
		}
		delete(got, id)
	}
	for id, c := range got {
		t.Errorf("unexpected order %s: %d shipments", id, c)
	}
}

// Each confirmed event is applied once, including a copy with the same
// Nats-Msg-Id that the broker let through because its duplicate window had
// passed; other events of the stream are not seen at all.
func TestEachConfirmedEventOnce(t *testing.T) {
	t.Parallel()
	db, n := testenv.EmptyDB(t), testenv.NATS(t)
	// The broker's window is 2 h in production; shorten it so that a
	// republish gets past the broker and only the dedupe table can stop it.
	s, err := n.JS.Stream(t.Context(), n.Topology.Stream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.Duplicates = 100 * time.Millisecond
	if _, err := n.JS.UpdateStream(t.Context(), cfg); err != nil {
		t.Fatal(err)
	}

	var evs []orderevent.Event
	var ids []uuid.UUID
	for range 5 {
		ev := testenv.Event(orderevent.Confirmed)
		evs, ids = append(evs, ev), append(ids, ev.OrderID)
		publish(t, n, ev)
	}
	other := testenv.Event(orderevent.Confirmed)
	other.Name, other.Status = orderevent.Accepted, orderevent.Accepted.Status()
	publish(t, n, other) // orders.accepted: not this subscriber's

	logs := startInProcess(t, argsFor(db, n, "shipping", "--ack-wait", "5s")...)
	testenv.WaitFor(t, 30*time.Second, "five shipments", func() bool {
		return count(t, db.Pool, `SELECT count(*) FROM shipments`) == 5 && settled(t, n, "shipping")
	})

	// Republish the first event with its id until the broker stores it
	// (it drops it as a duplicate until its window passed).
	var dup *jetstream.PubAck
	testenv.WaitFor(t, 10*time.Second, "the broker to take a republish with a known Nats-Msg-Id", func() bool {
		dup = publish(t, n, evs[0])
		return !dup.Duplicate
	})
	testenv.WaitFor(t, 30*time.Second, "the republished copy to be acked", func() bool {
		info := consumerInfo(t, n, "shipping")
		return info.Delivered.Stream >= dup.Sequence && info.NumAckPending == 0 && info.NumPending == 0
	})
	// The line is written once the broker confirmed the ack, which the
	// consumer's info may show first.
	testenv.WaitFor(t, 10*time.Second, "a log line for the duplicate "+evs[0].MsgID(), func() bool {
		return strings.Contains(logs.String(), `"msg":"duplicate acked without effect"`) &&
			strings.Contains(logs.String(), evs[0].MsgID())
	})
	// The same change published again under other ids, as orderpipe does:
	// the compensator's re-notify of a final event the broker lost
	// (`:r1`, redrive 1 in the payload), an operator's dead-letter replay
	// (`:dlq7.1`). Each is the same confirmation: no second shipment.
	again := evs[1]
	again.Redrive = 1
	last := publish(t, n, again)
	data, err := orderevent.Encode(evs[2])
	if err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg(n.Topology.Subject(orderevent.Confirmed))
	m.Data = data
	for k, v := range evs[2].Headers() {
		m.Header.Set(k, v)
	}
	m.Header.Set(orderevent.HeaderMsgID, evs[2].MsgID()+":dlq7.1")
	if ack := publishMsg(t, n, m); ack.Sequence > last.Sequence {
		last = ack
	}
	testenv.WaitFor(t, 30*time.Second, "the re-notified and replayed copies to be acked", func() bool {
		info := consumerInfo(t, n, "shipping")
		return info.Delivered.Stream >= last.Sequence && info.NumAckPending == 0 && info.NumPending == 0
	})
	if c := count(t, db.Pool, `SELECT count(*) FROM subscriber_processed_messages`); c != 5 {
		t.Errorf("processed rows: %d, want 5", c)
	}
	checkOneShipmentEach(t, db.Pool, ids)
}

// The process is killed with -9 in the middle of its second batch, after a
// message's commit and before its ack, with the rest of the batch delivered
// and not yet handled. Restarted, it applies the rest; the committed,
// unacked message comes back and is acked as a duplicate; every order has
// exactly one shipment. SIGTERM then stops it with exit code 0.
func TestKilledMidBatchNoDoubleEffect(t *testing.T) {
	t.Parallel()
	db, n := testenv.EmptyDB(t), testenv.NATS(t)
	const total, batch, parkAt = 25, 10, 13
	var ids []uuid.UUID
	for range total {
		ev := testenv.Event(orderevent.Confirmed)
		ids = append(ids, ev.OrderID)
		publish(t, n, ev)
	}
	args := argsFor(db, n, "shipping", "--batch", strconv.Itoa(batch), "--ack-wait", "1s")

	first := startChild(t, []string{parkEnv + "=" + strconv.Itoa(parkAt)}, args...)
	marker := regexp.MustCompile(regexp.QuoteMeta(parkedMarker) + ` (\S+)`)
	var parkedID string
	testenv.WaitFor(t, 60*time.Second, "the child to park after its 13th commit", func() bool {
		if m := marker.FindStringSubmatch(first.out.String()); m != nil {
			parkedID = m[1]
			return true
		}
		select {
		case <-first.done:
			t.Fatalf("child exited before parking: %v", first.err)
		default:
		}
		return false
	})
	if c := count(t, db.Pool, `SELECT count(*) FROM subscriber_processed_messages`); c != parkAt {
		t.Fatalf("processed rows at the kill: %d, want %d", c, parkAt)
	}
	if c := count(t, db.Pool, `SELECT count(*) FROM shipments`); c != parkAt {
		t.Fatalf("shipments at the kill: %d, want %d", c, parkAt)
	}
	if info := consumerInfo(t, n, "shipping"); info.NumAckPending != 2*batch-parkAt+1 {
		t.Errorf("unacked at the kill: %d, want %d (the parked message and the rest of its batch)", info.NumAckPending, 2*batch-parkAt+1)
	}

	if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if ws := first.wait(t, 30*time.Second); !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("first child: %v, want killed by SIGKILL", ws)
	}

	second := startChild(t, nil, args...)
	testenv.WaitFor(t, 60*time.Second, "every event processed after the restart", func() bool {
		return count(t, db.Pool, `SELECT count(*) FROM subscriber_processed_messages`) == total && settled(t, n, "shipping")
	})
	testenv.WaitFor(t, 10*time.Second, "the log line of the acked duplicate", func() bool {
		for line := range strings.SplitSeq(second.out.String(), "\n") {
			if strings.Contains(line, `"msg":"duplicate acked without effect"`) && strings.Contains(line, parkedID) {
				return true
			}
		}
		return false
	})
	if err := second.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if ws := second.wait(t, 30*time.Second); ws.Signaled() || ws.ExitStatus() != exitOK {
		t.Errorf("second child after SIGTERM: %v, want exit 0", ws)
	}
	if c := count(t, db.Pool, `SELECT count(*) FROM shipments`); c != total {
		t.Errorf("shipments: %d, want %d", c, total)
	}
	checkOneShipmentEach(t, db.Pool, ids)
}

// Messages that can never be processed are terminated with a log line:
// not applied, not left pending for redelivery. A good one after them is.
func TestMalformedMessagesAreTerminated(t *testing.T) {
	t.Parallel()
	db, n := testenv.EmptyDB(t), testenv.NATS(t)
	subject := n.Topology.Subject(orderevent.Confirmed)
	raw := func(id string, data []byte) *nats.Msg {
		m := nats.NewMsg(subject)
		m.Data = data
		if id != "" {
			m.Header.Set(orderevent.HeaderMsgID, id)
		}
		return m
	}
	good := testenv.Event(orderevent.Confirmed)
	wrongEvent := testenv.Event(orderevent.Confirmed)
	wrongEvent.Name, wrongEvent.Status = orderevent.Paid, orderevent.Paid.Status()
	wrongData, _ := orderevent.Encode(wrongEvent)
	noHeaderData, _ := orderevent.Encode(testenv.Event(orderevent.Confirmed))
	future := strings.Replace(string(noHeaderData), `"version":1`, `"version":2`, 1)
	bad := []*nats.Msg{
		raw("bad-json", []byte("{not json")),
		raw("wrong-event", wrongData),
		raw("", noHeaderData),
		raw("future-version", []byte(future)),
		raw("empty", nil),
	}
	for _, m := range bad {
		publishMsg(t, n, m)
	}
	publish(t, n, good)

	logs := startInProcess(t, argsFor(db, n, "shipping", "--ack-wait", "1s", "--max-deliver", "50")...)
	testenv.WaitFor(t, 30*time.Second, "the good event applied and the bad ones settled", func() bool {
		return count(t, db.Pool, `SELECT count(*) FROM shipments`) == 1 && settled(t, n, "shipping")
	})
	if got := strings.Count(logs.String(), `"msg":"malformed message terminated"`); got != len(bad) {
		t.Errorf("%d malformed-message log lines, want %d", got, len(bad))
	}
	if c := count(t, db.Pool, `SELECT count(*) FROM subscriber_processed_messages`); c != 1 {
		t.Errorf("processed rows: %d, want 1 (the good event)", c)
	}
	checkOneShipmentEach(t, db.Pool, []uuid.UUID{good.OrderID})
}

// The effect and the processed row commit together or not at all: an
// effect that fails leaves no processed row, so the redelivery applies it;
// a second apply of the same id does nothing.
func TestApplyIsOneTransaction(t *testing.T) {
	t.Parallel()
	db := testenv.EmptyDB(t)
	ctx := t.Context()
	if err := createSchema(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	if err := createSchema(ctx, db.Pool); err != nil {
		t.Fatalf("second createSchema: %v", err)
	}
	s := &subscriber{pool: db.Pool}
	ev := testenv.Event(orderevent.Confirmed)

	if _, err := db.Pool.Exec(ctx, `ALTER TABLE shipments RENAME TO shipments_away`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.apply(ctx, eventKey(ev), ev.MsgID(), ev); err == nil {
		t.Fatal("apply without its effect table: no error")
	}
	if c := count(t, db.Pool, `SELECT count(*) FROM subscriber_processed_messages`); c != 0 {
		t.Fatalf("a failed effect left %d processed rows", c)
	}
	if _, err := db.Pool.Exec(ctx, `ALTER TABLE shipments_away RENAME TO shipments`); err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{true, false} {
		applied, err := s.apply(ctx, eventKey(ev), ev.MsgID(), ev)
		if err != nil || applied != want {
			t.Fatalf("apply #%d: %v, %v; want %v", i+1, applied, err, want)
		}
	}
	checkOneShipmentEach(t, db.Pool, []uuid.UUID{ev.OrderID})
}

func TestDecode(t *testing.T) {
	t.Parallel()
	good := testenv.Event(orderevent.Confirmed)
	goodData, _ := orderevent.Encode(good)
	if ev, err := decode(good.MsgID(), goodData); err != nil || ev.OrderID != good.OrderID {
		t.Fatalf("decode a good event: %v, %v", ev, err)
	}
	rejected := testenv.Event(orderevent.Confirmed)
	rejected.Name, rejected.Status = orderevent.Rejected, orderevent.Rejected.Status()
	rejectedData, _ := orderevent.Encode(rejected)
	for _, tc := range []struct {
		name, id string
		data     []byte
	}{
		{"no msg id", "", goodData},
		{"not JSON", "x", []byte("<xml/>")},
		{"empty", "x", nil},
		{"other event", "x", rejectedData},
		{"missing order id", "x", []byte(strings.Replace(string(goodData), good.OrderID.String(), uuid.Nil.String(), 1))},
		{"unknown version", "x", []byte(strings.Replace(string(goodData), `"version":1`, `"version":9`, 1))},
	} {
		if _, err := decode(tc.id, tc.data); !errors.Is(err, orderevent.ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", tc.name, err)
		}
	}
}

func TestBadFlagsAndEnvironment(t *testing.T) {
	t.Parallel()
	db := "postgres://u@127.0.0.1:5432/db"
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"no database", nil, nil, "--database-url (or DATABASE_URL) is required"},
		{"bad database URL", []string{"--database-url", "postgres://h:notaport/db"}, nil, "--database-url: not a PostgreSQL URL"},
		{"unknown flag", []string{"--database-url", db, "--nope"}, nil, "flag provided but not defined: -nope"},
		{"flag twice", []string{"--database-url", db, "--batch", "5", "--batch=7"}, nil, `invalid value "7" for flag -batch: given twice`},
		{"argument", []string{"--database-url", db, "run"}, nil, `unexpected argument "run"`},
		{"batch zero", []string{"--database-url", db, "--batch", "0"}, nil, "--batch 0: want 1..1000"},
		{"batch word", []string{"--database-url", db, "--batch", "ten"}, nil, `invalid value "ten" for flag -batch`},
		{"batch env", nil, map[string]string{envDatabaseURL: db, envBatch: "ten"}, `SUBSCRIBER_BATCH="ten": not a whole number`},
		{"ack wait short", []string{"--database-url", db, "--ack-wait", "10ms"}, nil, "--ack-wait 10ms: want at least 1s"},
		{"ack wait env", nil, map[string]string{envDatabaseURL: db, envAckWait: "soon"}, `SUBSCRIBER_ACK_WAIT="soon": not a duration`},
		{"fetch wait", []string{"--database-url", db, "--fetch-wait", "0s"}, nil, "--fetch-wait 0s: want 100ms..1m"},
		{"max deliver", []string{"--database-url", db, "--max-deliver", "0"}, nil, "--max-deliver 0: want at least 1"},
		{"durable with a dot", []string{"--database-url", db, "--durable", "ship.ping"}, nil, `--durable "ship.ping"`},
		{"empty stream", []string{"--database-url", db, "--stream", ""}, nil, `--stream ""`},
		{"prefix wildcard", []string{"--database-url", db, "--subject-prefix", "orders.*"}, nil, `--subject-prefix "orders.*"`},
		{"nats scheme", []string{"--database-url", db, "--nats-url", "http://127.0.0.1:4222"}, nil, `scheme "http"`},
		{"nats empty", nil, map[string]string{envDatabaseURL: db, envNATSURL: " "}, "--nats-url: empty"},
		{"nats no host", []string{"--database-url", db, "--nats-url", "nats://a:4222,b"}, nil, `"b" is not a URL`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var out testenv.Buffer
			getenv := func(k string) string { return tc.env[k] }
			if code := run(t.Context(), tc.args, getenv, &out); code != exitUsage {
				t.Errorf("exit %d, want %d; output:\n%s", code, exitUsage, out.String())
			}
			if !strings.Contains(out.String(), tc.want) {
				t.Errorf("output %q does not say %q", out.String(), tc.want)
			}
			if strings.Contains(out.String(), "notaport") && tc.name == "bad database URL" {
				t.Errorf("the error echoes the database URL: %q", out.String())
			}
		})
	}
}

func TestFlagsWinOverEnvironment(t *testing.T) {
	t.Parallel()
	env := map[string]string{envDatabaseURL: "postgres://env/db", envDurable: "from-env", envBatch: "7", envAckWait: "3s"}
	cfg, err := parseConfig([]string{"--durable", "from-flag"}, func(k string) string { return env[k] }, &testenv.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.durable != "from-flag" || cfg.batch != 7 || cfg.ackWait != 3*time.Second || cfg.databaseURL != "postgres://env/db" {
		t.Errorf("config %+v", cfg)
	}
	if cfg.stream != orderevent.DefaultTopology.Stream || cfg.prefix != orderevent.DefaultTopology.Prefix {
		t.Errorf("default topology: %s %s", cfg.stream, cfg.prefix)
	}
	var out testenv.Buffer
	if code := run(t.Context(), []string{"-h"}, noEnv, &out); code != exitOK || !strings.Contains(out.String(), "-durable") ||
		!strings.Contains(out.String(), "(default 30s)") || strings.Contains(out.String(), "panic") {
		t.Errorf("-h: exit %d, output %q", code, out.String())
	}
}

// A database it cannot reach stops the program with exit code 1 and says
// why.
func TestUnreachableDatabase(t *testing.T) {
	t.Parallel()
	var out testenv.Buffer
	code := run(t.Context(), []string{"--database-url", "postgres://u@127.0.0.1:1/db?connect_timeout=5"}, noEnv, &out)
	if code != exitError || !strings.Contains(out.String(), "create schema") {
		t.Errorf("exit %d, output %q", code, out.String())
	}
}

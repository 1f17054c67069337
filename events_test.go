package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"orderpipe/shared/config"
	"orderpipe/shared/orderevent"
	"orderpipe/shared/tooling/testenv"
)

// Malformed command lines are refused with a clear message and exit code
// 2, before any connection to NATS.
func TestEventsTailRefusesBadFlags(t *testing.T) {
	cleanEnv(t)
	t.Setenv(config.EnvNATSURL, "nats://127.0.0.1:1") // never dialled
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"events"}, "want a subcommand"},
		{[]string{"events", "follow"}, `unknown subcommand "follow"`},
		{[]string{"events", "asyncapi", "x"}, "takes no arguments"},
		{[]string{"events", "tail", "extra"}, `unexpected argument "extra"`},
		{[]string{"events", "tail", "--subject", "orders.shipped"}, `unknown subject "orders.shipped": want one of orders.accepted,`},
		{[]string{"events", "tail", "--subject", "paid"}, `unknown subject "paid"`},
		{[]string{"events", "tail", "--subject", "orders.>"}, `unknown subject "orders.>"`},
		{[]string{"events", "tail", "--subject", ""}, "--subject is empty"},
		{[]string{"events", "tail", "--from-seq", "-1"}, "--from-seq must be a stream sequence ≥ 1, got -1"},
		{[]string{"events", "tail", "--from-seq", "0"}, "--from-seq must be a stream sequence ≥ 1, got 0"},
		{[]string{"events", "tail", "--from-seq", "x"}, `invalid value "x" for flag -from-seq`},
		{[]string{"events", "tail", "--since", "-5m"}, "--since must be a positive duration"},
		{[]string{"events", "tail", "--since", "10"}, `invalid value "10" for flag -since`},
		{[]string{"events", "tail", "--from-seq", "3", "--since", "10m"}, "--from-seq or --since, not both"},
		{[]string{"events", "tail", "--order", "42"}, `--order "42" is not an order id`},
		{[]string{"events", "tail", "--order", uuid.Nil.String()}, "is not an order id"},
		{[]string{"events", "tail", "--count", "-1"}, "count must be positive or 0"},
		{[]string{"events", "tail", "--prefix", ""}, "--stream and --prefix must not be empty"},
		{[]string{"events", "tail", "--verbose"}, "flag provided but not defined: -verbose"},
	} {
		code, out, errOut := orderpipe(t, c.args...)
		if code != 2 || !strings.Contains(errOut, c.want) || out != "" {
			t.Errorf("orderpipe %q: exit %d, stdout %q, stderr %q; want 2 and %q", c.args, code, out, errOut, c.want)
		}
	}
	if code, out, _ := orderpipe(t, "events", "tail", "-h"); code != 0 || !strings.Contains(out, "-from-seq") {
		t.Errorf("events tail -h: exit %d, %q", code, out)
	}
}

// `events asyncapi` prints the embedded document.
func TestEventsAsyncAPI(t *testing.T) {
	cleanEnv(t)
	code, out, errOut := orderpipe(t, "events", "asyncapi")
	if code != 0 || out != string(orderevent.AsyncAPI()) || !strings.HasPrefix(out, "#") || errOut != "" {
		t.Fatalf("events asyncapi: exit %d, stderr %q, %d bytes", code, errOut, len(out))
	}
}

// tailRun is one `orderpipe events tail` running in the background.
type tailRun struct {
	stdout, stderr *testenv.Buffer
	code           chan int
}

func startTail(t *testing.T, n *testenv.NATSEnv, args ...string) *tailRun {
	t.Helper()
	r := &tailRun{stdout: &testenv.Buffer{}, stderr: &testenv.Buffer{}, code: make(chan int, 1)}
	args = append([]string{"events", "tail", "--stream", n.Topology.Stream, "--prefix", n.Topology.Prefix}, args...)
	go func() { r.code <- run(args, r.stdout, r.stderr) }()
	testenv.WaitFor(t, 10*time.Second, "the tail follows the stream", func() bool {
		return strings.Contains(r.stderr.String(), "following "+n.Topology.Stream)
	})
	return r
}

// wait returns the exit code once the run stopped (after its --count).
func (r *tailRun) wait(t *testing.T) int {
	t.Helper()
	select {
	case c := <-r.code:
		return c
	case <-time.After(20 * time.Second):
		t.Fatalf("the tail did not stop after its --count; stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
		return -1
	}
}

func publish(t *testing.T, n *testenv.NATSEnv, e orderevent.Event) {
	t.Helper()
	b, err := orderevent.Encode(e)
	if err != nil {
		t.Fatal(err)
	}
	m := &nats.Msg{Subject: n.Topology.Subject(e.Name), Data: b, Header: nats.Header{}}
	for k, v := range e.Headers() {
		m.Header.Set(k, v)
	}
	m.Header.Set("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	if _, err := n.JS.PublishMsg(t.Context(), m, jetstream.WithMsgID(e.MsgID())); err != nil {
		t.Fatal(err)
	}
}

func event(id uuid.UUID, name orderevent.Name) orderevent.Event {
	return orderevent.Event{Version: orderevent.Version, Name: name, OrderID: id, ClientID: uuid.New(), RequestID: "tail-1",
		Status: name.Status(), OccurredAt: time.Now().UTC()}
}

func records(t *testing.T, out string) []orderevent.TailRecord {
	t.Helper()
	var rs []orderevent.TailRecord
	dec := json.NewDecoder(strings.NewReader(out))
	for dec.More() {
		var r orderevent.TailRecord
		if err := dec.Decode(&r); err != nil {
			t.Fatalf("tail --json printed %q: %v", out, err)
		}
		rs = append(rs, r)
	}
	return rs
}

// The tail prints the events published while it runs (not the earlier
// ones), with their headers, decoded; it filters by order and subject; and
// --from-seq and --since start in the past.
func TestEventsTail(t *testing.T) {
	cleanEnv(t)
	n := testenv.NATS(t)
	t.Setenv(config.EnvNATSURL, n.URL)
	a, b := uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())
	publish(t, n, event(a, orderevent.Accepted)) // before any tail: seq 1

	// Default: new messages only, every subject, JSON.
	all := startTail(t, n, "--json", "--count", "3")
	// Filtered: order a, subject paid, text.
	only := startTail(t, n, "--order", a.String(), "--subject", n.Topology.Subject(orderevent.Paid), "--count", "1")
	publish(t, n, event(b, orderevent.Paid))     // seq 2: not a
	publish(t, n, event(a, orderevent.Reserved)) // seq 3: not paid
	publish(t, n, event(a, orderevent.Paid))     // seq 4: the one
	if code := all.wait(t); code != 0 {
		t.Fatalf("tail exit %d: %s", code, all.stderr)
	}
	rs := records(t, all.stdout.String())
	if len(rs) != 3 {
		t.Fatalf("tail --count 3 printed %d records:\n%s", len(rs), all.stdout)
	}
	for i, want := range []struct {
		seq   uint64
		order uuid.UUID
		name  orderevent.Name
	}{{2, b, orderevent.Paid}, {3, a, orderevent.Reserved}, {4, a, orderevent.Paid}} {
		r := rs[i]
		if r.Seq != want.seq || r.Event == nil || r.Event.OrderID != want.order || r.Event.Name != want.name ||
			r.Subject != n.Topology.Subject(want.name) || r.Time.IsZero() {
			t.Errorf("record %d: %+v, want seq %d %s of %s", i, r, want.seq, want.name, want.order)
			continue
		}
		if r.Headers[orderevent.HeaderMsgID] != r.Event.MsgID() || r.Headers[orderevent.HeaderOrderID] != want.order.String() ||
			r.Headers["traceparent"] == "" {
			t.Errorf("record %d: headers %v", i, r.Headers)
		}
	}
	if code := only.wait(t); code != 0 {
		t.Fatalf("filtered tail exit %d: %s", code, only.stderr)
	}
	text := only.stdout.String()
	if strings.Count(text, "\n#") != 0 || !strings.HasPrefix(text, "#4 ") ||
		!strings.Contains(text, n.Topology.Subject(orderevent.Paid)+" order="+a.String()+" status=paid") ||
		!strings.Contains(text, "    "+orderevent.HeaderMsgID+": "+orderevent.MsgID(a, orderevent.Paid, 0)+"\n") ||
		!strings.Contains(text, "    traceparent: 00-") {
		t.Errorf("filtered tail printed:\n%s", text)
	}
	if !strings.Contains(only.stderr.String(), "from new messages, order "+a.String()) {
		t.Errorf("filtered tail said: %s", only.stderr)
	}

	// From the past: a sequence, a time.
	for _, args := range [][]string{{"--from-seq", "3"}, {"--since", "1h", "--order", a.String()}} {
		code, out, errOut := orderpipe(t, append([]string{"events", "tail", "--stream", n.Topology.Stream, "--prefix",
			n.Topology.Prefix, "--json", "--count", "2"}, args...)...)
		rs := records(t, out)
		if code != 0 || len(rs) != 2 {
			t.Fatalf("tail %v: exit %d, stderr %s, %d records", args, code, errOut, len(rs))
		}
		want := []uint64{3, 4}
		if args[0] == "--since" {
			want = []uint64{1, 3} // order a's
		}
		if rs[0].Seq != want[0] || rs[1].Seq != want[1] {
			t.Errorf("tail %v: sequences %d, %d; want %v", args, rs[0].Seq, rs[1].Seq, want)
		}
	}
}

// A malformed payload is printed with its error, not skipped or fatal; a
// missing stream is a clear error.
func TestEventsTailMalformedAndMissing(t *testing.T) {
	cleanEnv(t)
	n := testenv.NATS(t)
	t.Setenv(config.EnvNATSURL, n.URL)
	if _, err := n.JS.Publish(t.Context(), n.Topology.Subject(orderevent.Paid), []byte(`{"version":9}`)); err != nil {
		t.Fatal(err)
	}
	publish(t, n, event(uuid.New(), orderevent.Confirmed))
	code, out, errOut := orderpipe(t, "events", "tail", "--stream", n.Topology.Stream, "--prefix", n.Topology.Prefix, "--from-seq", "1", "--count", "2")
	if code != 0 || !strings.Contains(out, "#1 ") || !strings.Contains(out, `MALFORMED (malformed order event: unknown version 9) payload="{\"version\":9}"`) ||
		!strings.Contains(out, "#2 ") || !strings.Contains(out, "status=confirmed") {
		t.Errorf("exit %d, stderr %s, stdout:\n%s", code, errOut, out)
	}
	var jb bytes.Buffer
	code = run([]string{"events", "tail", "--stream", n.Topology.Stream, "--prefix", n.Topology.Prefix, "--from-seq", "1", "--count", "1", "--json"}, &jb, &bytes.Buffer{})
	if rs := records(t, jb.String()); code != 0 || len(rs) != 1 || rs[0].Event != nil || rs[0].Raw != `{"version":9}` || rs[0].Error == "" {
		t.Errorf("--json of a malformed payload: exit %d, %s", code, jb.String())
	}

	code, _, errOut = orderpipe(t, "events", "tail", "--stream", "NO_SUCH_"+n.Topology.Stream, "--prefix", n.Topology.Prefix)
	if code != 1 || !strings.Contains(errOut, "stream NO_SUCH_"+n.Topology.Stream+" not found") {
		t.Errorf("a missing stream: exit %d, %q", code, errOut)
	}
}

// The README's "Subscribing to order events" names every subject and
// header the code defines.
func TestReadmeDocumentsTheEvents(t *testing.T) {
	_, sec, ok := strings.Cut(readFile(t, "README.md"), "\n## Subscribing to order events\n")
	if !ok {
		t.Fatal("README.md has no section Subscribing to order events")
	}
	sec, _, _ = strings.Cut(sec, "\n## ")
	var want []string
	for _, n := range orderevent.Names() {
		want = append(want, "`"+orderevent.DefaultTopology.Subject(n)+"`")
	}
	want = append(want, orderevent.HeaderMsgID, orderevent.HeaderOrderID, orderevent.HeaderClientID, orderevent.HeaderRequestID,
		orderevent.HeaderEvent, "traceparent", "shared/orderevent/asyncapi.yaml", "orderpipe events tail", "examples/subscriber/")
	for _, w := range want {
		if !strings.Contains(sec, w) {
			t.Errorf("the README's subscribing section does not mention %s", w)
		}
	}
}

// An unreachable broker is a clear error, not a hang.
func TestEventsTailUnreachableBroker(t *testing.T) {
	cleanEnv(t)
	t.Setenv(config.EnvNATSURL, "nats://127.0.0.1:1")
	code, out, errOut := orderpipe(t, "events", "tail")
	if code != 1 || out != "" || !strings.Contains(errOut, "follow stream ORDERS: the broker is unreachable") {
		t.Errorf("exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

// Without NATS_URL, tail says so at once instead of dialling a default
// address (the stream named here exists nowhere, so a tail that dialled a
// broker would fail on it rather than wait).
func TestEventsTailWithoutNATSURL(t *testing.T) {
	cleanEnv(t)
	code, out, errOut := orderpipe(t, "events", "tail", "--stream", "NO_SUCH_STREAM_"+strings.ReplaceAll(uuid.NewString(), "-", ""))
	if code != 1 || out != "" || !strings.Contains(errOut, "missing environment: NATS_URL must be set") {
		t.Errorf("exit %d, stdout %q, stderr %q; want 1 naming NATS_URL", code, out, errOut)
	}
}

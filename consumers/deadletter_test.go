package consumers_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"orderpipe/consumers"
	"orderpipe/consumers/pipetest"
	"orderpipe/shared/cli"
	"orderpipe/shared/config"
	"orderpipe/shared/order"
	"orderpipe/shared/orderevent"
	"orderpipe/shared/orderevent/contract"
	"orderpipe/shared/tooling/pspserver"
	"orderpipe/shared/tooling/testenv"
)

func publishRaw(t *testing.T, e *pipetest.Env, subject string, data []byte, orderID string) {
	t.Helper()
	id := "raw-" + uuid.NewString()
	m := &nats.Msg{Subject: subject, Data: data, Header: nats.Header{}}
	m.Header.Set(orderevent.HeaderMsgID, id)
	if orderID != "" {
		m.Header.Set(orderevent.HeaderOrderID, orderID)
	}
	if _, err := e.NATS.JS.PublishMsg(t.Context(), m, jetstream.WithMsgID(id)); err != nil {
		t.Fatal(err)
	}
}

func deadLetters(t *testing.T, e *pipetest.Env) []consumers.DeadLetter {
	t.Helper()
	dls, err := consumers.ListDeadLetters(t.Context(), e.DB.Pool, true, 1000)
	if err != nil {
		t.Fatal(err)
	}
	return dls
}

// TestMalformedPayloads sends every step payloads it can never process:
// each ends in the dead letters (with the step's name), acked, and
// nothing else changes.
func TestMalformedPayloads(t *testing.T) {
	t.Parallel()
	e := pipetest.New(t, pspserver.Options{})
	stock(t, e)
	pipetest.Start(t, e.App, pipetest.Config(), e.Steps(time.Second)...)
	valid := func(name orderevent.Name, mutate func(*orderevent.Event)) []byte {
		ev := orderevent.Event{Version: orderevent.Version, Name: name, OrderID: uuid.New(), ClientID: e.ClientID,
			RequestID: "req-1", Status: name.Status(), OccurredAt: time.Now().UTC()}
		if mutate != nil {
			mutate(&ev)
		}
		b, _ := json.Marshal(ev)
		return b
	}
	steps := map[string]orderevent.Name{"inventory": orderevent.Accepted, "payment": orderevent.Reserved, "confirm": orderevent.Paid}
	cases := map[string]func(orderevent.Name) []byte{
		"not json":        func(orderevent.Name) []byte { return []byte("not json") },
		"empty":           func(orderevent.Name) []byte { return nil },
		"unknown version": func(n orderevent.Name) []byte { return valid(n, func(ev *orderevent.Event) { ev.Version = 99 }) },
		"missing order":   func(n orderevent.Name) []byte { return valid(n, func(ev *orderevent.Event) { ev.OrderID = uuid.Nil }) },
		"bad request id": func(n orderevent.Name) []byte {
			return valid(n, func(ev *orderevent.Event) { ev.RequestID = "no spaces" })
		},
		"other event":   func(orderevent.Name) []byte { return valid(orderevent.Confirmed, nil) },
		"unknown order": func(n orderevent.Name) []byte { return valid(n, nil) },
	}
	want := map[string]int{}
	for stepName, ev := range steps {
		for range cases {
			want[stepName]++
		}
		for _, mk := range cases {
			publishRaw(t, e, e.App.Topology.Subject(ev), mk(ev), "")
		}
	}
	testenv.WaitFor(t, 60*time.Second, "every malformed message dead-lettered", func() bool {
		return len(deadLetters(t, e)) == len(steps)*len(cases)
	})
	got := map[string]int{}
	for _, d := range deadLetters(t, e) {
		got[d.Consumer]++
		if d.Error == "" || d.Subject == "" || d.Attempts < 1 {
			t.Errorf("dead letter %+v lacks its error, subject or attempts", d)
		}
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %d dead letters, want %d", k, got[k], v)
		}
	}
	var n int
	if err := e.DB.Pool.QueryRow(t.Context(), `SELECT (SELECT count(*) FROM orders) + (SELECT count(*) FROM processed_messages) + (SELECT count(*) FROM psp_charges)`).Scan(&n); err != nil || n != 0 {
		t.Errorf("malformed messages changed something: %d rows (%v)", n, err)
	}
}

// TestPoisonOrderLeftThenReplayed: an order whose row the stock step cannot
// read is dead-lettered and left in processing (for the compensator); once
// an operator fixed it, `dlq replay` gets it through, and a second replay
// changes nothing.
func TestPoisonOrderLeftThenReplayed(t *testing.T) {
	t.Parallel()
	e := pipetest.New(t, pspserver.Options{})
	stock(t, e)
	pipetest.Start(t, e.App, pipetest.Config(), e.Steps(time.Second)...)
	id := e.CreateOrder(t, "9.00") // no lines: the stock step cannot reserve it
	good := e.CreateOrder(t, "9.00", lines...)
	testenv.WaitFor(t, 30*time.Second, "the poison message dead-lettered", func() bool { return len(deadLetters(t, e)) == 1 })
	dl := deadLetters(t, e)[0]
	if dl.Consumer != "inventory" || dl.OrderID == nil || *dl.OrderID != id || !strings.Contains(dl.Error, "no items") {
		t.Fatalf("dead letter %+v", dl)
	}
	testenv.WaitFor(t, 30*time.Second, "the good order confirmed", func() bool { return e.Status(t, good) == order.StatusConfirmed })
	if s := e.Status(t, id); s != order.StatusProcessing {
		t.Fatalf("poisoned order: %s, want left in processing", s)
	}
	if _, err := e.DB.Pool.Exec(t.Context(), `UPDATE orders SET items = '[{"sku":"SKU-1","quantity":1}]' WHERE order_id = $1`, id); err != nil {
		t.Fatal(err)
	}
	// Replay through the command, as an operator would.
	var out bytes.Buffer
	err := runCmd(t, consumers.DLQCommand(), config.Config{DatabaseURL: e.DB.URL, NATSURL: e.NATS.URL, ShutdownTimeout: time.Second}, &out, "replay", fmt.Sprint(dl.ID))
	if err != nil {
		t.Fatalf("dlq replay: %v", err)
	}
	if !strings.Contains(out.String(), ":dlq") {
		t.Fatalf("dlq replay printed %q", out.String())
	}
	testenv.WaitFor(t, 30*time.Second, "the replayed order confirmed", func() bool { return e.Status(t, id) == order.StatusConfirmed })
	if _, err := consumers.ReplayDeadLetter(t.Context(), e.DB.Pool, e.NATS.JS, dl.ID); err != nil {
		t.Fatal(err)
	}
	got, err := consumers.GetDeadLetter(t.Context(), e.DB.Pool, dl.ID)
	if err != nil || got.Replays != 2 || got.ReplayedAt == nil {
		t.Fatalf("after two replays: %+v, %v", got, err)
	}
	waitConsumed(t, e, "inventory", "the second replay consumed")
	e.CheckInvariants(t)
	// The replays match the published contract (Nats-Msg-Id
	// <id>:dlq<letter>.<n>, Orderpipe-Replay-Of).
	ev, err := contract.DefaultEvents()
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := ev.ValidateStream(t.Context(), e.NATS.JS, e.App.Topology)
	if err != nil {
		t.Error(err)
	}
	replays := 0
	for _, m := range msgs {
		if m.Header.Get(orderevent.HeaderReplayOf) == fmt.Sprint(dl.ID) {
			replays++
		}
	}
	if replays != 2 {
		t.Errorf("the stream holds %d replays of dead letter %d, want 2", replays, dl.ID)
	}
	out.Reset()
	if err := runCmd(t, consumers.DLQCommand(), config.Config{DatabaseURL: e.DB.URL}, &out, "list", "--all"); err != nil || !strings.Contains(out.String(), "inventory") {
		t.Fatalf("dlq list: %v\n%s", err, out.String())
	}
	out.Reset()
	if err := runCmd(t, consumers.DLQCommand(), config.Config{DatabaseURL: e.DB.URL}, &out, "--json", "--all", "list"); err != nil {
		t.Fatal(err)
	}
	var d consumers.DeadLetter
	if err := json.Unmarshal(out.Bytes(), &d); err != nil || d.ID != dl.ID {
		t.Fatalf("dlq list --json: %v, %q", err, out.String())
	}
	out.Reset()
	if err := runCmd(t, consumers.DLQCommand(), config.Config{DatabaseURL: e.DB.URL}, &out, "list"); err != nil || strings.Contains(out.String(), "inventory") {
		t.Fatalf("dlq list without --all shows replayed letters: %v\n%s", err, out.String())
	}
}

// TestRetriesExhausted: a provider that never answers exhausts the
// deliveries; the message is dead-lettered, the order left reserved; with
// the provider back, a replay gets it through.
func TestRetriesExhausted(t *testing.T) {
	t.Parallel()
	e := pipetest.New(t, pspserver.Options{})
	stock(t, e)
	cfg := pipetest.Config()
	cfg.MaxDeliver = 3
	down := *e
	down.PSPURL = "http://127.0.0.1:1" // nothing listens there
	r := pipetest.Start(t, e.App, cfg, down.Steps(200*time.Millisecond)...)
	id := e.CreateOrder(t, "6.00", lines...)
	testenv.WaitFor(t, 30*time.Second, "the payment dead-lettered", func() bool { return len(deadLetters(t, e)) == 1 })
	dl := deadLetters(t, e)[0]
	if dl.Consumer != "payment" || dl.Attempts != 3 || !strings.Contains(dl.Error, "retries exhausted") {
		t.Fatalf("dead letter %+v", dl)
	}
	if s := e.Status(t, id); s != order.StatusReserved {
		t.Fatalf("order: %s, want left reserved", s)
	}
	r.Stop(t)
	pipetest.Start(t, e.App, pipetest.Config(), e.Steps(5*time.Second)...)
	if _, err := consumers.ReplayDeadLetter(t.Context(), e.DB.Pool, e.NATS.JS, dl.ID); err != nil {
		t.Fatal(err)
	}
	e.WaitTerminal(t, 30*time.Second)
	if s := e.Status(t, id); s != order.StatusConfirmed {
		t.Fatalf("order after replay: %s, want confirmed", s)
	}
	e.CheckInvariants(t)
}

func runCmd(t *testing.T, cmd cli.Command, cfg config.Config, out io.Writer, args ...string) error {
	t.Helper()
	return testenv.RunCommand(t.Context(), cmd, cfg, out, nil, args...)
}

// TestCommandsRefuseBadArguments checks the command lines before any
// connection is made (an empty config would fail otherwise).
func TestCommandsRefuseBadArguments(t *testing.T) {
	t.Parallel()
	cases := []struct {
		cmd  cli.Command
		args []string
	}{
		{consumers.DLQCommand(), nil},
		{consumers.DLQCommand(), []string{"nuke"}},
		{consumers.DLQCommand(), []string{"replay"}},
		{consumers.DLQCommand(), []string{"replay", "abc"}},
		{consumers.DLQCommand(), []string{"replay", "0"}},
		{consumers.DLQCommand(), []string{"replay", "-3"}},
		{consumers.DLQCommand(), []string{"replay", "1", "2"}},
		{consumers.DLQCommand(), []string{"list", "extra"}},
		{consumers.DLQCommand(), []string{"--limit", "0", "list"}},
		{consumers.DLQCommand(), []string{"--limit", "many", "list"}},
		{consumers.DLQCommand(), []string{"list", "--limit", "0"}},
		{consumers.DLQCommand(), []string{"list", "--nope"}},
		{consumers.DLQCommand(), []string{"list", "--all", "extra"}},
		{consumers.DLQCommand(), []string{"--all", "replay", "1"}}, // list's flags, not replay's
		{consumers.DLQCommand(), []string{"--json", "replay", "1"}},
		{consumers.DLQCommand(), []string{"--limit", "5", "replay", "1"}},
		{consumers.InventoryCommand(), nil},
		{consumers.InventoryCommand(), []string{"get"}},
		{consumers.InventoryCommand(), []string{"set"}},
		{consumers.InventoryCommand(), []string{"set", "SKU-1"}},
		{consumers.InventoryCommand(), []string{"set", "SKU-1", "-5"}},
		{consumers.InventoryCommand(), []string{"set", "SKU-1", "lots"}},
		{consumers.InventoryCommand(), []string{"set", "SKU 1", "5"}},
		{consumers.InventoryCommand(), []string{"set", "SKU:1", "5"}}, // no order can name it
		{consumers.InventoryCommand(), []string{"set", strings.Repeat("S", 65), "5"}},
		{consumers.InventoryCommand(), []string{"set", "SKU-1", "5", "6"}},
		{consumers.InventoryCommand(), []string{"list", "x"}},
		{consumers.Command(), []string{"extra"}},
	}
	for _, tc := range cases {
		testenv.WantUsageErrors(t, tc.cmd, config.Config{}, tc.args)
	}
	// Well-formed, but no database configured: an error naming the variable.
	if err := runCmd(t, consumers.InventoryCommand(), config.Config{}, io.Discard, "list"); err == nil || !strings.Contains(err.Error(), "DATABASE_URL") {
		t.Errorf("inventory list without DATABASE_URL: %v", err)
	}
}

func TestInventoryCommand(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	cfg := config.Config{DatabaseURL: db.URL}
	var out bytes.Buffer
	if err := runCmd(t, consumers.InventoryCommand(), cfg, &out, "set", "SKU-9", "12"); err != nil {
		t.Fatal(err)
	}
	if err := runCmd(t, consumers.InventoryCommand(), cfg, &out, "set", "SKU-10", "0"); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := runCmd(t, consumers.InventoryCommand(), cfg, &out, "list"); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "SKU-9") || !strings.Contains(out.String(), "12") || !strings.Contains(out.String(), "SKU-10") {
		t.Fatalf("list:\n%s", out.String())
	}
}

// TestMalformedHeadersAreDeadLettered: a message that can never be
// processed, whose id and headers hold bytes PostgreSQL's text and jsonb
// refuse (NUL, invalid UTF-8), is dead-lettered like any other: its
// payload exactly, its id and headers with those bytes replaced. Storing
// it failed at every delivery, so after the last one it was gone,
// neither processed nor kept.
func TestMalformedHeadersAreDeadLettered(t *testing.T) {
	t.Parallel()
	e := pipetest.New(t, pspserver.Options{})
	stock(t, e)
	pipetest.Start(t, e.App, pipetest.Config(), e.Steps(time.Second)...)
	id := "raw-\x00-" + uuid.NewString()
	m := &nats.Msg{Subject: e.App.Topology.Subject(orderevent.Accepted), Data: []byte("not json \x00\xff"), Header: nats.Header{}}
	m.Header.Set(orderevent.HeaderMsgID, id)
	m.Header.Set("X-Nul", "a\x00b")
	m.Header.Set("X-Latin1", "caf\xe9")
	if _, err := e.NATS.JS.PublishMsg(t.Context(), m, jetstream.WithMsgID(id)); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 60*time.Second, "the message dead-lettered", func() bool {
		return len(deadLetters(t, e)) == 1
	})
	d := deadLetters(t, e)[0]
	if string(d.Payload) != "not json \x00\xff" {
		t.Errorf("payload %q, want the message's bytes exactly", d.Payload)
	}
	if d.MessageID != "raw-\uFFFD-"+id[len("raw-\x00-"):] || d.Headers["X-Nul"] != "a\uFFFDb" || d.Headers["X-Latin1"] != "caf\uFFFD" {
		t.Errorf("id %q, headers %q: want the refused bytes replaced with U+FFFD", d.MessageID, d.Headers)
	}
}

// TestDeadLetterOutlivesAPostgresOutage: a message that fails for good
// while PostgreSQL is down, across its last allowed delivery, is
// dead-lettered once PostgreSQL is back. It is acked only after its dead
// letter is stored; the broker does not drop it at MaxDeliver.
func TestDeadLetterOutlivesAPostgresOutage(t *testing.T) {
	t.Parallel()
	pg := testenv.Postgres(t)
	db := &testenv.Database{Name: "postgres", URL: pg.URL("postgres"), Pool: testenv.Pool(t, pg.URL("postgres"))}
	e := pipetest.NewOn(t, db, testenv.NATS(t), pspserver.Options{})
	cfg := pipetest.Config()
	cfg.MaxDeliver = 2
	pipetest.Start(t, e.App, cfg, e.Steps(time.Second)...)
	// The broker gives up on a message at its consumer's MaxDeliver and
	// says so in an advisory; past it, deliveries go on.
	var gaveUp atomic.Bool
	sub, err := e.NATS.Conn.Subscribe("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES."+e.App.Topology.Stream+".>", func(*nats.Msg) { gaveUp.Store(true) })
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	stream, err := e.NATS.JS.Stream(t.Context(), e.App.Topology.Stream)
	if err != nil {
		t.Fatal(err)
	}
	delivered := func() int {
		most := 0
		for c := range stream.ListConsumers(t.Context()).Info() {
			most = max(most, int(c.Delivered.Consumer))
		}
		return most
	}

	if err := pg.Stop(); err != nil {
		t.Fatal(err)
	}
	publishRaw(t, e, e.App.Topology.Subject(orderevent.Accepted), []byte("not json"), "")
	testenv.WaitFor(t, 60*time.Second, "the message's last allowed delivery over", func() bool {
		return gaveUp.Load() || delivered() > cfg.MaxDeliver
	})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := pg.Restart(ctx); err != nil {
		t.Fatalf("start PostgreSQL again: %v", err)
	}
	testenv.WaitFor(t, 60*time.Second, "the dead letter stored once PostgreSQL is back", func() bool {
		var n int
		err := e.DB.Pool.QueryRow(t.Context(), `SELECT count(*) FROM dead_letters`).Scan(&n)
		return err == nil && n > 0
	})
	dls := deadLetters(t, e)
	if len(dls) != 1 || dls[0].Consumer != "inventory" || string(dls[0].Payload) != "not json" || dls[0].Attempts <= cfg.MaxDeliver {
		t.Fatalf("dead letters %+v, want the message once, after its last allowed delivery", dls)
	}
}

// TestADeadLetterIsStoredOncePerCopy: a message is acked only after its
// dead letter is stored, so a lost ack brings the same copy back; storing
// it again returns the first dead letter. Another copy of the message (the
// relay's republish, at another stream sequence) is a dead letter of its own.
func TestADeadLetterIsStoredOncePerCopy(t *testing.T) {
	t.Parallel()
	e := pipetest.New(t, pspserver.Options{})
	first, fresh, err := consumers.PutDeadLetter(t.Context(), e.App, "inventory", "m-1", 7, []byte("x"))
	if err != nil || !fresh {
		t.Fatalf("first store: %v (new: %v)", err, fresh)
	}
	again, fresh, err := consumers.PutDeadLetter(t.Context(), e.App, "inventory", "m-1", 7, []byte("x"))
	if err != nil || again != first || fresh {
		t.Fatalf("the same copy stored again: dead letter %d (%v, new: %v), want %d, not new", again, err, fresh, first)
	}
	other, fresh, err := consumers.PutDeadLetter(t.Context(), e.App, "inventory", "m-1", 9, []byte("x"))
	if err != nil || other == first || !fresh {
		t.Fatalf("another copy: dead letter %d (%v, new: %v), want a new one", other, err, fresh)
	}
	if other2, fresh, err := consumers.PutDeadLetter(t.Context(), e.App, "payment", "m-1", 7, []byte("x")); err != nil || other2 == first || other2 == other || !fresh {
		t.Fatalf("another consumer's copy: dead letter %d (%v, new: %v), want a new one", other2, err, fresh)
	}
	if n := len(deadLetters(t, e)); n != 3 {
		t.Fatalf("%d dead letters, want 3", n)
	}
}

// TestADeliveryPastTheLastFindsItsStepDone: a delivery past MaxDeliver
// runs no step. When the step's dedupe row shows it done (its last
// allowed delivery committed, then its ack was lost or its process died),
// the message is acked with no dead letter; when not, it is dead-lettered.
func TestADeliveryPastTheLastFindsItsStepDone(t *testing.T) {
	t.Parallel()
	e := pipetest.New(t, pspserver.Options{})
	cfg := pipetest.Config()
	cfg.MaxDeliver = 3
	p, err := consumers.Build(e.App, cfg, e.Steps(time.Second)...)
	if err != nil {
		t.Fatal(err)
	}
	event := func() (orderevent.Event, []byte) {
		ev := orderevent.Event{Version: orderevent.Version, Name: orderevent.Accepted, OrderID: uuid.New(), ClientID: e.ClientID,
			RequestID: "req-1", Status: orderevent.Accepted.Status(), OccurredAt: time.Now().UTC()}
		b, err := json.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		return ev, b
	}
	done, b := event()
	if _, err := e.DB.Pool.Exec(t.Context(), `INSERT INTO processed_messages (consumer, message_id) VALUES ('inventory', $1)`, done.MsgID()); err != nil {
		t.Fatal(err)
	}
	if err := consumers.Deliver(p, "inventory", b, cfg.MaxDeliver+1); err != nil {
		t.Fatalf("a done message past its last delivery: %v, want it acked", err)
	}
	if dls := deadLetters(t, e); len(dls) != 0 {
		t.Fatalf("a done message was dead-lettered: %+v", dls)
	}
	_, b = event()
	if err := consumers.Deliver(p, "inventory", b, cfg.MaxDeliver+1); err != nil {
		t.Fatalf("a message not done past its last delivery: %v, want it dead-lettered and acked", err)
	}
	if dls := deadLetters(t, e); len(dls) != 1 || !strings.Contains(dls[0].Error, "no step run past the last allowed delivery") {
		t.Fatalf("dead letters %+v, want the message not done", dls)
	}
}

package compensator_test

import (
	"bytes"
	"encoding/json"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"

	"orderpipe/compensator"
	"orderpipe/consumers/notify"
	"orderpipe/shared/app"
	"orderpipe/shared/config"
	"orderpipe/shared/order"
	"orderpipe/shared/orderevent"
	"orderpipe/shared/orderstore"
)

// TestRenotifyAFinalEventTheBrokerLost: an order was confirmed and its
// confirmed event stamped published, but the broker lost it, so the
// client's webhook for that change was never created. The compensator
// publishes the event again with a fresh message id; once the notifier has
// made the delivery, later passes leave the order alone. An order without a
// callback URL is never touched, and the re-publishes are bounded.
func TestRenotifyAFinalEventTheBrokerLost(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := t.Context()
	confirm := func() (orderevent.Event, string) {
		id := w.newOrder(spec{status: order.StatusPaid})
		var oid int64
		if err := pgx.BeginFunc(ctx, w.db.Pool, func(tx pgx.Tx) error {
			m, err := orderstore.Transition(ctx, tx, id, order.StatusPaid, order.StatusConfirmed, "")
			oid = m.Event.ID
			return err
		}); err != nil {
			t.Fatal(err)
		}
		w.exec(`UPDATE outbox SET published_at = now() WHERE id = $1`, oid) // "published", then lost
		w.age(id)
		ev := orderevent.Event{Version: orderevent.Version, Name: orderevent.Confirmed, OrderID: id, ClientID: w.client,
			RequestID: w.str(`SELECT request_id FROM orders WHERE order_id = $1`, id), Status: order.StatusConfirmed}
		return ev, id.String()
	}
	lost, lostID := confirm()
	w.exec(`UPDATE orders SET callback_url = 'https://shop.example/hooks' WHERE order_id = $1`, lost.OrderID)
	_, quietID := confirm() // no callback URL: nothing to notify

	var logs bytes.Buffer
	c, err := compensator.New(w.cfg(3), w.db.Pool, w.relay, w.psp,
		app.NewLogger(config.Config{LogFormat: "json", LogLevel: "info"}, &logs))
	if err != nil {
		t.Fatal(err)
	}
	dry := w.comp(func() compensator.Config { cfg := w.cfg(3); cfg.DryRun = true; return cfg }(), w.psp)
	before := dump(t, w.db.Pool)
	if res := w.pass(dry); len(res.Actions) != 1 || res.Actions[0].Kind != compensator.KindRenotify {
		t.Fatalf("dry run: %+v", res.Actions)
	}
	if after := dump(t, w.db.Pool); !mapsEqual(before, after) {
		t.Fatal("the dry run changed the database")
	}

	res := w.pass(c)
	if len(res.Actions) != 1 || res.Actions[0].Kind != compensator.KindRenotify || res.Actions[0].OrderID != lost.OrderID {
		t.Fatalf("first pass: %+v", res.Actions)
	}
	// The action's log line names the order fully, with a trace id.
	var line map[string]any
	if err := json.Unmarshal(bytes.SplitN(logs.Bytes(), []byte("\n"), 2)[0], &line); err != nil {
		t.Fatalf("log: %v: %s", err, logs.String())
	}
	for k, want := range map[string]string{"msg": "compensator action", "order_id": lostID,
		"request_id": lost.RequestID, "client_id": lost.ClientID.String()} {
		if line[k] != want {
			t.Errorf("log line %s = %v, want %s", k, line[k], want)
		}
	}
	if tid, _ := line["trace_id"].(string); tid == "" {
		t.Errorf("log line lacks trace_id: %v", line)
	}
	if ids := w.msgIDs(lost.OrderID); !slices.Contains(ids, lostID+":confirmed:r1") {
		t.Fatalf("stream holds %v, want the re-published confirmed event", ids)
	}
	if ids := w.msgIDs(lost.OrderID); slices.Contains(ids, quietID+":confirmed:r1") {
		t.Fatal("an order without a callback URL was re-notified")
	}

	// The notifier takes the event: one delivery for the order's last change.
	lost.Redrive = 1
	if err := pgx.BeginFunc(ctx, w.db.Pool, func(tx pgx.Tx) error {
		_, err := notify.Apply(ctx, tx, lost)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	// The last change has its one delivery; the earlier changes, which this
	// test never notified, get theirs too (the notifier fills in changes
	// whose events it never got).
	if n := w.int(`SELECT count(*) FROM webhook_deliveries d JOIN LATERAL (SELECT max(seq) AS seq FROM order_events WHERE order_id = d.order_id) e ON e.seq = d.seq WHERE d.order_id = $1`, lost.OrderID); n != 1 {
		t.Fatalf("%d deliveries of the last change, want 1", n)
	}
	if n, m := w.int(`SELECT count(*) FROM webhook_deliveries WHERE order_id = $1`, lost.OrderID), w.int(`SELECT count(*) FROM order_events WHERE order_id = $1`, lost.OrderID); n != m {
		t.Fatalf("%d deliveries for %d changes, want one each", n, m)
	}
	if res := w.pass(c); len(res.Actions) != 0 {
		t.Fatalf("pass after the delivery exists: %+v", res.Actions)
	}

	// Without a delivery, a re-publish waits for the last one's deadline
	// (the shortest stuck deadline, a minute here): passes right after it
	// publish nothing, so a notifier slowed by a broker fault is not
	// out of attempts within seconds. They stop after MaxAttempts.
	w.exec(`DELETE FROM webhook_attempts WHERE webhook_id IN (SELECT webhook_id FROM webhook_deliveries WHERE order_id = $1)`, lost.OrderID)
	w.exec(`DELETE FROM webhook_deliveries WHERE order_id = $1`, lost.OrderID)
	renotified := func() int {
		return w.int(`SELECT count(*) FROM compensator_actions WHERE order_id = $1 AND action = 'renotify'`, lost.OrderID)
	}
	for want := 1; want <= 3; want++ {
		for range 2 {
			w.pass(c)
		}
		if n := renotified(); n != want {
			t.Fatalf("%d re-notifications after back-to-back passes, want %d: one per deadline", n, want)
		}
		w.exec(`UPDATE compensator_actions SET created_at = created_at - interval '2 minutes' WHERE order_id = $1`, lost.OrderID)
	}
	w.pass(c)
	if n := renotified(); n != 3 {
		t.Fatalf("%d re-notifications, want MaxAttempts = 3", n)
	}
	w.holdsTheContract()
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestRenotifyWithoutRedrives: --max-attempts 0 (no re-drive: unwind at
// the first deadline) still re-notifies a terminal order whose final event
// the broker lost, once. It bounded the re-notifies by the re-drives, so
// that setting turned them off and the change never got its webhook.
func TestRenotifyWithoutRedrives(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := t.Context()
	id := w.newOrder(spec{status: order.StatusPaid})
	if err := pgx.BeginFunc(ctx, w.db.Pool, func(tx pgx.Tx) error {
		m, err := orderstore.Transition(ctx, tx, id, order.StatusPaid, order.StatusConfirmed, "")
		if err == nil {
			_, err = tx.Exec(ctx, `UPDATE outbox SET published_at = now() WHERE id = $1`, m.Event.ID) // "published", then lost
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	w.exec(`UPDATE orders SET callback_url = 'https://shop.example/hooks' WHERE order_id = $1`, id)
	w.age(id)
	c := w.comp(w.cfg(compensator.NoRedrive), w.psp)
	if res := w.pass(c); len(res.Actions) != 1 || res.Actions[0].Kind != compensator.KindRenotify {
		t.Fatalf("pass with no re-drives: %+v, want one re-notify", res.Actions)
	}
	w.age(id)
	w.exec(`UPDATE compensator_actions SET created_at = created_at - interval '2 minutes'`)
	if res := w.pass(c); len(res.Actions) != 0 {
		t.Fatalf("second pass: %+v, want nothing: one re-notify without re-drives", res.Actions)
	}
}

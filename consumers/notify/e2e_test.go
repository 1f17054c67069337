package notify_test

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"orderpipe/consumers/notify"
	"orderpipe/consumers/pipetest"
	"orderpipe/consumers/webhook"
	"orderpipe/producer"
	"orderpipe/shared/order"
	"orderpipe/shared/orderevent"
	"orderpipe/shared/orderevent/contract"
	"orderpipe/shared/outbox"
	"orderpipe/shared/tooling/pspserver"
	"orderpipe/shared/tooling/testenv"
)

// hook is one verified webhook as the receiver saw it.
type hook struct {
	id      string
	orderID uuid.UUID
	seq     int
	status  order.Status
}

// receiver verifies every request with the Standard Webhooks library and
// against the webhook documented in openapi.json, and answers 503 to the
// first failFirst attempts of each webhook id.
type receiver struct {
	wh        *standardwebhooks.Webhook
	contract  *contract.Webhooks
	failFirst int

	mu        sync.Mutex
	attempts  map[string]int
	delivered []hook
	problems  []string
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if err := rc.wh.Verify(body, r.Header); err != nil {
		rc.problems = append(rc.problems, "bad signature: "+err.Error())
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	if err := rc.contract.Validate(r.Header, body); err != nil {
		rc.problems = append(rc.problems, err.Error())
	}
	var p struct {
		Type string `json:"type"`
		Data struct {
			OrderID uuid.UUID    `json:"order_id"`
			Seq     int          `json:"seq"`
			Status  order.Status `json:"status"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &p); err != nil || p.Type != webhook.EventType {
		rc.problems = append(rc.problems, fmt.Sprintf("bad payload %s (%v)", body, err))
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	id := r.Header.Get("webhook-id")
	if id != webhook.ID(p.Data.OrderID, p.Data.Seq) {
		rc.problems = append(rc.problems, fmt.Sprintf("webhook-id %s for order %s seq %d", id, p.Data.OrderID, p.Data.Seq))
	}
	rc.attempts[id]++
	if rc.attempts[id] <= rc.failFirst {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	rc.delivered = append(rc.delivered, hook{id: id, orderID: p.Data.OrderID, seq: p.Data.Seq, status: p.Data.Status})
	w.WriteHeader(http.StatusOK)
}

// TestWebhooksEndToEnd: orders go through the real router (stock, payment,
// confirmation, notifier) and the delivery worker; a receiver that verifies
// signatures and fails the first two attempts of every webhook gets every
// status change of every order, once per webhook id, in order, and the
// same id on each retry. A re-driven event (new message id) adds nothing.
func TestWebhooksEndToEnd(t *testing.T) {
	t.Parallel()
	e := pipetest.New(t, pspserver.Options{})
	e.Stock(t, "SKU-1", 100)
	e.Stock(t, "SKU-2", 0) // orders of it are rejected
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	secret := "whsec_" + base64.StdEncoding.EncodeToString(key)
	ctx := t.Context()
	if _, err := e.DB.Pool.Exec(ctx, `UPDATE api_clients SET webhook_secret = $1 WHERE client_id = $2`, secret, e.ClientID); err != nil {
		t.Fatal(err)
	}
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := contract.LoadWebhooks(producer.OpenAPI(), "orderStatusChanged")
	if err != nil {
		t.Fatal(err)
	}
	rc := &receiver{wh: wh, contract: doc, failFirst: 2, attempts: map[string]int{}}
	srv := httptest.NewTLSServer(rc)
	t.Cleanup(srv.Close)

	pipetest.Start(t, e.App, pipetest.Config(), append(e.Steps(5*time.Second), notify.Step(e.DB.Pool))...)
	client := webhook.NewClient(webhook.ClientOptions{AllowPrivate: true, TLSConfig: srv.Client().Transport.(*http.Transport).TLSClientConfig.Clone()})
	w := &webhook.Worker{Pool: e.DB.Pool, Logger: testenv.Logger(t), Client: client, AllowPrivate: true,
		Interval: 20 * time.Millisecond, Schedule: []time.Duration{20 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond}}
	t.Cleanup(client.CloseIdleConnections) // after the worker stopped
	testenv.Go(t, "worker", w.Run)

	relay := &outbox.Relay{Pool: e.DB.Pool, JS: e.App.JS, Topology: e.App.Topology, Logger: e.App.Logger}
	create := func(sku string) uuid.UUID {
		id, outboxID := e.InsertOrder(t, "10.00", pipetest.Line{SKU: sku, Qty: 1})
		if _, err := e.DB.Pool.Exec(ctx, `UPDATE orders SET callback_url = $1 WHERE order_id = $2`, srv.URL+"/hooks", id); err != nil {
			t.Fatal(err)
		}
		if err := relay.Publish(ctx, outboxID); err != nil {
			t.Fatal(err)
		}
		return id
	}
	want := map[uuid.UUID][]order.Status{}
	for range 4 {
		want[create("SKU-1")] = []order.Status{order.StatusProcessing, order.StatusReserved, order.StatusPaid, order.StatusConfirmed}
	}
	want[create("SKU-2")] = []order.Status{order.StatusProcessing, order.StatusRejected}
	total := 0
	for _, s := range want {
		total += len(s)
	}
	e.WaitTerminal(t, 60*time.Second)
	testenv.WaitFor(t, 60*time.Second, "every webhook delivered", func() bool {
		rc.mu.Lock()
		defer rc.mu.Unlock()
		return len(rc.delivered) >= total
	})

	// A compensator-style re-drive of an event already notified: a new
	// message id passes the dedupe row, but the delivery keeps its id.
	var some uuid.UUID
	for id := range want {
		some = id
		break
	}
	var redriveID int64
	if err := pgx.BeginFunc(ctx, e.DB.Pool, func(tx pgx.Tx) error {
		var rid string
		if err := tx.QueryRow(ctx, `SELECT request_id FROM orders WHERE order_id = $1`, some).Scan(&rid); err != nil {
			return err
		}
		var err error
		redriveID, err = outbox.Enqueue(ctx, tx, orderevent.Event{Version: orderevent.Version, Name: orderevent.Accepted, OrderID: some,
			ClientID: e.ClientID, RequestID: rid, Status: order.StatusProcessing, OccurredAt: time.Now(), Redrive: 1})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := relay.Publish(ctx, redriveID); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the re-drive processed by the notifier", func() bool {
		var n int
		_ = e.DB.Pool.QueryRow(ctx, `SELECT count(*) FROM processed_messages WHERE consumer = $1 AND message_id = $2`,
			notify.Name, orderevent.MsgID(some, orderevent.Accepted, 1)).Scan(&n)
		return n == 1
	})

	var rows int
	if err := e.DB.Pool.QueryRow(ctx, `SELECT count(*) FROM webhook_deliveries`).Scan(&rows); err != nil || rows != total {
		t.Fatalf("%d delivery rows, want %d (%v)", rows, total, err)
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if len(rc.problems) > 0 {
		t.Fatalf("receiver: %v", rc.problems)
	}
	if len(rc.delivered) != total {
		t.Fatalf("%d webhooks delivered, want %d", len(rc.delivered), total)
	}
	seen := map[string]bool{}
	got := map[uuid.UUID][]order.Status{}
	for _, h := range rc.delivered {
		if seen[h.id] {
			t.Errorf("webhook %s delivered twice", h.id)
		}
		seen[h.id] = true
		if rc.attempts[h.id] != 3 {
			t.Errorf("webhook %s: %d attempts, want 3 (two refused, same id)", h.id, rc.attempts[h.id])
		}
		got[h.orderID] = append(got[h.orderID], h.status)
	}
	for id, statuses := range want {
		m := map[order.Status]bool{}
		for _, s := range got[id] {
			m[s] = true
		}
		if len(got[id]) != len(statuses) {
			t.Errorf("order %s: webhooks %v, want %v", id, got[id], statuses)
		}
		for _, s := range statuses {
			if !m[s] {
				t.Errorf("order %s: no webhook for %s (got %v)", id, s, got[id])
			}
		}
	}
}

// TestMalformedPayloadsAreDeadLettered: messages the notifier can never
// handle (bad JSON, unknown version, missing ids, an event on another
// subject, an unknown order, a status the order never had) go to the dead
// letters at once and create no delivery.
func TestMalformedPayloadsAreDeadLettered(t *testing.T) {
	t.Parallel()
	e := pipetest.New(t, pspserver.Options{})
	pipetest.Start(t, e.App, pipetest.Config(), notify.Step(e.DB.Pool))
	ctx := t.Context()
	known, _ := e.InsertOrder(t, "1.00", pipetest.Line{SKU: "SKU-1", Qty: 1})
	if _, err := e.DB.Pool.Exec(ctx, `UPDATE orders SET callback_url = 'https://shop.example/h' WHERE order_id = $1`, known); err != nil {
		t.Fatal(err)
	}
	valid := func(name orderevent.Name, mutate func(*orderevent.Event)) []byte {
		ev := orderevent.Event{Version: orderevent.Version, Name: name, OrderID: known, ClientID: e.ClientID,
			RequestID: "req-1", Status: name.Status(), OccurredAt: time.Now().UTC()}
		if mutate != nil {
			mutate(&ev)
		}
		b, _ := json.Marshal(ev)
		return b
	}
	cases := map[string]struct {
		subject orderevent.Name
		payload []byte
	}{
		"not json":          {orderevent.Accepted, []byte("{not json")},
		"empty":             {orderevent.Reserved, nil},
		"json array":        {orderevent.Paid, []byte("[]")},
		"unknown version":   {orderevent.Confirmed, valid(orderevent.Confirmed, func(ev *orderevent.Event) { ev.Version = 7 })},
		"missing order":     {orderevent.Rejected, valid(orderevent.Rejected, func(ev *orderevent.Event) { ev.OrderID = uuid.Nil })},
		"missing client":    {orderevent.Cancelled, valid(orderevent.Cancelled, func(ev *orderevent.Event) { ev.ClientID = uuid.Nil })},
		"unknown event":     {orderevent.Paid, valid("shipped", nil)},
		"unknown order":     {orderevent.Accepted, valid(orderevent.Accepted, func(ev *orderevent.Event) { ev.OrderID = uuid.New() })},
		"status never had":  {orderevent.Paid, valid(orderevent.Paid, nil)},
		"another's order":   {orderevent.Accepted, valid(orderevent.Accepted, func(ev *orderevent.Event) { ev.ClientID = uuid.New() })},
		"negative re-drive": {orderevent.Accepted, valid(orderevent.Accepted, func(ev *orderevent.Event) { ev.Redrive = -1 })},
	}
	for _, c := range cases {
		id := "raw-" + uuid.NewString()
		m := &nats.Msg{Subject: e.App.Topology.Subject(c.subject), Data: c.payload, Header: nats.Header{}}
		m.Header.Set(orderevent.HeaderMsgID, id)
		if _, err := e.NATS.JS.PublishMsg(ctx, m, jetstream.WithMsgID(id)); err != nil {
			t.Fatal(err)
		}
	}
	testenv.WaitFor(t, 60*time.Second, "every malformed message dead-lettered", func() bool {
		var n int
		_ = e.DB.Pool.QueryRow(ctx, `SELECT count(*) FROM dead_letters WHERE consumer = $1`, notify.Name).Scan(&n)
		return n == len(cases)
	})
	var n int
	if err := e.DB.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM webhook_deliveries) + (SELECT count(*) FROM processed_messages)`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("malformed messages left %d rows (%v)", n, err)
	}
}

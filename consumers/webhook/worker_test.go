package webhook_test

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"orderpipe/consumers/webhook"
	"orderpipe/shared/cli"
	"orderpipe/shared/config"
	"orderpipe/shared/metrics"
	"orderpipe/shared/order"
	"orderpipe/shared/tenant"
	"orderpipe/shared/tooling/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func secret(t *testing.T) string {
	t.Helper()
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return "whsec_" + base64.StdEncoding.EncodeToString(b)
}

// receiver is a webhook endpoint that verifies every request with the
// Standard Webhooks library and answers 500 to the first failFirst
// attempts of each webhook id.
type receiver struct {
	t         *testing.T
	wh        *standardwebhooks.Webhook
	failFirst int
	block     chan struct{} // when set, requests wait for it to close

	mu        sync.Mutex
	attempts  map[string]int
	delivered map[string]int
	bodies    map[string][]byte
	bad       []string
}

func newReceiver(t *testing.T, secret string, failFirst int) *receiver {
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		t.Fatal(err)
	}
	return &receiver{t: t, wh: wh, failFirst: failFirst, attempts: map[string]int{}, delivered: map[string]int{}, bodies: map[string][]byte{}}
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if rc.block != nil {
		select {
		case <-rc.block:
		case <-r.Context().Done():
			return
		}
	}
	body, _ := io.ReadAll(r.Body)
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if err := rc.wh.Verify(body, r.Header); err != nil {
		rc.bad = append(rc.bad, err.Error())
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	id := r.Header.Get("webhook-id")
	if prev, ok := rc.bodies[id]; ok && !bytes.Equal(prev, body) {
		rc.bad = append(rc.bad, "body of "+id+" changed between attempts")
	}
	rc.bodies[id] = body
	rc.attempts[id]++
	if rc.attempts[id] <= rc.failFirst {
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	rc.delivered[id]++
	w.WriteHeader(http.StatusNoContent)
}

func (rc *receiver) deliveredCount() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.delivered)
}

type fixture struct {
	pool   *pgxpool.Pool
	client tenant.Credentials
}

func setup(t *testing.T) fixture {
	t.Helper()
	db := testenv.DB(t)
	c, err := tenant.Create(t.Context(), db.Pool, "webhook-test")
	if err != nil {
		t.Fatal(err)
	}
	return fixture{pool: db.Pool, client: c}
}

func (f fixture) newClient(t *testing.T) tenant.Credentials {
	t.Helper()
	c, err := tenant.Create(t.Context(), f.pool, "webhook-test-2")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// enqueue inserts an order of client c and n deliveries of it to url.
func (f fixture) enqueue(t *testing.T, c tenant.Credentials, url string, n int) (uuid.UUID, []string) {
	t.Helper()
	ctx := t.Context()
	id := uuid.Must(uuid.NewV7())
	var ids []string
	err := pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders (order_id, order_no, client_id, request_id, fingerprint, status, user_id, items, amount, currency, callback_url)
			VALUES ($1, $2, $3, $4, '\x00', 'processing', 1, '[]', 1.00, 'CNY', $5)`,
			id, order.NewOrderNo(time.Now()), c.ClientID, order.NewRequestID(time.Now())+uuid.NewString()[:8], url); err != nil {
			return err
		}
		for seq := 1; seq <= n; seq++ {
			payload := fmt.Sprintf(`{"type":"order.status_changed","timestamp":"2026-12-02T10:00:00Z","data":{"order_id":%q,"seq":%d}}`, id, seq)
			for range 2 { // the second insert is a no-op (a redelivered event)
				if _, err := webhook.Enqueue(ctx, tx, webhook.NewDelivery{OrderID: id, Seq: seq, ClientID: c.ClientID, URL: url, Payload: []byte(payload)}); err != nil {
					return err
				}
			}
			ids = append(ids, webhook.ID(id, seq))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return id, ids
}

// startWorker runs w and returns a stop function that waits for its sends
// to be recorded (Run returns only then). It also stops at the test's end.
func startWorker(t *testing.T, w *webhook.Worker) (stop func()) {
	t.Helper()
	if w.Client != nil {
		t.Cleanup(w.Client.CloseIdleConnections) // after the worker stopped
	}
	stopRun := testenv.Go(t, "worker", w.Run)
	return func() {
		stopRun()
		if w.Client != nil {
			w.Client.CloseIdleConnections()
		}
	}
}

func fastWorker(t *testing.T, pool *pgxpool.Pool, client *http.Client) *webhook.Worker {
	return &webhook.Worker{
		Pool: pool, Logger: testenv.Logger(t), Client: client, AllowPrivate: true,
		Interval: 20 * time.Millisecond, Schedule: []time.Duration{20 * time.Millisecond, 40 * time.Millisecond, 60 * time.Millisecond},
	}
}

func TestDeliveriesAreSignedRetriedAndRecorded(t *testing.T) {
	t.Parallel()
	f := setup(t)
	rc := newReceiver(t, f.client.WebhookSecret, 2)
	srv, _ := tlsServer(t, rc)
	orderID, ids := f.enqueue(t, f.client, srv.URL+"/hooks", 4)
	client := webhook.NewClient(webhook.ClientOptions{AllowPrivate: true, TLSConfig: trust(srv)})
	startWorker(t, fastWorker(t, f.pool, client))

	testenv.WaitFor(t, 20*time.Second, "every delivery acknowledged", func() bool { return rc.deliveredCount() == len(ids) })
	ctx := t.Context()
	testenv.WaitFor(t, 10*time.Second, "every delivery recorded delivered", func() bool {
		ds, err := webhook.List(ctx, f.pool, orderID)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range ds {
			if d.Status != webhook.StatusDelivered {
				return false
			}
		}
		return len(ds) == len(ids)
	})
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if len(rc.bad) > 0 {
		t.Fatalf("receiver refused requests: %v", rc.bad)
	}
	for _, id := range ids {
		if rc.attempts[id] != 3 || rc.delivered[id] != 1 {
			t.Errorf("%s: %d attempts, %d deliveries; want 3 and 1 (same id across retries)", id, rc.attempts[id], rc.delivered[id])
		}
	}
	if len(rc.attempts) != len(ids) {
		t.Errorf("receiver saw %d ids, want %d", len(rc.attempts), len(ids))
	}
	ds, err := webhook.List(ctx, f.pool, orderID)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range ds {
		if d.Attempts != 3 || len(d.History) != 3 || d.DeliveredAt == nil || d.LastStatusCode == nil || *d.LastStatusCode != 204 {
			t.Errorf("%s recorded as %+v", d.WebhookID, d)
		}
		if *d.History[0].StatusCode != 500 || d.History[0].Error == nil {
			t.Errorf("%s first attempt recorded as %+v", d.WebhookID, d.History[0])
		}
	}
}

func TestDeliveryFailsAfterScheduleAndResendKeepsID(t *testing.T) {
	t.Parallel()
	f := setup(t)
	rc := newReceiver(t, f.client.WebhookSecret, 4) // 4 failures: more than 1 + len(schedule)=3
	srv, _ := tlsServer(t, rc)
	_, ids := f.enqueue(t, f.client, srv.URL+"/hooks", 1)
	client := webhook.NewClient(webhook.ClientOptions{AllowPrivate: true, TLSConfig: trust(srv)})
	w := fastWorker(t, f.pool, client)
	w.Schedule = []time.Duration{10 * time.Millisecond, 10 * time.Millisecond}
	startWorker(t, w)
	ctx := t.Context()
	testenv.WaitFor(t, 20*time.Second, "delivery failed", func() bool {
		d, err := webhook.Get(ctx, f.pool, ids[0])
		return err == nil && d.Status == webhook.StatusFailed
	})
	d, _ := webhook.Get(ctx, f.pool, ids[0])
	if d.Attempts != 3 {
		t.Fatalf("failed after %d attempts, want 3", d.Attempts)
	}

	var out bytes.Buffer
	if err := cliRun(t, f, &out, "resend", ids[0]); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), ids[0]) {
		t.Fatalf("resend printed %q", out.String())
	}
	testenv.WaitFor(t, 20*time.Second, "resent delivery acknowledged", func() bool { return rc.deliveredCount() == 1 })
	rc.mu.Lock()
	if rc.attempts[ids[0]] != 5 || len(rc.attempts) != 1 {
		t.Errorf("receiver saw %v; want 5 attempts of one id", rc.attempts)
	}
	rc.mu.Unlock()
}

// TestDeadReceiverDoesNotSlowOthers: client A's endpoint never answers
// (until the test ends); client B's deliveries go through meanwhile.
func TestDeadReceiverDoesNotSlowOthers(t *testing.T) {
	t.Parallel()
	f := setup(t)
	b := f.newClient(t)
	dead := newReceiver(t, f.client.WebhookSecret, 0)
	dead.block = make(chan struct{})
	deadSrv, _ := tlsServer(t, dead)
	alive := newReceiver(t, b.WebhookSecret, 0)
	aliveSrv, _ := tlsServer(t, alive)
	f.enqueue(t, f.client, deadSrv.URL, 30)
	_, ids := f.enqueue(t, b, aliveSrv.URL, 10)
	tlsCfg := trust(deadSrv) // both httptest servers share one certificate
	client := webhook.NewClient(webhook.ClientOptions{AllowPrivate: true, TLSConfig: tlsCfg, Timeout: time.Minute})
	w := fastWorker(t, f.pool, client)
	w.Concurrency, w.PerClient, w.Batch = 6, 3, 5
	startWorker(t, w)
	t.Cleanup(func() { close(dead.block) }) // before the worker waits for its sends
	testenv.WaitFor(t, 10*time.Second, "the live client's deliveries", func() bool { return alive.deliveredCount() == len(ids) })
	if dead.deliveredCount() != 0 {
		t.Fatal("the dead receiver answered")
	}
}

func cliRun(t *testing.T, f fixture, out *bytes.Buffer, args ...string) error {
	t.Helper()
	cmd := webhook.Command()
	var cfg config.Config
	if f.pool != nil {
		cfg.DatabaseURL = f.pool.Config().ConnString()
	}
	return cmd.Run(t.Context(), cli.Invocation{Args: args, Stdout: out, Stderr: io.Discard, Config: cfg})
}

func TestCommand(t *testing.T) {
	t.Parallel()
	f := setup(t)
	orderID, ids := f.enqueue(t, f.client, "https://shop.example/hooks", 2)
	var out bytes.Buffer
	if err := cliRun(t, f, &out, "list", "--order", orderID.String()); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if !strings.Contains(out.String(), id) || !strings.Contains(out.String(), "pending") {
			t.Fatalf("list output lacks %s: %s", id, out.String())
		}
	}
	out.Reset()
	if err := cliRun(t, f, &out, "list", "--json", "--order", orderID.String()); err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(&out)
	for i := range ids {
		var d webhook.Delivery
		if err := dec.Decode(&d); err != nil || d.WebhookID != ids[i] {
			t.Fatalf("JSON line %d: %+v, %v", i, d, err)
		}
	}
	out.Reset()
	if err := cliRun(t, f, &out, "list", "--order", uuid.NewString()); err != nil || !strings.Contains(out.String(), "no webhook deliveries") {
		t.Fatalf("unknown order: %q, %v", out.String(), err)
	}
	if err := cliRun(t, f, &out, "resend", webhook.ID(uuid.New(), 1)); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("resend of an unknown id: %v", err)
	}
}

func TestCommandRefusesMalformedArguments(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{},
		{"frobnicate"},
		{"list"},
		{"list", "--order"},
		{"list", "--order", "not-a-uuid"},
		{"list", "--order", uuid.Nil.String()},
		{"list", "--order", uuid.NewString(), "--order", uuid.NewString()},
		{"list", "--order", uuid.NewString(), "extra"},
		{"list", "--nope"},
		{"resend"},
		{"resend", "a", "b"},
		{"resend", "not-an-id"},
		{"resend", "msg_zz_1"},
		{"resend", "msg_" + strings.Repeat("0", 32) + "_0"},
		{"resend", "msg_" + strings.Repeat("0", 32) + "_01"},
		{"resend", "msg_" + strings.Repeat("0", 32) + "_-1"},
	} {
		err := cliRun(t, fixture{}, &bytes.Buffer{}, args...)
		if ue := (cli.UsageError{}); !errors.As(err, &ue) {
			t.Errorf("webhooks %q: %v, want a usage error", args, err)
		}
	}
	// Well-formed, but no database configured: an error naming it.
	err := cliRun(t, fixture{}, &bytes.Buffer{}, "list", "--order", uuid.NewString())
	if err == nil || !strings.Contains(err.Error(), "DATABASE_URL") {
		t.Errorf("without DATABASE_URL: %v", err)
	}
}

func TestParseID(t *testing.T) {
	t.Parallel()
	id := uuid.New()
	got, seq, err := webhook.ParseID(webhook.ID(id, 7))
	if err != nil || got != id || seq != 7 {
		t.Fatalf("ParseID(ID(%s, 7)) = %s, %d, %v", id, got, seq, err)
	}
}

func FuzzParseID(f *testing.F) {
	f.Add(webhook.ID(uuid.New(), 3))
	f.Add("msg_")
	f.Add("msg_" + strings.Repeat("f", 32) + "_99999999999999999999")
	f.Fuzz(func(t *testing.T, s string) {
		id, seq, err := webhook.ParseID(s)
		if err != nil {
			return
		}
		if webhook.ID(id, seq) != s {
			t.Fatalf("ParseID(%q) = %s, %d does not round-trip", s, id, seq)
		}
	})
}

// TestTwoWorkersSendEachDeliveryOnce: claims skip each other's locked rows
// and hide claimed ones under a lease, so two workers (two replicas) on one
// database send every delivery once.
func TestTwoWorkersSendEachDeliveryOnce(t *testing.T) {
	t.Parallel()
	f := setup(t)
	rc := newReceiver(t, f.client.WebhookSecret, 0)
	srv, _ := tlsServer(t, rc)
	var ids []string
	for range 5 {
		_, more := f.enqueue(t, f.client, srv.URL, 6)
		ids = append(ids, more...)
	}
	for range 2 {
		w := fastWorker(t, f.pool, webhook.NewClient(webhook.ClientOptions{AllowPrivate: true, TLSConfig: trust(srv)}))
		w.Batch, w.PerClient = 3, 2
		startWorker(t, w)
	}
	testenv.WaitFor(t, 20*time.Second, "every delivery acknowledged", func() bool { return rc.deliveredCount() == len(ids) })
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, id := range ids {
		if rc.attempts[id] != 1 {
			t.Errorf("%s sent %d times", id, rc.attempts[id])
		}
	}
}

// TestARefusedDeliveryCountsAsFailed: a delivery given up because its
// callback may not be reached (a private address, refused at send time)
// counts as failed in orderpipe_webhook_deliveries_total, as any delivery
// given up does: the alert on failed deliveries must see it. Not parallel:
// it reads process-wide counters.
func TestARefusedDeliveryCountsAsFailed(t *testing.T) {
	f := setup(t)
	_, ids := f.enqueue(t, f.client, "https://127.0.0.1:1/hooks", 1)
	failed := func() float64 { return testutil.ToFloat64(metrics.WebhookDeliveries.WithLabelValues("failed")) }
	before := failed()
	w := fastWorker(t, f.pool, webhook.NewClient(webhook.ClientOptions{}))
	w.AllowPrivate = false
	startWorker(t, w)
	testenv.WaitFor(t, 20*time.Second, "the delivery given up", func() bool {
		d, err := webhook.Get(t.Context(), f.pool, ids[0])
		return err == nil && d.Status == webhook.StatusFailed
	})
	if got := failed() - before; got != 1 {
		t.Fatalf("failed deliveries counted: %v, want 1", got)
	}
}

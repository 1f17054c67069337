package webhook_test

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"orderpipe/consumers/webhook"
	"orderpipe/shared/tooling/testenv"
)

// holdFirst is a receiver that holds its first request until release is
// closed and then answers 500; every later request gets 204.
type holdFirst struct {
	n       atomic.Int64
	held    chan struct{} // closed when the first request arrived
	release chan struct{}
}

func newHoldFirst() *holdFirst {
	return &holdFirst{held: make(chan struct{}), release: make(chan struct{})}
}

func (h *holdFirst) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h.n.Add(1) == 1 {
		close(h.held)
		select {
		case <-h.release:
		case <-r.Context().Done():
		}
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// heldSend enqueues one delivery to a holdFirst receiver and starts worker
// A with lease, one send at a time (saturated while it holds the send: it
// does not claim again); it returns once A's request is held at the
// receiver, which is released at the test's end at the latest (before A is
// stopped).
func heldSend(t *testing.T, lease time.Duration) (f fixture, rc *holdFirst, srv *httptest.Server, ids []string, stopA func()) {
	t.Helper()
	f = setup(t)
	rc = newHoldFirst()
	srv, _ = tlsServer(t, rc)
	_, ids = f.enqueue(t, f.client, srv.URL+"/hooks", 1)
	a := fastWorker(t, f.pool, webhook.NewClient(webhook.ClientOptions{AllowPrivate: true, TLSConfig: trust(srv), Timeout: time.Minute}))
	a.Lease, a.PerClient = lease, 1
	stopA = startWorker(t, a)
	t.Cleanup(func() { closeOnce(rc.release) })
	testenv.Receive(t, rc.held, 30*time.Second, "worker A's request at the receiver")
	return f, rc, srv, ids, stopA
}

// TestStaleOutcomeIsNotRecorded: worker A claims a delivery and is held
// past its lease; worker B claims it again and delivers it. A's late
// outcome (a 500) must change nothing: the row stays delivered with one
// attempt recorded.
func TestStaleOutcomeIsNotRecorded(t *testing.T) {
	t.Parallel()
	f, rc, srv, ids, stopA := heldSend(t, 100*time.Millisecond)
	ctx := t.Context()

	b := fastWorker(t, f.pool, webhook.NewClient(webhook.ClientOptions{AllowPrivate: true, TLSConfig: trust(srv)}))
	stopB := startWorker(t, b)
	testenv.WaitFor(t, 20*time.Second, "worker B delivered after A's lease ended", func() bool {
		d, err := webhook.Get(ctx, f.pool, ids[0])
		return err == nil && d.Status == webhook.StatusDelivered
	})
	stopB()

	closeOnce(rc.release) // A gets its 500 now, long after its lease
	stopA()               // returns once A's send is finished and its outcome written (or not)

	d, err := webhook.Get(ctx, f.pool, ids[0])
	if err != nil {
		t.Fatal(err)
	}
	if d.Status != webhook.StatusDelivered || d.Attempts != 1 || d.DeliveredAt == nil || d.LastStatusCode == nil || *d.LastStatusCode != 204 {
		t.Fatalf("worker A's stale outcome overwrote B's: %+v", d)
	}
	if n := countAttempts(t, f, ids[0]); n != 1 {
		t.Fatalf("%d attempts recorded, want B's one", n)
	}
}

// TestResendFencesTheSendInFlight: an operator resends a delivery while a
// worker's send of it is in flight; that send's outcome must not undo the
// resend (the row stays pending with attempts 0 and is sent again).
func TestResendFencesTheSendInFlight(t *testing.T) {
	t.Parallel()
	f, rc, _, ids, stopA := heldSend(t, time.Hour)
	ctx := t.Context()
	if _, err := webhook.Resend(ctx, f.pool, ids[0]); err != nil {
		t.Fatal(err)
	}
	// Move the row out of reach of A's next claims, so that what the test
	// reads afterwards is only the outcome of the held send.
	if _, err := f.pool.Exec(ctx, `UPDATE webhook_deliveries SET next_attempt_at = now() + interval '1 hour' WHERE webhook_id = $1`, ids[0]); err != nil {
		t.Fatal(err)
	}
	closeOnce(rc.release)
	stopA()

	d, err := webhook.Get(ctx, f.pool, ids[0])
	if err != nil {
		t.Fatal(err)
	}
	if d.Status != webhook.StatusPending || d.Attempts != 0 || d.LastStatusCode != nil {
		t.Fatalf("the send in flight overwrote the resend: %+v", d)
	}
	if n := countAttempts(t, f, ids[0]); n != 0 {
		t.Fatalf("%d attempts recorded after the resend, want 0", n)
	}
}

func countAttempts(t *testing.T, f fixture, id string) int {
	t.Helper()
	var n int
	if err := f.pool.QueryRow(t.Context(), `SELECT count(*) FROM webhook_attempts WHERE webhook_id = $1`, id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func closeOnce(c chan struct{}) {
	select {
	case <-c:
	default:
		close(c)
	}
}

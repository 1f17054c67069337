package producer_test

import (
	"net/http"
	"sync"
	"testing"
	"time"

	"orderpipe/producer"
	"orderpipe/shared/tooling/testenv"
)

// TestACommittedOrderIsAcceptedAtItsDeadline: a request whose row
// committed is answered 202 when its deadline comes while its batch still
// waits for the broker, not 503: the order is durable with its event in
// the outbox, which the relay publishes (DESIGN.md, guarantee 3), and a
// 503 tells the client it may retry for nothing. The broker is connected
// and silent (the test's stream is gone and a subscriber swallows its
// subjects), so every publish waits for its batch's deadline, the latest
// of its requests'. Two requests hold both flushers; then A and, a second
// later, B queue and go in one batch, whose publish waits until B's
// deadline, a second past A's. Before, A got 503 at its deadline.
func TestACommittedOrderIsAcceptedAtItsDeadline(t *testing.T) {
	t.Parallel()
	const deadline = 3 * time.Second
	db := testenv.DB(t)
	n := testenv.NATS(t)
	env := testenv.Env(t, db, n)
	handler, _ := producer.NewAPI(env, producer.Options{Timeout: deadline, InlinePublishTimeout: time.Minute, RateLimit: 1e6, RateBurst: 1e6})
	h := &harness{t: t, env: env, pool: db.Pool, js: n.JS, topo: n.Topology, srv: newServer(t, handler)}
	h.creds = h.newClient("shop")
	if err := n.JS.DeleteStream(t.Context(), n.Topology.Stream); err != nil {
		t.Fatal(err)
	}
	sub, err := n.Conn.SubscribeSync(n.Topology.AllSubjects())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })

	statuses := make(map[string]int)
	var mu sync.Mutex
	var wg sync.WaitGroup
	send := func(rid string) {
		wg.Go(func() {
			r := h.post(orderBody(rid))
			mu.Lock()
			statuses[rid] = r.status
			mu.Unlock()
		})
	}
	// Each of the first two is written alone by a flusher, which then
	// waits for the broker until the request's deadline.
	send("hold-1")
	testenv.WaitFor(t, 10*time.Second, "the first request committed", func() bool {
		return h.count(`SELECT count(*) FROM orders WHERE request_id = 'hold-1'`) == 1
	})
	send("hold-2")
	testenv.WaitFor(t, 10*time.Second, "the second request committed", func() bool {
		return h.count(`SELECT count(*) FROM orders WHERE request_id = 'hold-2'`) == 1
	})
	send("a")
	// B enters a second after A, so the batch's deadline is a second past
	// A's (the test's stimulus, not a wait for the server).
	gap := time.NewTimer(time.Second)
	<-gap.C
	send("b")
	wg.Wait()

	h.wantCount(4, `SELECT count(*) FROM orders`)
	for rid, status := range statuses {
		if status != http.StatusAccepted {
			t.Errorf("%s: status %d, want 202: its order committed", rid, status)
		}
	}
}

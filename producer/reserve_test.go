package producer_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"orderpipe/producer"
)

// TestTheGroupCommitHasConnectionsOfItsOwn: the intake's writes and
// reads of repeated requests run on a pool of their own
// (app.Env.Reserve). With every connection of the process's pool held
// (a storm of order reads and event streams, here the test itself), a
// new order is still written and a repeated one still read, at once.
// Before, both waited for a connection until the deadline and got 503.
func TestTheGroupCommitHasConnectionsOfItsOwn(t *testing.T) {
	t.Parallel()
	h := setup(t, producer.Options{Timeout: 3 * time.Second})
	// The client's key is looked up once and then known: the next
	// requests need no connection of the process's pool to authenticate.
	if r := h.post(orderBody("reserve-warm")); r.status != http.StatusAccepted {
		t.Fatalf("first order: %d %s", r.status, r.body)
	}
	var held []*pgxpool.Conn
	t.Cleanup(func() {
		for _, c := range held {
			c.Release()
		}
	})
	for range h.pool.Stat().MaxConns() {
		c, err := h.pool.Acquire(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	t0 := time.Now()
	if r := h.post(orderBody("reserve-new")); r.status != http.StatusAccepted {
		t.Fatalf("a new order with the process's pool held: %d %s, want 202", r.status, r.body)
	}
	if r := h.post(orderBody("reserve-new")); r.status != http.StatusOK {
		t.Fatalf("its replay with the process's pool held: %d %s, want 200", r.status, r.body)
	}
	if el := time.Since(t0); el > 2*time.Second {
		t.Fatalf("the two requests took %s: they waited for the process's pool", el)
	}
}

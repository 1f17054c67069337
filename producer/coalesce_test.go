package producer_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"orderpipe/producer"
	"orderpipe/shared/order"
	"orderpipe/shared/tooling/testenv"
)

// TestConcurrentDuplicatesShareOneWrite: while a create request is being
// written, the requests of the same client and request_id that arrive wait
// for it instead of adding rows of their own to the group commit: one
// order number is drawn, one order stored; the duplicates are answered as
// replays of that order once it committed, and the one with another
// payload gets ErrRequestIDReused.
func TestConcurrentDuplicatesShareOneWrite(t *testing.T) {
	t.Parallel()
	h := setup(t, roomy)
	entered, release := make(chan struct{}), make(chan struct{})
	var drawn atomic.Int32
	var once sync.Once
	svc := producer.NewService(h.env, producer.Options{Timeout: time.Minute, NewOrderNo: func(at time.Time) string {
		drawn.Add(1)
		once.Do(func() { close(entered); <-release })
		return order.NewOrderNo(at)
	}})
	same, other := decodeRequest(t, orderBody("storm")), decodeRequest(t, `{"request_id":"storm","user_id":42,"items":[{"sku":"SKU-1","quantity":2}],"amount":"1.00","currency":"CNY"}`)
	client := h.creds.ClientID
	type answer struct {
		o        order.Order
		replayed bool
		err      error
	}
	create := func(req order.CreateRequest, out chan<- answer) {
		o, replayed, err := svc.Create(t.Context(), client, req)
		out <- answer{o, replayed, err}
	}
	first := make(chan answer, 1)
	go create(same, first)
	<-entered // the first request's batch is being written
	const dups = 40
	rest := make(chan answer, dups+1)
	for range dups {
		go create(same, rest)
	}
	go create(other, rest)
	testenv.WaitFor(t, 10*time.Second, "the duplicates to wait for the first request", func() bool {
		return svc.Waiters(client, "storm") == dups+1
	})
	close(release)
	a := <-first
	if a.err != nil || a.replayed {
		t.Fatalf("first request: %+v", a)
	}
	mismatched := 0
	for range dups + 1 {
		r := <-rest
		switch {
		case errors.Is(r.err, order.ErrRequestIDReused):
			mismatched++
		case r.err != nil || !r.replayed || r.o.ID != a.o.ID:
			t.Fatalf("duplicate: %+v, want a replay of %s", r, a.o.ID)
		}
	}
	if mismatched != 1 {
		t.Fatalf("%d requests refused for another payload, want 1", mismatched)
	}
	if n := drawn.Load(); n != 1 {
		t.Fatalf("%d order numbers drawn, want 1 (one row written)", n)
	}
	h.wantCount(1, `SELECT count(*) FROM orders`)
}

// TestDuplicateOfAFailedRequestWritesItself: a request that waited for
// one of the same key which then failed (here its client gave up while its
// write was held) is not answered with that failure: it writes itself and
// gets the one order, whichever of the two batches committed it (the first
// request's batch outlives its client).
func TestDuplicateOfAFailedRequestWritesItself(t *testing.T) {
	t.Parallel()
	h := setup(t, roomy)
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	svc := producer.NewService(h.env, producer.Options{Timeout: time.Minute, NewOrderNo: func(at time.Time) string {
		once.Do(func() { close(entered); <-release })
		return order.NewOrderNo(at)
	}})
	client, req := h.creds.ClientID, decodeRequest(t, orderBody("gave-up"))
	leaderCtx, giveUp := context.WithCancel(t.Context())
	leaderErr := make(chan error, 1)
	go func() {
		_, _, err := svc.Create(leaderCtx, client, req)
		leaderErr <- err
	}()
	<-entered
	type answer struct {
		o        order.Order
		replayed bool
		err      error
	}
	dup := make(chan answer, 1)
	go func() {
		o, replayed, err := svc.Create(t.Context(), client, req)
		dup <- answer{o, replayed, err}
	}()
	testenv.WaitFor(t, 10*time.Second, "the duplicate to wait for the first request", func() bool {
		return svc.Waiters(client, "gave-up") == 1
	})
	giveUp()
	if err := <-leaderErr; !errors.Is(err, context.Canceled) {
		t.Fatalf("the first request: %v, want its own cancellation", err)
	}
	close(release)
	a := <-dup
	if a.err != nil {
		t.Fatalf("the duplicate: %v, want the order", a.err)
	}
	h.wantCount(1, `SELECT count(*) FROM orders WHERE order_id = $1`, a.o.ID)
	h.wantCount(1, `SELECT count(*) FROM orders`)
}

// TestReplayOfAKnownKeyIsARead: once a process has seen a key's order
// committed, a later request of that key is answered from a read of the
// order, without a row in the group commit (no order number drawn): a
// replay for the same payload, ErrRequestIDReused for another. A key
// another process committed is found by the write path, as before, and
// known from then on.
func TestReplayOfAKnownKeyIsARead(t *testing.T) {
	t.Parallel()
	h := setup(t, roomy)
	var drawn atomic.Int32
	count := func(at time.Time) string { drawn.Add(1); return order.NewOrderNo(at) }
	svc := producer.NewService(h.env, producer.Options{NewOrderNo: count})
	other := producer.NewService(h.env, producer.Options{})
	client := h.creds.ClientID
	first, replayed, err := svc.Create(t.Context(), client, decodeRequest(t, orderBody("known")))
	if err != nil || replayed || drawn.Load() != 1 {
		t.Fatalf("first: %v, replayed %v, %d numbers drawn", err, replayed, drawn.Load())
	}
	for range 3 {
		o, replayed, err := svc.Create(t.Context(), client, decodeRequest(t, orderBody("known")))
		if err != nil || !replayed || o.ID != first.ID {
			t.Fatalf("replay: %+v, %v, %v", o, replayed, err)
		}
	}
	mismatch := decodeRequest(t, `{"request_id":"known","user_id":42,"items":[{"sku":"SKU-1","quantity":2}],"amount":"1.00","currency":"CNY"}`)
	if _, _, err := svc.Create(t.Context(), client, mismatch); !errors.Is(err, order.ErrRequestIDReused) {
		t.Fatalf("another payload: %v", err)
	}
	if n := drawn.Load(); n != 1 {
		t.Fatalf("%d order numbers drawn, want 1: a replay of a known key went through the write", n)
	}
	// Committed by another process: written (and found taken), then known.
	theirs, _, err := other.Create(t.Context(), client, decodeRequest(t, orderBody("theirs")))
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		o, replayed, err := svc.Create(t.Context(), client, decodeRequest(t, orderBody("theirs")))
		if err != nil || !replayed || o.ID != theirs.ID {
			t.Fatalf("replay of another process's order: %+v, %v, %v", o, replayed, err)
		}
		if n := drawn.Load(); n != 2 {
			t.Fatalf("%d order numbers drawn, want 2 (one write finds the key taken, then reads)", n)
		}
	}
	h.wantCount(2, `SELECT count(*) FROM orders`)
}

// decodeRequest is the create request of a valid body.
func decodeRequest(t *testing.T, body string) order.CreateRequest {
	t.Helper()
	req, err := order.DecodeCreateRequest([]byte(body), order.DecodeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return req
}

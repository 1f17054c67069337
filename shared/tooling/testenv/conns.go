package testenv

import (
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
)

// CountingServer starts a test server of h (over TLS when tls is set),
// closed when the test ends, and returns it with the number of
// connections it has accepted so far: to see whether a client reuses its
// connections.
func CountingServer(t testing.TB, h http.Handler, tls bool) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var opened atomic.Int64
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			opened.Add(1)
		}
	}
	if tls {
		srv.StartTLS()
	} else {
		srv.Start()
	}
	t.Cleanup(srv.Close)
	return srv, &opened
}

// ConcurrentRounds runs rounds rounds, one after another, of callers
// concurrent calls of call (given the round and the caller's index), and
// fails t with the first error of a round once the round is over.
func ConcurrentRounds(t testing.TB, rounds, callers int, call func(round, caller int) error) {
	t.Helper()
	for r := range rounds {
		errs := make(chan error, callers)
		for i := range callers {
			go func() { errs <- call(r, i) }()
		}
		var first error
		for range callers {
			if err := <-errs; err != nil && first == nil {
				first = err
			}
		}
		if first != nil {
			t.Fatalf("round %d of %d concurrent calls: %v", r+1, callers, first)
		}
	}
}

package app_test

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"orderpipe/shared/app"
	"orderpipe/shared/tooling/testenv"
)

// serve runs ServeListener on a port of its own until the returned cancel,
// and hands back its address and its result.
func serve(t *testing.T, h http.Handler, drain time.Duration) (addr string, stop func() error) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- app.ServeListener(ctx, l, h, testenv.Logger(t), drain) }()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("server stopped with: %v", err)
			}
		}
	})
	return l.Addr().String(), func() error { stopped = true; cancel(); return <-done }
}

// TestShutdownIgnoresConnectionsThatSentNothing: a client's transport may
// dial a connection it never sends a request on (it used another that came
// free). net/http waits 5 s before it counts such a connection idle, so
// with a shorter drain the shutdown timed out although no request was cut
// off. A shutdown with nothing in flight succeeds.
func TestShutdownIgnoresConnectionsThatSentNothing(t *testing.T) {
	t.Parallel()
	addr, stop := serve(t, http.NotFoundHandler(), 300*time.Millisecond)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The server has the connection once it answers a request on another.
	resp, err := http.Get("http://" + addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if err := stop(); err != nil {
		t.Fatalf("shutdown with no request in flight: %v", err)
	}
}

// TestShutdownReportsACutOffRequest: a request still running when the drain
// ends is cut off, and the shutdown says so.
func TestShutdownReportsACutOffRequest(t *testing.T) {
	t.Parallel()
	started, release := make(chan struct{}), make(chan struct{})
	defer close(release)
	addr, stop := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-release
	}), 300*time.Millisecond)
	go func() {
		if resp, err := http.Get("http://" + addr + "/"); err == nil {
			resp.Body.Close()
		}
	}()
	<-started
	if err := stop(); err == nil || !strings.Contains(err.Error(), "1 request") {
		t.Fatalf("shutdown with a request in flight past the drain: want an error naming it, got %v", err)
	}
}

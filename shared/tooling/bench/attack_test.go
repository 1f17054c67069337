package bench

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"
)

// TestARateIsKeptWhenTheServerIsSlow: with --rate the load is open-loop,
// so requests leave on their schedule however slowly the server answers
// (no coordinated omission: a slow server does not lower the load it
// gets, nor hide its queue from the latencies). One client against a
// server that answers in 100 ms, at 50 requests per second for a second:
// bounded by its one worker, the attack sent about 10 requests.
func TestARateIsKeptWhenTheServerIsSlow(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		slow := time.NewTimer(100 * time.Millisecond) // the server's own pace, not a wait for the test
		defer slow.Stop()
		select {
		case <-slow.C:
		case <-r.Context().Done():
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	client := newHTTPClient(1, 10*time.Second)
	defer client.CloseIdleConnections()
	tr := vegeta.NewStaticTargeter(vegeta.Target{Method: http.MethodGet, URL: srv.URL})
	n := 0
	for res := range attack(t.Context(), client, 1, 50, time.Second, tr) {
		if res.Code != http.StatusNoContent {
			t.Fatalf("answer %d %q", res.Code, res.Error)
		}
		n++
	}
	if n < 40 {
		t.Fatalf("%d requests sent at 50/s for 1s to a server answering in 100ms, want about 50", n)
	}
}

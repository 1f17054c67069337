package producer_test

import (
	"io"
	"net/http"
	"testing"
	"time"

	"orderpipe/producer"
)

// TestOneDeadlinePerRequest: the server deadline is taken once, when the
// request enters, and shared by authentication, the body read and the
// insert. The client sends part of its body, stalls for most of the
// deadline, then sends the rest; the orders table is locked, so the insert
// waits for whatever deadline it has. With one deadline the request ends
// at about 1× the deadline; with one per step (as before) it could not end
// before 1.9× (the stall, then a whole fresh deadline for the insert).
func TestOneDeadlinePerRequest(t *testing.T) {
	t.Parallel()
	const deadline = time.Second
	h := setup(t, producer.Options{Timeout: deadline})
	ctx := t.Context()
	release := h.lockTable("orders")

	pr, pw := io.Pipe()
	t.Cleanup(func() { _ = pr.Close() })
	req, err := http.NewRequestWithContext(ctx, "POST", h.srv.URL+"/v1/orders", pr)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+h.creds.APIKey)
	req.Header.Set("Content-Type", "application/json")
	body := orderBody("one-deadline")
	t0 := time.Now()
	go func() {
		if _, err := pw.Write([]byte(body[:20])); err != nil {
			return
		}
		// The client stalls (the test's stimulus, not a wait for the server).
		stall := time.NewTimer(deadline * 9 / 10)
		defer stall.Stop()
		<-stall.C
		_, _ = pw.Write([]byte(body[20:]))
		_ = pw.Close()
	}()
	resp, err := http.DefaultClient.Do(req)
	el := time.Since(t0)
	if err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable && resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("status %d, want 503 (insert out of time) or 400 (body out of time)", resp.StatusCode)
		}
	} // or the server closed the connection: the time is what counts
	if el > deadline*3/2 {
		t.Fatalf("the request took %s with a %s server deadline: its steps got a deadline each", el, deadline)
	}
	if err := release(); err != nil {
		t.Fatal(err)
	}
	h.wantCount(0, `SELECT count(*) FROM orders`)
}

package producer_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"orderpipe/producer"
	"orderpipe/shared/order"
	"orderpipe/shared/tooling/testenv"
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

// TestCreateWithoutADeadlineTakesTheServerDeadline: a caller of Service
// that brings no deadline of its own (the MCP tool, a direct caller) still
// gets the server deadline, now that the HTTP intake's deadline is reused
// instead of a second one taken. The request names an idempotency token
// and the tokens table is locked, so claiming the token waits for
// whatever deadline Create has (the group commit, later, has a bound of
// its own): Create gives up after about the deadline.
func TestCreateWithoutADeadlineTakesTheServerDeadline(t *testing.T) {
	t.Parallel()
	const deadline = 500 * time.Millisecond
	h := setup(t, producer.Options{Timeout: deadline})
	svc := h.api.Service()
	tok, err := svc.IssueToken(t.Context(), h.creds.ClientID)
	if err != nil {
		t.Fatal(err)
	}
	body := strings.Replace(orderBody("unused"), `"request_id":"unused",`, "", 1) // the token is the request_id
	req, err := order.DecodeCreateRequest([]byte(body), order.DecodeOptions{IdempotencyKey: tok.Token, HasIdempotencyKey: true})
	if err != nil {
		t.Fatalf("%v\n%s", err, body)
	}
	if _, ok := t.Context().Deadline(); ok {
		t.Fatal("the test's context has a deadline: the test would not show anything")
	}
	release := h.lockTable("idempotency_tokens")
	t0 := time.Now()
	done := make(chan error, 1)
	go func() {
		_, _, err := svc.Create(t.Context(), h.creds.ClientID, req)
		done <- err
	}()
	// Without a bound the call waits for the lock, which only the test's
	// end releases (and t.Context() ends then too).
	err = testenv.Receive(t, done, 10*deadline, "Create to give up on the locked tokens table")
	el := time.Since(t0)
	if rerr := release(); rerr != nil {
		t.Fatal(rerr)
	}
	if err == nil || el > 4*deadline {
		t.Fatalf("Create with the tokens table locked: %v after %s, want an error within about %s", err, el, deadline)
	}
	h.wantCount(0, `SELECT count(*) FROM orders`)
}

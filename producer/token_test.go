package producer_test

import (
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"orderpipe/producer"
	"orderpipe/producer/client"
	"orderpipe/shared/failpoint"
	"orderpipe/shared/idemtoken"
	"orderpipe/shared/metrics"
	"orderpipe/shared/tenant"
	"orderpipe/shared/tooling/testenv"
)

// tokenOrderBody is orderBody without a request_id: the token in the
// Idempotency-Key header stands for it.
func tokenOrderBody() string {
	return `{"user_id":42,"items":[{"sku":"SKU-1","quantity":2}],"amount":"39.98","currency":"CNY"}`
}

func (h *harness) issueToken(headers ...string) string {
	h.t.Helper()
	r := h.do("POST", "/v1/idempotency-tokens", "", headers...)
	if r.status != http.StatusCreated {
		h.t.Fatalf("issue token: %d %s", r.status, r.body)
	}
	m := r.json(h.t)
	tok, _ := m["token"].(string)
	exp, _ := m["expires_at"].(string)
	if !idemtoken.Valid(tok) || exp == "" {
		h.t.Fatalf("issued %q expiring %q", tok, exp)
	}
	return tok
}

func (h *harness) tokenState(tok string) string {
	h.t.Helper()
	var s string
	if err := h.pool.QueryRow(h.t.Context(), `SELECT state FROM idempotency_tokens WHERE token = $1`, tok).Scan(&s); err != nil {
		h.t.Fatal(err)
	}
	return s
}

// The article's first case with a token: fetch one, place the order with
// it (no request_id in the body); the token becomes the order's
// request_id and is used.
func TestTokenNormalOrder(t *testing.T) {
	t.Parallel()
	h := setup(t, producer.Options{})
	tok := h.issueToken()
	if s := h.tokenState(tok); s != "unused" {
		t.Fatalf("a new token is %s", s)
	}
	r := h.post(tokenOrderBody(), "Idempotency-Key", tok)
	if r.status != http.StatusAccepted {
		t.Fatalf("order with a token: %d %s", r.status, r.body)
	}
	if rid := r.json(t)["request_id"]; rid != tok {
		t.Fatalf("the order's request_id is %v, want the token", rid)
	}
	if s := h.tokenState(tok); s != "used" {
		t.Fatalf("after the order the token is %s", s)
	}
	// The body may carry the token as its request_id instead.
	tok2 := h.issueToken()
	if r := h.post(orderBody(tok2)); r.status != http.StatusAccepted {
		t.Fatalf("token as the body's request_id: %d %s", r.status, r.body)
	}
	h.wantCount(2, `SELECT count(*) FROM orders`)
}

// The article's second case: the first attempt's answer is delayed, the
// client retries meanwhile (409, retryable, Retry-After), and once the
// first committed every retry gets that order back (200, replayed). The
// delay is real: a transaction of the test holds the order's unique key,
// so the first attempt waits inside its insert.
func TestTokenRetryWhileDelayed(t *testing.T) {
	t.Parallel()
	h := setup(t, producer.Options{Timeout: 20 * time.Second})
	tok := h.issueToken()
	ctx := t.Context()
	blocker, err := h.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = blocker.Rollback(ctx) }()
	if _, err := blocker.Exec(ctx, `INSERT INTO orders (order_id, order_no, client_id, request_id, fingerprint, status, user_id, items, amount, currency)
		VALUES (gen_random_uuid(), 'BLOCKER', $1, $2, '\x00', 'processing', 1, '[]', 1, 'CNY')`, h.creds.ClientID, tok); err != nil {
		t.Fatal(err)
	}
	first := make(chan response, 1)
	go func() { first <- h.post(tokenOrderBody(), "Idempotency-Key", tok) }()
	testenv.WaitFor(t, 10*time.Second, "the first attempt to hold the token", func() bool {
		return h.tokenState(tok) == "processing"
	})
	r := h.post(tokenOrderBody(), "Idempotency-Key", tok)
	if r.status != http.StatusConflict || r.code(t) != 104 || r.header.Get("Retry-After") == "" || r.json(t)["retryable"] != true {
		t.Fatalf("a retry while the first is in flight: %d %v %s", r.status, r.header, r.body)
	}
	if err := blocker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	fr := <-first
	if fr.status != http.StatusAccepted {
		t.Fatalf("the delayed first attempt: %d %s", fr.status, fr.body)
	}
	id := fr.json(t)["order_id"]
	again := h.post(tokenOrderBody(), "Idempotency-Key", tok)
	if again.status != http.StatusOK || again.header.Get(producer.HeaderReplayed) != "true" || again.json(t)["order_id"] != id {
		t.Fatalf("the retry after the answer: %d %v %s", again.status, again.header, again.body)
	}
	// A used token with another payload is refused, and changes nothing.
	other := strings.Replace(tokenOrderBody(), "39.98", "1.00", 1)
	if r := h.post(other, "Idempotency-Key", tok); r.status != http.StatusUnprocessableEntity || r.code(t) != 207 {
		t.Fatalf("used token, other payload: %d %s", r.status, r.body)
	}
	h.wantCount(1, `SELECT count(*) FROM orders`)
}

// The article's third case: 100 concurrent requests with one token give
// one order; each answer is the order (202 once, 200 replays) or 409.
func TestTokenHundredConcurrentRequests(t *testing.T) {
	t.Parallel()
	h := setup(t, producer.Options{RateLimit: 10000, RateBurst: 10000})
	tok := h.issueToken()
	var wg sync.WaitGroup
	var mu sync.Mutex
	statuses := map[int]int{}
	ids := map[any]bool{}
	for range 100 {
		wg.Go(func() {
			r := h.post(tokenOrderBody(), "Idempotency-Key", tok)
			mu.Lock()
			defer mu.Unlock()
			statuses[r.status]++
			if r.status == http.StatusAccepted || r.status == http.StatusOK {
				ids[r.json(t)["order_id"]] = true
			}
		})
	}
	wg.Wait()
	if statuses[http.StatusAccepted] != 1 || statuses[http.StatusAccepted]+statuses[http.StatusOK]+statuses[http.StatusConflict] != 100 || len(ids) != 1 {
		t.Fatalf("answers %v, order ids %v", statuses, ids)
	}
	h.wantCount(1, `SELECT count(*) FROM orders`)
	if s := h.tokenState(tok); s != "used" {
		t.Fatalf("token %s", s)
	}
}

// orderpipe_idempotency_tokens_used_total counts a token once as it
// becomes used, whether the intake marks it or the compensator's settle
// does for a holder that died; replays and other tokens do not move it.
// Not parallel: the counter is the process's.
func TestTokensUsedCounter(t *testing.T) {
	h := setup(t, producer.Options{})
	ctx := t.Context()
	used := func() float64 { return testutil.ToFloat64(metrics.TokensUsed) }
	before := used()
	tok := h.issueToken()
	for i := range 3 {
		if r := h.post(tokenOrderBody(), "Idempotency-Key", tok); r.status/100 != 2 {
			t.Fatalf("request %d: %d %s", i, r.status, r.body)
		}
	}
	if d := used() - before; d != 1 {
		t.Fatalf("one token used, three requests: counter moved by %v", d)
	}
	// A holder that died after its order committed: the settle marks it.
	orphan := h.issueToken()
	if r := h.post(tokenOrderBody(), "Idempotency-Key", orphan); r.status != http.StatusAccepted {
		t.Fatalf("%d %s", r.status, r.body)
	}
	if _, err := h.pool.Exec(ctx, `UPDATE idempotency_tokens SET state = 'processing', claimed_until = now() - interval '1 second', used_at = NULL, order_id = NULL WHERE token = $1`, orphan); err != nil {
		t.Fatal(err)
	}
	if n, err := idemtoken.Settle(ctx, h.pool); err != nil || n != 1 {
		t.Fatalf("settle: %d %v", n, err)
	}
	h.issueToken() // issued, never used
	if d := used() - before; d != 3 {
		t.Fatalf("counter moved by %v, want 3 (the intake's mark twice, the settle's once)", d)
	}
}

// Expiry at the boundary: a token one second before its expiry places the
// order; one at or past it is refused with code 209 (fetch a new one), and
// nothing is written. Unknown and malformed tokens get code 208.
func TestTokenExpiryAndUnknown(t *testing.T) {
	t.Parallel()
	h := setup(t, producer.Options{})
	live, dead := h.issueToken(), h.issueToken()
	ctx := t.Context()
	if _, err := h.pool.Exec(ctx, `UPDATE idempotency_tokens SET expires_at = now() + interval '1 second' WHERE token = $1`, live); err != nil {
		t.Fatal(err)
	}
	if _, err := h.pool.Exec(ctx, `UPDATE idempotency_tokens SET expires_at = now() WHERE token = $1`, dead); err != nil {
		t.Fatal(err)
	}
	if r := h.post(tokenOrderBody(), "Idempotency-Key", live); r.status != http.StatusAccepted {
		t.Fatalf("a token just before its expiry: %d %s", r.status, r.body)
	}
	r := h.post(tokenOrderBody(), "Idempotency-Key", dead)
	if r.status != http.StatusUnprocessableEntity || r.code(t) != 209 || r.json(t)["retryable"] != false {
		t.Fatalf("an expired token: %d %s", r.status, r.body)
	}
	for _, bad := range []string{idemtoken.Prefix + strings.Repeat("0", 48), idemtoken.Prefix + "short", idemtoken.Prefix + strings.Repeat("A", 48)} {
		r := h.post(tokenOrderBody(), "Idempotency-Key", bad)
		if r.status != http.StatusUnprocessableEntity || r.code(t) != 208 {
			t.Fatalf("token %q: %d %s", bad, r.status, r.body)
		}
	}
	h.wantCount(1, `SELECT count(*) FROM orders`)
	// The sweep deletes expired unused tokens after the retention only.
	if n, err := idemtoken.Sweep(ctx, h.pool, time.Hour, 100); err != nil || n != 0 {
		t.Fatalf("sweep within the retention: %d %v", n, err)
	}
	if n, err := idemtoken.Sweep(ctx, h.pool, -time.Hour, 100); err != nil || n != 1 {
		t.Fatalf("sweep past the retention: %d %v", n, err)
	}
	counts, err := idemtoken.CountOutstanding(ctx, h.pool)
	if err != nil || counts[idemtoken.Expired] != 0 || counts[idemtoken.Unused] != 0 || counts[idemtoken.Processing] != 0 || len(counts) != 3 {
		t.Fatalf("counts %v %v", counts, err)
	}
}

// A token of another client is refused exactly like an unknown one
// (nothing revealed), and the owner can still use it.
func TestTokenOfAnotherClient(t *testing.T) {
	t.Parallel()
	h := setup(t, producer.Options{})
	tok := h.issueToken()
	thief := h.newClient("thief")
	r := h.post(tokenOrderBody(), "Idempotency-Key", tok, "Authorization", "Bearer "+thief.APIKey)
	unknown := h.post(tokenOrderBody(), "Idempotency-Key", idemtoken.Prefix+strings.Repeat("1", 48), "Authorization", "Bearer "+thief.APIKey)
	if r.status != http.StatusUnprocessableEntity || r.code(t) != 208 || r.json(t)["detail"] != unknown.json(t)["detail"] {
		t.Fatalf("another client's token: %d %s (unknown: %s)", r.status, r.body, unknown.body)
	}
	if s := h.tokenState(tok); s != "unused" {
		t.Fatalf("the refusal changed the token: %s", s)
	}
	if r := h.post(tokenOrderBody(), "Idempotency-Key", tok); r.status != http.StatusAccepted {
		t.Fatalf("the owner: %d %s", r.status, r.body)
	}
}

// Malformed token requests: a body with members, or not JSON, is 400.
func TestIssueTokenMalformed(t *testing.T) {
	t.Parallel()
	h := setup(t, producer.Options{})
	for _, body := range []string{`{"ttl":"1h"}`, `[]`, `null`, `{`, `"x"`} {
		if r := h.do("POST", "/v1/idempotency-tokens", body); r.status != http.StatusBadRequest || r.code(t) != 201 {
			t.Errorf("body %s: %d %s", body, r.status, r.body)
		}
	}
	if r := h.do("POST", "/v1/idempotency-tokens", `{}`); r.status != http.StatusCreated {
		t.Errorf("body {}: %d %s", r.status, r.body)
	}
	if n := h.count(`SELECT count(*) FROM idempotency_tokens`); n != 1 {
		t.Errorf("%d tokens stored, want 1", n)
	}
}

// The process dies between the claim and the commit: the token is left
// processing, not lost. A retry within the lease is told to come back
// (409); once the lease passed, the retry claims it and places the order,
// exactly once.
func TestCrashBetweenTokenClaimAndCommit(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	ns := testenv.OwnNATS(t)
	ctx := t.Context()
	creds, err := tenant.Create(ctx, db.Pool, "shop")
	if err != nil {
		t.Fatal(err)
	}
	tok, err := idemtoken.Issue(ctx, db.Pool, creds.ClientID, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	base := []string{"DATABASE_URL=" + db.URL, "NATS_URL=" + ns.URL(), producer.EnvTimeout.Name + "=2s"}
	p := startProducer(t, append(base, failpoint.EnvVar+"="+producer.FailAfterTokenClaim+"=exit")...)
	send := func(addr string) (int, string) {
		req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+addr+"/v1/orders", strings.NewReader(tokenOrderBody()))
		req.Header.Set("Authorization", "Bearer "+creds.APIKey)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", tok.Token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("Retry-After")
	}
	if status, _ := send(p.addr); status != 0 {
		t.Fatalf("the producer answered %d; it should have died", status)
	}
	if code := p.wait(t, 30*time.Second); code != failpoint.ExitCode {
		t.Fatalf("exit code %d, want %d", code, failpoint.ExitCode)
	}
	var state string
	if err := db.Pool.QueryRow(ctx, `SELECT state FROM idempotency_tokens WHERE token = $1`, tok.Token).Scan(&state); err != nil || state != "processing" {
		t.Fatalf("after the crash the token is %q (%v), want processing", state, err)
	}
	p = startProducer(t, base...)
	var statuses []int
	testenv.WaitFor(t, 30*time.Second, "a retry to place the order once the lease passed", func() bool {
		status, _ := send(p.addr)
		statuses = append(statuses, status)
		return status == http.StatusAccepted
	})
	for _, s := range statuses[:len(statuses)-1] {
		if s != http.StatusConflict {
			t.Fatalf("retries before the lease passed: %v, want 409s", statuses)
		}
	}
	var orders int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM orders WHERE request_id = $1`, tok.Token).Scan(&orders); err != nil || orders != 1 {
		t.Fatalf("%d orders (%v), want 1", orders, err)
	}
	if err := db.Pool.QueryRow(ctx, `SELECT state FROM idempotency_tokens WHERE token = $1`, tok.Token).Scan(&state); err != nil || state != "used" {
		t.Fatalf("the token is %q (%v), want used", state, err)
	}
}

// The SDK against the real intake: a caller with no id of its own fetches
// a token, and a rebuilt call with the same token gets the same order. A
// token held by another attempt is retried after Retry-After (code 104)
// until that attempt's lease passed.
func TestClientToken(t *testing.T) {
	t.Parallel()
	h := setup(t, producer.Options{})
	c := client.New(h.srv.URL, h.creds.APIKey)
	ctx := t.Context()
	tok, err := c.NewToken(ctx)
	if err != nil || !idemtoken.Valid(tok.Token) || time.Until(tok.ExpiresAt) < 14*time.Minute {
		t.Fatalf("NewToken: %+v %v", tok, err)
	}
	req := client.OrderRequest{RequestID: tok.Token, UserID: 42, Items: []client.Item{{SKU: "SKU-1", Quantity: 2}}, Amount: "39.98", Currency: "CNY"}
	first, err := c.CreateOrder(ctx, req)
	if err != nil || first.Replayed {
		t.Fatalf("first: %+v %v", first, err)
	}
	again, err := c.CreateOrder(ctx, req)
	if err != nil || !again.Replayed || again.Order.OrderID != first.Order.OrderID {
		t.Fatalf("rebuilt call: %+v %v", again, err)
	}

	held, err := c.NewToken(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.pool.Exec(ctx, `UPDATE idempotency_tokens SET state = 'processing', claimed_until = now() + interval '1 second' WHERE token = $1`, held.Token); err != nil {
		t.Fatal(err)
	}
	req.RequestID = held.Token
	res, err := c.CreateOrder(ctx, req)
	if err != nil || res.Replayed || res.Attempts < 2 {
		t.Fatalf("a held token: %+v %v", res, err)
	}
	if _, err := c.CreateOrder(ctx, client.OrderRequest{RequestID: idemtoken.Prefix + strings.Repeat("9", 48), UserID: 42,
		Items: []client.Item{{SKU: "SKU-1", Quantity: 2}}, Amount: "39.98", Currency: "CNY"}); err == nil {
		t.Fatal("an unknown token was accepted")
	} else if p := (*client.Problem)(nil); !errors.As(err, &p) || p.Code != 208 {
		t.Fatalf("an unknown token: %v", err)
	}
}

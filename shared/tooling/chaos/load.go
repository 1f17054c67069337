package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"orderpipe/shared/order"
)

// accepted is what a client learned of one request_id.
type accepted struct {
	RequestID string
	OrderID   string
	// Attempts is how many times the client sent it (retries and
	// deliberate repeats included).
	Attempts int
}

// load is the clients: each sends orders and retries every one with the
// same request_id and payload until the intake answers 2xx or refuses it
// for good, as a shop backend or an agent would.
type load struct {
	targets  []string // proxy addresses, one per producer
	apiKey   string
	callback string
	skus     []string
	rng      *rand.Rand
	rngMu    sync.Mutex
	http     *http.Client

	mu       sync.Mutex
	accepted map[string]accepted
	refused  map[string]string // request_id -> why (a 4xx other than 409/429, or given up)
	sentIDs  map[string]bool   // every request_id (or token) sent
	sent     atomic.Int64
	retries  atomic.Int64
	replays  atomic.Int64
	tokens   atomic.Int64
}

func newLoad(targets []string, apiKey, callback string, skus []string, seed uint64) *load {
	return &load{targets: targets, apiKey: apiKey, callback: callback, skus: skus,
		rng:      rand.New(rand.NewPCG(seed, 99)),
		http:     &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}},
		accepted: map[string]accepted{}, refused: map[string]string{}, sentIDs: map[string]bool{}}
}

func (l *load) intn(n int) int {
	l.rngMu.Lock()
	defer l.rngMu.Unlock()
	return l.rng.IntN(n)
}

// run runs clients until ctx ends; each client finishes the order it is
// retrying (for at most retryFor) before it stops.
func (l *load) run(ctx context.Context, clients int, retryFor time.Duration) {
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ctx.Err() == nil; n++ {
				rid := fmt.Sprintf("%s%02x%04x", order.NewRequestID(time.Now()), c, n)
				// A quarter of the orders go as a client without an id of
				// its own would: with a server-issued token.
				if l.intn(4) == 0 {
					if tok, ok := l.token(retryFor); ok {
						rid = tok
					}
				}
				l.one(ctx, rid, retryFor)
				select {
				case <-ctx.Done():
				case <-time.After(time.Duration(20+l.intn(60)) * time.Millisecond):
				}
			}
		}()
	}
	wg.Wait()
}

// one sends one order until it is settled.
func (l *load) one(_ context.Context, requestID string, retryFor time.Duration) {
	items := []map[string]any{}
	var cents int64
	first := l.intn(len(l.skus))
	for i := range 1 + l.intn(2) { // distinct SKUs: the intake refuses a repeated one
		q := 1 + l.intn(3)
		items = append(items, map[string]any{"sku": l.skus[(first+i)%len(l.skus)], "quantity": q})
		cents += int64(q) * 1999
	}
	body, _ := json.Marshal(map[string]any{
		"request_id": requestID, "user_id": 1 + l.intn(1000), "items": items,
		"amount": fmt.Sprintf("%d.%02d", cents/100, cents%100), "currency": "CNY", "callback_url": l.callback,
	})
	l.mu.Lock()
	l.sentIDs[requestID] = true
	l.mu.Unlock()
	deadline := time.Now().Add(retryFor)
	wait := 50 * time.Millisecond
	attempts := 0
	for {
		attempts++
		l.sent.Add(1)
		code, orderID, text := l.post(requestID, body)
		switch {
		case code == http.StatusAccepted || code == http.StatusOK:
			l.settle(requestID, orderID, attempts)
			// Now and then a client sends it once more, as after a lost
			// answer: the intake must answer with the same order.
			if l.intn(10) == 0 {
				l.replays.Add(1)
				c, again, text := l.post(requestID, body)
				why := ""
				switch {
				case (c == http.StatusOK || c == http.StatusAccepted) && again != orderID:
					why = fmt.Sprintf("a repeat answered order %s, the first answer was %s", again, orderID)
				case refusal(c):
					why = fmt.Sprintf("a repeat answered %d %s; the first answer was order %s", c, text, orderID)
				}
				if why != "" {
					l.mu.Lock()
					l.refused[requestID] = why
					l.mu.Unlock()
				}
			}
			return
		case refusal(code):
			l.mu.Lock()
			l.refused[requestID] = fmt.Sprintf("%d %s", code, text)
			l.mu.Unlock()
			return
		}
		if time.Now().After(deadline) {
			// Unsettled: the checker finds out whether the intake took it.
			l.mu.Lock()
			l.refused[requestID] = fmt.Sprintf(gaveUp+" %d attempts (last: %d %s)", attempts, code, text)
			l.mu.Unlock()
			return
		}
		l.retries.Add(1)
		// Backoff with jitter. The client keeps retrying after the load
		// stopped (ctx) until its deadline: an order it sent must settle.
		t := time.NewTimer(wait + time.Duration(l.intn(int(wait/time.Millisecond)+1))*time.Millisecond)
		<-t.C
		wait = min(2*wait, time.Second)
	}
}

// refusal reports whether code refuses a valid request for good: a 4xx
// other than the retryable 408, 409 and 429. The clients send only valid
// requests, each retry the same body, so any refusal is a broken promise.
func refusal(code int) bool {
	return code >= 400 && code < 500 && code != http.StatusConflict && code != http.StatusTooManyRequests && code != http.StatusRequestTimeout
}

// gaveUp is how a refusal entry starts when the client ran out of time
// (an outage longer than its retries), not when it was refused.
const gaveUp = "gave up after"

// token fetches an idempotency token, retrying for at most retryFor.
func (l *load) token(retryFor time.Duration) (string, bool) {
	deadline := time.Now().Add(retryFor)
	wait := 50 * time.Millisecond
	for time.Now().Before(deadline) {
		req, err := http.NewRequest(http.MethodPost, "http://"+l.targets[l.intn(len(l.targets))]+"/v1/idempotency-tokens", nil)
		if err != nil {
			return "", false
		}
		req.Header.Set("Authorization", "Bearer "+l.apiKey)
		if resp, err := l.http.Do(req); err == nil {
			var t struct {
				Token string `json:"token"`
			}
			ok := resp.StatusCode == http.StatusCreated && json.NewDecoder(io.LimitReader(resp.Body, 4096)).Decode(&t) == nil && t.Token != ""
			resp.Body.Close()
			if ok {
				l.tokens.Add(1)
				return t.Token, true
			}
		}
		t := time.NewTimer(wait)
		<-t.C
		wait = min(2*wait, time.Second)
	}
	return "", false
}

func (l *load) settle(requestID, orderID string, attempts int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.accepted[requestID] = accepted{RequestID: requestID, OrderID: orderID, Attempts: attempts}
}

// post sends one attempt through a random producer and returns the status
// code (0: no answer), the order id of a 2xx and a short text otherwise.
func (l *load) post(requestID string, body []byte) (int, string, string) {
	url := "http://" + l.targets[l.intn(len(l.targets))] + "/v1/orders"
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, "", err.Error()
	}
	req.Header.Set("Authorization", "Bearer "+l.apiKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", requestID)
	resp, err := l.http.Do(req)
	if err != nil {
		return 0, "", err.Error()
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode/100 == 2 {
		var o struct {
			OrderID string `json:"order_id"`
		}
		if err := json.Unmarshal(raw, &o); err != nil || o.OrderID == "" {
			return 0, "", "unreadable 2xx answer"
		}
		return resp.StatusCode, o.OrderID, ""
	}
	if len(raw) > 200 {
		raw = raw[:200]
	}
	return resp.StatusCode, "", string(raw)
}

// snapshot copies what the clients saw: the accepted request_ids, the
// refused or given-up ones, and every one sent.
func (l *load) snapshot() (map[string]accepted, map[string]string, map[string]bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	sent := make(map[string]bool, len(l.sentIDs))
	for k := range l.sentIDs {
		sent[k] = true
	}
	a := make(map[string]accepted, len(l.accepted))
	for k, v := range l.accepted {
		a[k] = v
	}
	r := make(map[string]string, len(l.refused))
	for k, v := range l.refused {
		r[k] = v
	}
	return a, r, sent
}

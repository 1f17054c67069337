package producer_test

import (
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"orderpipe/producer"
	"orderpipe/producer/client"
)

// roomy lets the classic tests' bursts through: they are about
// idempotency, not about the overload guards.
var roomy = producer.Options{Timeout: time.Minute, RateLimit: 1e6, RateBurst: 1e6, MaxInFlight: 10000}

func postRaw(t *testing.T, c *http.Client, url, key, body string) (int, string, error) {
	t.Helper()
	req, err := http.NewRequest("POST", url+"/v1/orders", strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// 100 identical requests at once: one 202, 99 replays, one row.
func TestHundredConcurrentIdenticalRequests(t *testing.T) {
	t.Parallel()
	h := setup(t, roomy)
	const n = 100
	var wg sync.WaitGroup
	start := make(chan struct{})
	statuses := make([]int, n)
	bodies := make([]string, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			statuses[i], bodies[i], errs[i] = postRaw(t, http.DefaultClient, h.srv.URL, h.creds.APIKey, orderBody("same-for-all"))
		}()
	}
	close(start)
	wg.Wait()
	count := map[int]int{}
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("request %d: %v", i, errs[i])
		}
		count[statuses[i]]++
	}
	if count[202] != 1 || count[200] != n-1 {
		t.Fatalf("statuses %v", count)
	}
	id := bodies[0][strings.Index(bodies[0], `"order_id":"`)+12:][:36]
	for i := range n {
		if !strings.Contains(bodies[i], id) {
			t.Fatalf("response %d names another order: %s", i, bodies[i])
		}
	}
	h.wantCount(1, `SELECT count(*) FROM orders`)
	h.wantCount(1, `SELECT count(*) FROM outbox`)
}

// 100 users × 10 requests each, all at once, each user with its own
// request_id: exactly 100 orders.
func TestHundredUsersTenRequestsEach(t *testing.T) {
	t.Parallel()
	h := setup(t, roomy)
	const users, per = 100, 10
	var wg sync.WaitGroup
	start := make(chan struct{})
	var created, replayed, other atomic.Int64
	for u := 1; u <= users; u++ {
		body := fmt.Sprintf(`{"request_id":"user-%d-cart","user_id":%d,"items":[{"sku":"SKU-%d","quantity":1}],"amount":"%d.50","currency":"USD"}`, u, u, u, u)
		for range per {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				status, _, err := postRaw(t, http.DefaultClient, h.srv.URL, h.creds.APIKey, body)
				switch {
				case err != nil:
					other.Add(1)
				case status == 202:
					created.Add(1)
				case status == 200:
					replayed.Add(1)
				default:
					other.Add(1)
				}
			}()
		}
	}
	close(start)
	wg.Wait()
	if created.Load() != users || replayed.Load() != users*(per-1) || other.Load() != 0 {
		t.Fatalf("created %d, replayed %d, other %d", created.Load(), replayed.Load(), other.Load())
	}
	h.wantCount(users, `SELECT count(*) FROM orders`)
	h.wantCount(users, `SELECT count(DISTINCT user_id) FROM orders`)
}

// firstAnswerLost is a client transport that delivers every request but
// loses the first answer: the server has answered (and committed), but the
// client hears nothing until its attempt's context ends, and gets that
// context's error. Later requests get their answers.
type firstAnswerLost struct {
	next  http.RoundTripper
	calls atomic.Int64
}

func (l *firstAnswerLost) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := l.next.RoundTrip(r)
	if l.calls.Add(1) > 1 || err != nil {
		return resp, err
	}
	resp.Body.Close()
	<-r.Context().Done()
	return nil, r.Context().Err()
}

// The classic story: the server commits, the response is lost in a slow
// network past the client's timeout, the client retries with the same
// request_id; exactly one order exists and the client ends up with it.
func TestTimeoutThenRetry(t *testing.T) {
	t.Parallel()
	// The retry's attempt must finish within its timeout even on a loaded
	// machine (the whole suite under -race on two cores): 2 s + 1 s.
	h := setup(t, producer.Options{Timeout: 2 * time.Second})
	c := client.New(h.srv.URL, h.creds.APIKey)
	c.AttemptTimeout = 2*time.Second + time.Second // server deadline + margin
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	lost := &firstAnswerLost{next: tr}
	c.HTTP = &http.Client{Transport: lost}
	var retried []error
	c.OnRetry = func(_ int, err error, _ time.Duration) { retried = append(retried, err) }

	res, err := c.CreateOrder(t.Context(), client.OrderRequest{UserID: 9, Items: []client.Item{{SKU: "SKU-1", Quantity: 1}}, Amount: "10", Currency: "EUR"})
	if err != nil {
		t.Fatal(err)
	}
	if len(retried) != 1 || res.Attempts != 2 || !res.Replayed {
		t.Fatalf("want one timed-out attempt then a replay; got %+v, retries %v", res, retried)
	}
	if lost.calls.Load() < 2 {
		t.Fatalf("the retry did not go through the transport that lost the first answer")
	}
	h.wantCount(1, `SELECT count(*) FROM orders`)
	var id string
	if err := h.pool.QueryRow(t.Context(), `SELECT order_id::text FROM orders`).Scan(&id); err != nil || id != res.Order.OrderID {
		t.Fatalf("client has %s, database has %s (%v)", res.Order.OrderID, id, err)
	}
}

// Linearizability of concurrent create/get histories per request_id: the
// intake must behave like one register per key that is set once (by the
// first create, answered 202) and then answers creates with the same
// payload by 200 and the same order, creates with another payload by 422,
// and gets by the order (404 before it exists).
type linInput struct {
	create  bool
	payload int // which of two payloads (create only)
}

type linOutput struct {
	status  int
	orderID string
}

type linState struct {
	orderID string
	payload int
}

func TestLinearizableCreateAndGet(t *testing.T) {
	t.Parallel()
	h := setup(t, roomy)
	const keys, workers, opsPerWorker = 6, 5, 8
	var mu sync.Mutex
	var history []porcupine.Operation
	t0 := time.Now()
	var wg sync.WaitGroup
	httpc := &http.Client{}
	for k := range keys {
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(k), uint64(w)))
				rid := fmt.Sprintf("lin-%d", k)
				for range opsPerWorker {
					in := linInput{create: rng.IntN(3) > 0, payload: rng.IntN(2)}
					call := time.Since(t0).Nanoseconds()
					var out linOutput
					if in.create {
						body := fmt.Sprintf(`{"request_id":%q,"user_id":1,"items":[{"sku":"A","quantity":1}],"amount":"%d.00","currency":"CNY"}`, rid, in.payload+1)
						status, b, err := postRaw(t, httpc, h.srv.URL, h.creds.APIKey, body)
						if err != nil {
							t.Error(err)
							return
						}
						out = linOutput{status: status, orderID: idOf(b)}
					} else {
						req, _ := http.NewRequest("GET", h.srv.URL+"/v1/orders?request_id="+rid, nil)
						req.Header.Set("Authorization", "Bearer "+h.creds.APIKey)
						resp, err := httpc.Do(req)
						if err != nil {
							t.Error(err)
							return
						}
						b, _ := io.ReadAll(resp.Body)
						resp.Body.Close()
						out = linOutput{status: resp.StatusCode, orderID: idOf(string(b))}
					}
					ret := time.Since(t0).Nanoseconds()
					mu.Lock()
					history = append(history, porcupine.Operation{ClientId: k*workers + w, Input: keyed{rid, in}, Call: call, Output: out, Return: ret})
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	model := porcupine.Model{
		Partition: func(ops []porcupine.Operation) [][]porcupine.Operation {
			by := map[string][]porcupine.Operation{}
			for _, op := range ops {
				k := op.Input.(keyed).key
				by[k] = append(by[k], op)
			}
			var out [][]porcupine.Operation
			for _, p := range by {
				out = append(out, p)
			}
			return out
		},
		Init: func() any { return linState{} },
		Step: func(state, input, output any) (bool, any) {
			s, in, out := state.(linState), input.(keyed).in, output.(linOutput)
			if !in.create {
				if s.orderID == "" {
					return out.status == 404, s
				}
				return out.status == 200 && out.orderID == s.orderID, s
			}
			switch {
			case s.orderID == "":
				return out.status == 202 && out.orderID != "", linState{orderID: out.orderID, payload: in.payload}
			case in.payload == s.payload:
				return out.status == 200 && out.orderID == s.orderID, s
			default:
				return out.status == 422, s
			}
		},
		DescribeOperation: func(input, output any) string {
			in, out := input.(keyed), output.(linOutput)
			return fmt.Sprintf("%s %+v -> %d %s", in.key, in.in, out.status, out.orderID)
		},
	}
	res := porcupine.CheckOperationsTimeout(model, history, 30*time.Second)
	if res != porcupine.Ok {
		t.Fatalf("history of %d operations is %s", len(history), res)
	}
	h.wantCount(keys, `SELECT count(*) FROM orders`)
}

type keyed struct {
	key string
	in  linInput
}

func idOf(body string) string {
	i := strings.Index(body, `"order_id":"`)
	if i < 0 {
		return ""
	}
	return body[i+12:][:36]
}

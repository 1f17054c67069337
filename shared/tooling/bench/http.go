package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	vegeta "github.com/tsenart/vegeta/v12/lib"

	"orderpipe/producer/client"
)

// newRunID is a short random tag that prefixes every request_id of one
// bench run, so that its orders can be found again and never collide with
// another run's.
func newRunID() string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return "bench-" + time.Now().UTC().Format("150405") + "-" + hex.EncodeToString(b)
}

// orderBody is a valid order for request_id id; user spreads the orders
// over SKU-1 … SKU-100, which `orderpipe dev` stocks.
func orderBody(id string, user int) []byte {
	return fmt.Appendf(nil, `{"request_id":%q,"user_id":%d,"items":[{"sku":"SKU-%d","quantity":1}],"amount":"%d.%02d","currency":"CNY"}`,
		id, user, user%100+1, 10+user%90, user%100)
}

// newHTTPClient is a keep-alive client with room for n connections to the
// intake, never through a proxy.
func newHTTPClient(n int, timeout time.Duration) *http.Client {
	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:        n,
			MaxIdleConnsPerHost: n,
			IdleConnTimeout:     30 * time.Second,
			DisableCompression:  true,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// attack runs vegeta closed-loop: workers clients, each sending its next
// request from tr as soon as the previous one answered, for d (0: until tr
// runs out of targets), or until ctx ends; or, with a rate, open-loop: rate
// requests per second on a fixed schedule, from workers clients at first
// and more whenever all of them are waiting for an answer, so that a slow
// server neither lowers the load it gets nor keeps its queueing out of
// the latencies (coordinated omission). Results of the extra requests that
// find tr exhausted are dropped.
func attack(ctx context.Context, client *http.Client, workers, rate int, d time.Duration, tr vegeta.Targeter) <-chan *vegeta.Result {
	maxWorkers := uint64(workers)
	pacer := vegeta.ConstantPacer{}
	if rate > 0 {
		pacer = vegeta.ConstantPacer{Freq: rate, Per: time.Second}
		maxWorkers = vegeta.DefaultMaxWorkers
	}
	a := vegeta.NewAttacker(vegeta.Client(client), vegeta.Workers(uint64(workers)), vegeta.MaxWorkers(maxWorkers))
	in := a.Attack(tr, pacer, d, "")
	out := make(chan *vegeta.Result, 1024)
	stop := context.AfterFunc(ctx, func() { a.Stop() })
	go func() {
		defer close(out)
		defer stop()
		for res := range in {
			if res.Error == vegeta.ErrNoTargets.Error() && res.Method == "" {
				continue
			}
			res.Headers = nil
			out <- res
		}
	}()
	return out
}

// orderAnswer is what bench reads from the intake's answers.
type orderAnswer struct {
	OrderID   string `json:"order_id"`
	RequestID string `json:"request_id"`
	Status    string `json:"status"`
}

func parseAnswer(b []byte) (orderAnswer, bool) {
	var a orderAnswer
	if json.Unmarshal(b, &a) != nil || a.OrderID == "" || a.RequestID == "" {
		return orderAnswer{}, false
	}
	return a, true
}

func orderTargeter(base, apiKey string, next func() (id string, user int, ok bool)) vegeta.Targeter {
	hdr := http.Header{"Authorization": {"Bearer " + apiKey}, "Content-Type": {"application/json"}}
	u := strings.TrimRight(base, "/") + "/v1/orders"
	return func(t *vegeta.Target) error {
		id, user, ok := next()
		if !ok {
			return vegeta.ErrNoTargets
		}
		t.Method, t.URL, t.Header, t.Body = http.MethodPost, u, hdr, orderBody(id, user)
		return nil
	}
}

// accepted is an order that the intake accepted during a run.
type accepted struct {
	orderID string
	at      time.Time
}

// runIntake sends orders with unique request_ids at s.Concurrency for
// s.Duration. It returns the run and the orders accepted (202).
func runIntake(ctx context.Context, s Settings, pool *pgxpool.Pool, progress io.Writer, round int) (Measurement, []accepted, error) {
	prefix := newRunID()
	var n atomic.Int64
	tr := orderTargeter(s.URL, s.APIKey, func() (string, int, bool) {
		i := n.Add(1)
		return fmt.Sprintf("%s-%d", prefix, i), int(i), true
	})
	client := newHTTPClient(s.Concurrency, s.Timeout)
	defer client.CloseIdleConnections()
	var (
		orders []accepted
		byID   = map[string]string{} // order_id → request_id
		dups   int64
	)
	c := newCollector("intake", s.Concurrency, pool)
	run := c.collect(attack(ctx, client, s.Concurrency, s.Rate, s.Duration, tr), progress, func(res *vegeta.Result) {
		a, ok := parseAnswer(res.Body)
		if !ok || res.Code/100 != 2 {
			return
		}
		if res.Code != http.StatusAccepted { // a unique request_id answered as a replay
			dups++
		}
		if prev, seen := byID[a.OrderID]; seen && prev != a.RequestID {
			dups++
		}
		byID[a.OrderID] = a.RequestID
		if res.Code == http.StatusAccepted {
			orders = append(orders, accepted{orderID: a.OrderID, at: res.End()})
		}
	})
	run.Round = round
	run.Duplicates = dups
	if pool != nil {
		rows, distinct, err := countOrders(ctx, pool, prefix)
		if err != nil {
			return run, orders, err
		}
		run.OrdersInDB = rows
		run.Duplicates += rows - distinct
		run.Extra = map[string]int64{"committed_without_answer": max(distinct-run.OK, 0)}
	}
	return run, orders, ctx.Err()
}

// countOrders counts the orders whose request_id starts with prefix, and
// their distinct request_ids.
func countOrders(ctx context.Context, pool *pgxpool.Pool, prefix string) (rows, distinct int64, err error) {
	err = pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT (client_id, request_id)) FROM orders WHERE starts_with(request_id, $1)`, prefix+"-").Scan(&rows, &distinct)
	if err != nil {
		return 0, 0, fmt.Errorf("count the run's orders: %w", err)
	}
	return rows, distinct, nil
}

// runReplay is the article's scenario: s.Users users, each sending
// s.Requests requests with the user's own request_id: all released at
// once (s.Burst), or the users at once, each sending its requests one
// after another (a load tester's thread group of s.Users threads looping
// s.Requests times). Each request goes through the project's Go client
// (producer/client), as a shop backend's would: the intake sheds load
// beyond its bounds with retryable answers (503 code 103, 429 code 102,
// with Retry-After), which the client retries with backoff; a request's
// latency is its whole call, retries included, and the retries are
// counted. Exactly s.Users orders must exist afterwards, checked over the
// API (GET /v1/orders?request_id=) and, with the database, there too.
// Unless s.Cold, the client's connections are opened before the burst
// (warmUp), so that the burst measures the intake rather than TCP set-up.
func runReplay(ctx context.Context, s Settings, pool *pgxpool.Pool, progress io.Writer) (Measurement, error) {
	prefix := newRunID()
	total := s.Users * s.Requests
	httpClient := newHTTPClient(total, 0)
	defer httpClient.CloseIdleConnections()
	// In a burst every request has its own sender; otherwise each user
	// sends its requests one after another.
	senders, each := total, 1
	if !s.Burst {
		senders, each = s.Users, s.Requests
	}
	if !s.Cold {
		if err := warmUp(ctx, httpClient, s.URL, senders); err != nil {
			return Measurement{}, err
		}
	}
	c := client.New(s.URL, s.APIKey)
	attempts := &attemptCounter{base: httpClient.Transport}
	c.HTTP = &http.Client{Transport: attempts, Timeout: httpClient.Timeout, CheckRedirect: httpClient.CheckRedirect}
	results := make(chan *vegeta.Result, total)
	var (
		retries atomic.Int64
		wg      sync.WaitGroup
		start   = make(chan struct{})
	)
	for i := range senders {
		user := i%s.Users + 1
		req := client.OrderRequest{RequestID: fmt.Sprintf("%s-%d", prefix, user), UserID: int64(user),
			Items: []client.Item{{SKU: fmt.Sprintf("SKU-%d", user%100+1), Quantity: 1}}, Amount: fmt.Sprintf("%d.%02d", 10+user%90, user%100), Currency: "CNY"}
		wg.Go(func() {
			<-start
			for range each {
				results <- sendReplay(ctx, c, req, &retries)
			}
		})
	}
	go func() {
		wg.Wait()
		close(results)
	}()
	col := newCollector("replay", senders, pool)
	close(start)
	var (
		created, replayed       int64
		createdLat, replayedLat vegeta.LatencyMetrics
		orderOf                 = map[string]map[string]bool{} // request_id → order_ids answered
	)
	run := col.collect(results, progress, func(res *vegeta.Result) {
		a, ok := parseAnswer(res.Body)
		if !ok || res.Code/100 != 2 {
			return
		}
		switch res.Code {
		case http.StatusAccepted:
			created++
			createdLat.Add(res.Latency)
		case http.StatusOK:
			replayed++
			replayedLat.Add(res.Latency)
		}
		if orderOf[a.RequestID] == nil {
			orderOf[a.RequestID] = map[string]bool{}
		}
		orderOf[a.RequestID][a.OrderID] = true
	})
	if err := ctx.Err(); err != nil {
		return run, err
	}
	run.ByAnswer = map[string]Latency{"created": summarize(&createdLat, created), "replayed": summarize(&replayedLat, replayed)}
	run.Duplicates = max(created-int64(s.Users), 0)
	for _, ids := range orderOf {
		run.Duplicates += int64(len(ids) - 1)
	}
	found, mismatched, err := lookUpOrders(ctx, httpClient, s, prefix, orderOf)
	if err != nil {
		return run, err
	}
	run.Duplicates += mismatched
	run.Extra = map[string]int64{"users": int64(s.Users), "requests_per_user": int64(s.Requests),
		"created": created, "replayed": replayed, "retries": retries.Load(), "found_by_request_id": found}
	for k, n := range attempts.failed() {
		run.Extra[k] = n
	}
	if pool != nil {
		rows, distinct, err := countOrders(ctx, pool, prefix)
		if err != nil {
			return run, err
		}
		run.OrdersInDB = rows
		run.Duplicates += rows - distinct
	}
	return run, nil
}

// Keys of a replay's Extra: the attempts (first tries and retries) that
// got no 2xx answer, by what they got. The client retries each of them
// (or gives up on the call), so they say why there were retries: load shed
// by the intake (429, 503) or failures (other 5xx, a connection error).
const (
	attempts429       = "attempts_429"
	attempts503       = "attempts_503"
	attemptsOther5xx  = "attempts_other_5xx"
	attemptsOther     = "attempts_other_non_2xx"
	attemptsConnError = "attempts_connection_error"
)

// attemptCounter is the replay client's transport: it counts the
// attempts without a 2xx answer by what they got.
type attemptCounter struct {
	base http.RoundTripper
	mu   sync.Mutex
	n    map[string]int64
}

func (a *attemptCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	res, err := a.base.RoundTrip(r)
	var k string
	switch {
	case err != nil:
		k = attemptsConnError
	case res.StatusCode/100 == 2:
		return res, nil
	case res.StatusCode == http.StatusTooManyRequests:
		k = attempts429
	case res.StatusCode == http.StatusServiceUnavailable:
		k = attempts503
	case res.StatusCode/100 == 5:
		k = attemptsOther5xx
	default:
		k = attemptsOther
	}
	a.mu.Lock()
	if a.n == nil {
		a.n = map[string]int64{}
	}
	a.n[k]++
	a.mu.Unlock()
	return res, err
}

// failed returns the counts of every kind, zeros included.
func (a *attemptCounter) failed() map[string]int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := map[string]int64{}
	for _, k := range []string{attempts429, attempts503, attemptsOther5xx, attemptsOther, attemptsConnError} {
		out[k] = a.n[k]
	}
	return out
}

// sendReplay sends one request of a replay and returns its result
// (latency over the whole call, retries included).
func sendReplay(ctx context.Context, c *client.Client, req client.OrderRequest, retries *atomic.Int64) *vegeta.Result {
	t0 := time.Now()
	r, err := c.CreateOrder(ctx, req)
	res := &vegeta.Result{Timestamp: t0, Latency: time.Since(t0), Code: http.StatusAccepted}
	retries.Add(int64(max(r.Attempts-1, 0)))
	switch {
	case err != nil:
		res.Code, res.Error = 0, err.Error()
		var p *client.Problem
		if errors.As(err, &p) {
			res.Code = uint16(p.Status)
		}
	case r.Replayed:
		res.Code = http.StatusOK
	}
	if err == nil {
		res.Body, _ = json.Marshal(orderAnswer{OrderID: r.Order.OrderID, RequestID: r.Order.RequestID, Status: r.Order.Status})
	}
	return res
}

// warmUp opens up to n keep-alive connections to the intake: n concurrent
// GET /healthz, released at once, whose connections stay idle in the
// client's pool for the measured burst to reuse.
func warmUp(ctx context.Context, c *http.Client, baseURL string, n int) error {
	start := make(chan struct{})
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			<-start
			errs <- healthz(ctx, c, baseURL)
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return fmt.Errorf("open the connections before the burst: %w", err)
		}
	}
	return nil
}

// healthz sends GET /healthz and reads the answer to its end, so that the
// connection goes back to the client's pool.
func healthz(ctx context.Context, c *http.Client, baseURL string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(baseURL, "/")+"/healthz", nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET /healthz: %s", resp.Status)
	}
	return nil
}

// lookUpOrders asks GET /v1/orders?request_id= for every user's
// request_id: found counts those that exist, mismatched those whose order
// is not the one the replay's answers named.
func lookUpOrders(ctx context.Context, client *http.Client, s Settings, prefix string, orderOf map[string]map[string]bool) (found, mismatched int64, err error) {
	ids := make(chan string)
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	for range min(16, s.Users) {
		wg.Go(func() {
			for id := range ids {
				a, ok, err := getByRequestID(ctx, client, s, id)
				mu.Lock()
				switch {
				case err != nil:
					if len(errs) < 3 {
						errs = append(errs, err)
					}
				case ok:
					found++
					if answered := orderOf[id]; len(answered) > 0 && !answered[a.OrderID] {
						mismatched++
					}
				}
				mu.Unlock()
			}
		})
	}
	for u := 1; u <= s.Users && ctx.Err() == nil; u++ {
		ids <- fmt.Sprintf("%s-%d", prefix, u)
	}
	close(ids)
	wg.Wait()
	return found, mismatched, errors.Join(errs...)
}

func getByRequestID(ctx context.Context, client *http.Client, s Settings, id string) (orderAnswer, bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(s.URL, "/")+"/v1/orders?request_id="+url.QueryEscape(id), nil)
	if err != nil {
		return orderAnswer{}, false, fmt.Errorf("look up request_id %s: %w", id, err)
	}
	req.Header.Set("Authorization", "Bearer "+s.APIKey)
	resp, err := client.Do(req)
	if err != nil {
		return orderAnswer{}, false, fmt.Errorf("look up request_id %s: %w", id, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return orderAnswer{}, false, nil
	case resp.StatusCode != http.StatusOK:
		return orderAnswer{}, false, fmt.Errorf("look up request_id %s: %s", id, resp.Status)
	}
	a, ok := parseAnswer(b)
	if !ok {
		return orderAnswer{}, false, fmt.Errorf("look up request_id %s: an answer without an order: %.200s", id, b)
	}
	return a, true, nil
}

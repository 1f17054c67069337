package producer_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"orderpipe/producer"
	"orderpipe/shared/app"
	"orderpipe/shared/orderevent"
	"orderpipe/shared/tenant"
	"orderpipe/shared/tooling/testenv"
)

// TestMain runs the tests, or, in a child that a crash test started, the
// producer command (testenv.MainWith).
func TestMain(m *testing.M) { testenv.MainWith(m, producer.Command()) }

// harness is one test's intake: its own database and stream, a server on
// a free port and one API client.
type harness struct {
	t     *testing.T
	env   *app.Env
	pool  *pgxpool.Pool
	js    jetstream.JetStream
	topo  orderevent.Topology
	srv   *httptest.Server
	api   *producer.API
	creds tenant.Credentials
}

func setup(t *testing.T, opts producer.Options) *harness {
	t.Helper()
	db := testenv.DB(t)
	n := testenv.NATS(t)
	env := testenv.Env(t, db, n)
	h := &harness{t: t, env: env, pool: db.Pool, js: n.JS, topo: n.Topology}
	handler, api := producer.NewAPI(env, opts)
	h.srv, h.api = newServer(t, handler), api
	h.creds = h.newClient("shop")
	return h
}

func newServer(t *testing.T, handler http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(handler)
	t.Cleanup(srv.Close)
	return srv
}

func (h *harness) newClient(name string) tenant.Credentials {
	h.t.Helper()
	c, err := tenant.Create(h.t.Context(), h.pool, name)
	if err != nil {
		h.t.Fatal(err)
	}
	return c
}

// response is a finished HTTP exchange.
type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("body is not JSON (%d): %q", r.status, r.body)
	}
	return m
}

// code returns the problem code of the response (0 when not a problem).
func (r response) code(t *testing.T) int {
	t.Helper()
	if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
		return 0
	}
	m := r.json(t)
	c, _ := m["code"].(float64)
	return int(c)
}

// do sends a request; headers are name, value pairs. A key "" means no
// Authorization header; by default the harness client's key is used.
func (h *harness) do(method, path, body string, headers ...string) response {
	h.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, h.srv.URL+path, rd)
	if err != nil {
		h.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+h.creds.APIKey)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(headers); i += 2 {
		if headers[i+1] == "-" {
			req.Header.Del(headers[i])
		} else {
			req.Header.Set(headers[i], headers[i+1])
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		h.t.Fatal(err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: b}
}

func (h *harness) post(body string, headers ...string) response {
	h.t.Helper()
	return h.do("POST", "/v1/orders", body, headers...)
}

// lockTable holds an ACCESS EXCLUSIVE lock on table, in a transaction of
// its own, until release (or the end of the test).
func (h *harness) lockTable(table string) (release func() error) {
	h.t.Helper()
	ctx := h.t.Context()
	lock, err := h.pool.Begin(ctx)
	if err != nil {
		h.t.Fatal(err)
	}
	// Rolled back in a cleanup too, where t.Context() is done.
	h.t.Cleanup(func() { _ = lock.Rollback(context.WithoutCancel(ctx)) })
	if _, err := lock.Exec(ctx, "LOCK TABLE "+table+" IN ACCESS EXCLUSIVE MODE"); err != nil {
		h.t.Fatal(err)
	}
	return func() error { return lock.Rollback(ctx) }
}

func (h *harness) count(sql string, args ...any) int {
	h.t.Helper()
	var n int
	if err := h.pool.QueryRow(h.t.Context(), sql, args...).Scan(&n); err != nil {
		h.t.Fatal(err)
	}
	return n
}

// wantCount fails the test unless the count query sql (with args) finds
// want rows.
func (h *harness) wantCount(want int, sql string, args ...any) {
	h.t.Helper()
	if n := h.count(sql, args...); n != want {
		h.t.Fatalf("%s %v: %d rows, want %d", sql, args, n, want)
	}
}

// streamCount returns how many messages of the stream carry msgID.
func streamCount(t *testing.T, js jetstream.JetStream, stream, subject, msgID string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	s, info := testenv.StreamInfo(t, js, stream)
	n := 0
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			continue // deleted
		}
		if m.Subject == subject && m.Header.Get(orderevent.HeaderMsgID) == msgID {
			n++
		}
	}
	return n
}

func orderBody(rid string) string {
	return `{"request_id":"` + rid + `","user_id":42,"items":[{"sku":"SKU-1","quantity":2}],"amount":"39.98","currency":"CNY"}`
}

func TestCreateReplayMismatchAndGet(t *testing.T) {
	t.Parallel()
	h := setup(t, producer.Options{})
	r := h.post(orderBody("ORD20261202143022a3f9c1"))
	if r.status != http.StatusAccepted {
		t.Fatalf("first: %d %s", r.status, r.body)
	}
	o := r.json(t)
	id := o["order_id"].(string)
	if r.header.Get("Location") != "/v1/orders/"+id || r.header.Get(producer.HeaderReplayed) != "" {
		t.Fatalf("headers %v", r.header)
	}
	if uid, err := uuid.Parse(id); err != nil || uid.Version() != 7 {
		t.Fatalf("order_id %q is not a UUIDv7", id)
	}
	for _, k := range []string{"order_no", "created_at", "updated_at"} {
		if o[k] == "" || o[k] == nil {
			t.Errorf("order has no %s: %v", k, o)
		}
	}
	if o["status"] != "processing" || o["amount"] != "39.98" || o["currency"] != "CNY" || o["user_id"] != float64(42) ||
		o["request_id"] != "ORD20261202143022a3f9c1" || o["reason"] != nil || o["callback_url"] != nil {
		t.Fatalf("order %v", o)
	}
	// The accepted event went out inline, once.
	testenv.WaitFor(t, 10*time.Second, "the accepted event", func() bool {
		return streamCount(t, h.js, h.topo.Stream, h.topo.Subject(orderevent.Accepted), id+":accepted") == 1
	})

	// The same payload, written differently, is a replay.
	same := `{ "currency":"CNY", "amount": 39.98,
	  "items":[{"quantity":2,"sku":"SKU-1"}], "user_id":42 }`
	r = h.post(same, producer.HeaderIdempotencyKey, "ORD20261202143022a3f9c1")
	if r.status != http.StatusOK || r.header.Get(producer.HeaderReplayed) != "true" || r.json(t)["order_id"] != id {
		t.Fatalf("replay: %d %v %s", r.status, r.header, r.body)
	}
	// Another payload under the same key is refused and changes nothing.
	r = h.post(strings.Replace(orderBody("ORD20261202143022a3f9c1"), `"39.98"`, `"39.99"`, 1))
	if r.status != http.StatusUnprocessableEntity || r.code(t) != 207 || r.json(t)["retryable"] != false {
		t.Fatalf("mismatch: %d %s", r.status, r.body)
	}
	h.wantCount(1, `SELECT count(*) FROM orders`)

	for _, path := range []string{"/v1/orders/" + id, "/v1/orders?request_id=ORD20261202143022a3f9c1"} {
		r = h.do("GET", path, "")
		if r.status != http.StatusOK || r.json(t)["order_id"] != id || r.json(t)["amount"] != "39.98" {
			t.Fatalf("GET %s: %d %s", path, r.status, r.body)
		}
	}
	for _, path := range []string{"/v1/orders/" + uuid.NewString(), "/v1/orders/not-a-uuid", "/v1/orders?request_id=nope"} {
		if r = h.do("GET", path, ""); r.status != http.StatusNotFound || r.code(t) != 203 {
			t.Errorf("GET %s: %d %s", path, r.status, r.body)
		}
	}
	for _, path := range []string{"/v1/orders", "/v1/orders?request_id=", "/v1/orders?request_id=a%20b", "/v1/orders?request_id=a&request_id=b"} {
		if r = h.do("GET", path, ""); r.status != http.StatusBadRequest || r.code(t) != 201 {
			t.Errorf("GET %s: %d %s", path, r.status, r.body)
		}
	}
}

func TestIdempotencyKeyHeader(t *testing.T) {
	t.Parallel()
	h := setup(t, producer.Options{})
	noID := `{"user_id":1,"items":[{"sku":"A","quantity":1}],"amount":5,"currency":"EUR"}`
	r := h.post(noID, producer.HeaderIdempotencyKey, "key-1")
	if r.status != http.StatusAccepted || r.json(t)["request_id"] != "key-1" {
		t.Fatalf("%d %s", r.status, r.body)
	}
	// Body and header equal: the same order.
	r = h.post(strings.Replace(noID, `{`, `{"request_id":"key-1",`, 1), producer.HeaderIdempotencyKey, "key-1")
	if r.status != http.StatusOK {
		t.Fatalf("%d %s", r.status, r.body)
	}
}

// badCase is a request that must be refused with a class 2 code.
type badCase struct {
	name    string
	method  string
	path    string
	body    string
	headers []string
	status  int
	code    int
}

func TestBadInputIsRefusedAndChangesNothing(t *testing.T) {
	t.Parallel()
	h := setup(t, producer.Options{})
	good := orderBody("r-bad")
	cases := []badCase{
		{"malformed json", "POST", "/v1/orders", `{"request_id":`, nil, 400, 201},
		{"not an object", "POST", "/v1/orders", `[1,2]`, nil, 400, 201},
		{"empty body", "POST", "/v1/orders", ``, []string{"Content-Type", "application/json"}, 400, 201},
		{"unknown field", "POST", "/v1/orders", strings.Replace(good, `{`, `{"discount":1,`, 1), nil, 400, 201},
		{"trailing data", "POST", "/v1/orders", good + `x`, nil, 400, 201},
		{"no request_id", "POST", "/v1/orders", strings.Replace(good, `"request_id":"r-bad",`, ``, 1), nil, 400, 201},
		{"key differs", "POST", "/v1/orders", good, []string{"Idempotency-Key", "other"}, 400, 201},
		{"bad key", "POST", "/v1/orders", strings.Replace(good, `"request_id":"r-bad",`, ``, 1), []string{"Idempotency-Key", "a b"}, 400, 201},
		{"zero user", "POST", "/v1/orders", strings.Replace(good, `42`, `0`, 1), nil, 400, 201},
		{"float amount", "POST", "/v1/orders", strings.Replace(good, `"39.98"`, `39.985`, 1), nil, 400, 201},
		{"negative amount", "POST", "/v1/orders", strings.Replace(good, `"39.98"`, `"-1"`, 1), nil, 400, 201},
		{"bad currency", "POST", "/v1/orders", strings.Replace(good, `CNY`, `XYZ`, 1), nil, 400, 201},
		{"no items", "POST", "/v1/orders", strings.Replace(good, `[{"sku":"SKU-1","quantity":2}]`, `[]`, 1), nil, 400, 201},
		{"big quantity", "POST", "/v1/orders", strings.Replace(good, `"quantity":2`, `"quantity":10001`, 1), nil, 400, 201},
		{"http callback", "POST", "/v1/orders", good[:len(good)-1] + `,"callback_url":"http://shop.example/h"}`, nil, 400, 201},
		{"too large", "POST", "/v1/orders", good[:len(good)-1] + `,"pad":"` + strings.Repeat("x", 70<<10) + `"}`, nil, 413, 205},
		{"text/plain", "POST", "/v1/orders", good, []string{"Content-Type", "text/plain"}, 415, 206},
		{"no content type", "POST", "/v1/orders", good, []string{"Content-Type", "-"}, 415, 206},
		{"form", "POST", "/v1/orders", good, []string{"Content-Type", "application/x-www-form-urlencoded"}, 415, 206},
		{"latin1", "POST", "/v1/orders", good, []string{"Content-Type", "application/json; charset=latin1"}, 415, 206},
		{"no key", "POST", "/v1/orders", good, []string{"Authorization", "-"}, 401, 202},
		{"wrong key", "POST", "/v1/orders", good, []string{"Authorization", "Bearer opk_wrong"}, 401, 202},
		{"basic auth", "POST", "/v1/orders", good, []string{"Authorization", "Basic dTpw"}, 401, 202},
		{"empty bearer", "POST", "/v1/orders", good, []string{"Authorization", "Bearer "}, 401, 202},
		{"put", "PUT", "/v1/orders", good, nil, 405, 204},
		{"delete order", "DELETE", "/v1/orders/" + uuid.NewString(), "", nil, 405, 204},
		{"post order", "POST", "/v1/orders/" + uuid.NewString(), good, nil, 405, 204},
		{"patch", "PATCH", "/v1/orders", good, nil, 405, 204},
		{"unknown path", "GET", "/v2/orders", "", nil, 404, 203},
		{"post openapi", "POST", "/openapi.json", good, nil, 405, 204},
	}
	for _, c := range cases {
		r := h.do(c.method, c.path, c.body, c.headers...)
		if r.status != c.status || r.code(t) != c.code {
			t.Errorf("%s: got %d code %d, want %d code %d: %s", c.name, r.status, r.code(t), c.status, c.code, r.body)
			continue
		}
		p := r.json(t)
		if p["retryable"] != false || p["title"] == "" || p["status"] != float64(c.status) || !strings.HasPrefix(p["type"].(string), "urn:orderpipe:problem:") {
			t.Errorf("%s: problem %v", c.name, p)
		}
		if c.status == 405 && r.header.Get("Allow") == "" {
			t.Errorf("%s: 405 without Allow", c.name)
		}
		if c.status == 401 && r.header.Get("WWW-Authenticate") == "" {
			t.Errorf("%s: 401 without WWW-Authenticate", c.name)
		}
		if c.status == 400 && strings.HasPrefix(c.name, "no request_id") {
			if errs, _ := p["errors"].([]any); len(errs) == 0 {
				t.Errorf("%s: no field list: %v", c.name, p)
			}
		}
	}
	if n := h.count(`SELECT count(*) FROM orders`) + h.count(`SELECT count(*) FROM outbox`) + h.count(`SELECT count(*) FROM order_events`); n != 0 {
		t.Fatalf("bad input wrote %d rows", n)
	}
}

func TestTenantsAreIsolated(t *testing.T) {
	t.Parallel()
	h := setup(t, producer.Options{})
	other := h.newClient("other shop")
	asOther := []string{"Authorization", "Bearer " + other.APIKey}

	mine := h.post(orderBody("shared-id"))
	theirs := h.post(strings.Replace(orderBody("shared-id"), `"39.98"`, `"5.00"`, 1), asOther...)
	if mine.status != 202 || theirs.status != 202 {
		t.Fatalf("%d %d", mine.status, theirs.status)
	}
	myID, theirID := mine.json(t)["order_id"].(string), theirs.json(t)["order_id"].(string)
	if myID == theirID || h.count(`SELECT count(*) FROM orders WHERE request_id = 'shared-id'`) != 2 {
		t.Fatal("one order for two clients")
	}
	if r := h.do("GET", "/v1/orders/"+theirID, ""); r.status != 404 || r.code(t) != 203 {
		t.Fatalf("I see their order: %d %s", r.status, r.body)
	}
	if r := h.do("GET", "/v1/orders/"+myID, "", asOther...); r.status != 404 {
		t.Fatalf("they see my order: %d", r.status)
	}
	if r := h.do("GET", "/v1/orders?request_id=shared-id", "", asOther...); r.status != 200 || r.json(t)["order_id"] != theirID {
		t.Fatalf("by request_id: %d %s", r.status, r.body)
	}
	// Their replay is theirs.
	if r := h.post(strings.Replace(orderBody("shared-id"), `"39.98"`, `"5.00"`, 1), asOther...); r.status != 200 || r.json(t)["order_id"] != theirID {
		t.Fatalf("their replay: %d %s", r.status, r.body)
	}
}

func TestRateLimit(t *testing.T) {
	t.Parallel()
	h := setup(t, producer.Options{RateLimit: 0.5, RateBurst: 2})
	other := h.newClient("other")
	for i := range 2 {
		if r := h.do("GET", "/v1/orders/"+uuid.NewString(), ""); r.status != 404 {
			t.Fatalf("request %d: %d", i, r.status)
		}
	}
	r := h.post(orderBody("limited"))
	if r.status != http.StatusTooManyRequests || r.code(t) != 102 || r.json(t)["retryable"] != true || r.header.Get("Retry-After") != "2" {
		t.Fatalf("%d %v %s", r.status, r.header, r.body)
	}
	// Per client: another client is not limited.
	if r := h.post(orderBody("limited"), "Authorization", "Bearer "+other.APIKey); r.status != 202 {
		t.Fatalf("other client: %d %s", r.status, r.body)
	}
	h.wantCount(1, `SELECT count(*) FROM orders`)
}

// A client's own limits take the place of the defaults, and a change is
// applied within the key cache's TTL without a restart.
func TestClientsOwnRateLimit(t *testing.T) {
	t.Parallel()
	h := setup(t, producer.Options{})
	ctx := t.Context()
	slow, err := tenant.CreateLimited(ctx, h.pool, "slow", tenant.Limits{Rate: 0.001, Burst: 1})
	if err != nil {
		t.Fatal(err)
	}
	as := []string{"Authorization", "Bearer " + slow.APIKey}
	if r := h.do("GET", "/v1/orders/"+uuid.NewString(), "", as...); r.status != 404 {
		t.Fatalf("first request: %d %s", r.status, r.body)
	}
	if r := h.do("GET", "/v1/orders/"+uuid.NewString(), "", as...); r.status != http.StatusTooManyRequests {
		t.Fatalf("second request of a client limited to a burst of 1: %d %s", r.status, r.body)
	}
	// The default client is not limited by the other's limits.
	for i := range 20 {
		if r := h.do("GET", "/v1/orders/"+uuid.NewString(), ""); r.status != 404 {
			t.Fatalf("default client request %d: %d", i, r.status)
		}
	}
	if err := tenant.SetLimits(ctx, h.pool, slow.ClientID, tenant.Limits{}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 15*time.Second, "the cleared limit to apply", func() bool {
		return h.do("GET", "/v1/orders/"+uuid.NewString(), "", as...).status == 404
	})
}

func TestInFlightBound(t *testing.T) {
	t.Parallel()
	// A long server deadline: the held request must still be reading its
	// body when the test finishes it, however slow the machine.
	h := setup(t, producer.Options{MaxInFlight: 1, Timeout: 2 * time.Minute})
	// Hold the one slot with a request whose body never ends.
	pr, pw := io.Pipe()
	t.Cleanup(func() { _ = pr.Close() }) // never leave a write blocked
	req, _ := http.NewRequest("POST", h.srv.URL+"/v1/orders", pr)
	req.Header.Set("Authorization", "Bearer "+h.creds.APIKey)
	req.Header.Set("Content-Type", "application/json")
	done := make(chan response, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- response{}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		done <- response{status: resp.StatusCode, header: resp.Header, body: b}
	}()
	if _, err := pw.Write([]byte(`{"request_id":"held",`)); err != nil { // the handler is reading: the slot is taken
		t.Fatal(err)
	}
	// Wait for the event (the held request took the slot), not for time:
	// on a busy machine the request may take long to reach the handler.
	testenv.WaitFor(t, 2*time.Minute, "the held request in its slot", func() bool { return h.api.InFlight() == 1 })
	// The poller is another client: its request must not use up the held
	// request's rate (a 429 would end it before it takes the slot).
	poller := "Bearer " + h.newClient("poller").APIKey
	r := h.do("GET", "/v1/orders/"+uuid.NewString(), "", "Authorization", poller)
	if r.status != http.StatusServiceUnavailable {
		t.Fatalf("with the slot held: %d, want 503", r.status)
	}
	if r.code(t) != 103 || r.header.Get("Retry-After") == "" || r.json(t)["retryable"] != true {
		t.Fatalf("%d %v %s", r.status, r.header, r.body)
	}
	if _, err := pw.Write([]byte(`"user_id":1,"items":[{"sku":"A","quantity":1}],"amount":1,"currency":"USD"}`)); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	if held := testenv.Receive(t, done, time.Minute, "the held request's answer"); held.status != 202 {
		t.Fatalf("held request: %d %s", held.status, held.body)
	}
	if r := h.do("GET", "/v1/orders?request_id=held", ""); r.status != 200 {
		t.Fatalf("after the slot is free: %d", r.status)
	}
}

func TestHealthMetricsOpenAPI(t *testing.T) {
	t.Parallel()
	h := setup(t, producer.Options{})
	h.post(orderBody("m-1"))
	for _, path := range []string{"/healthz", "/readyz", "/metrics", "/openapi.json"} {
		r := h.do("GET", path, "", "Authorization", "-")
		if r.status != 200 {
			t.Errorf("%s: %d %s", path, r.status, r.body)
		}
		if path == "/metrics" && !bytes.Contains(r.body, []byte(`orderpipe_intake_requests_total{outcome="created"}`)) {
			t.Errorf("metrics lack the intake counter")
		}
		if path == "/openapi.json" && !json.Valid(r.body) {
			t.Errorf("openapi.json is not JSON")
		}
	}
}

// A body that trickles in is cut off at the server deadline: it does not
// hold a slot for longer, and writes nothing. The answer is the server's
// deadline (503, code 101, retry with the same request_id), not invalid
// input: the order may be valid and the network slow, the retry scenario
// itself, and a client that trusts a 400 would drop it for good.
func TestSlowBodyIsCutOff(t *testing.T) {
	t.Parallel()
	h := setup(t, producer.Options{Timeout: 300 * time.Millisecond})
	pr, pw := io.Pipe()
	defer pw.Close()
	req, _ := http.NewRequest("POST", h.srv.URL+"/v1/orders", pr)
	req.Header.Set("Authorization", "Bearer "+h.creds.APIKey)
	req.Header.Set("Content-Type", "application/json")
	go func() { _, _ = pw.Write([]byte(`{"request_id":"slow",`)) }()
	t0 := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var p struct {
			Code      int  `json:"code"`
			Retryable bool `json:"retryable"`
		}
		if resp.StatusCode != http.StatusServiceUnavailable || json.Unmarshal(b, &p) != nil || p.Code != 101 || !p.Retryable {
			t.Fatalf("%d %s; want 503, code 101, retryable", resp.StatusCode, b)
		}
	} // or the server closed the connection: either way it let go
	if el := time.Since(t0); el > 5*time.Second {
		t.Fatalf("the server held the request for %s", el)
	}
	h.wantCount(0, `SELECT count(*) FROM orders`)
}

package orderstream_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"orderpipe/producer"
	"orderpipe/producer/orderstream"
	"orderpipe/shared/app"
	"orderpipe/shared/order"
	"orderpipe/shared/orderstore"
	"orderpipe/shared/tenant"
	"orderpipe/shared/tooling/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

type harness struct {
	t     *testing.T
	pool  *pgxpool.Pool
	creds tenant.Credentials
	srv   *httptest.Server
}

func clientID(r *http.Request) (uuid.UUID, bool) {
	c, ok := producer.ClientFrom(r.Context())
	return c.ID, ok
}

// replica starts one intake (with its own hub) on the shared database.
func replica(t *testing.T, env *app.Env, h *orderstream.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(producer.Handler(env, producer.Options{Extra: func(mux *http.ServeMux, auth func(http.Handler) http.Handler) {
		mux.Handle(orderstream.Pattern, auth(h))
	}}))
	t.Cleanup(srv.Close)
	return srv
}

func runHub(t *testing.T, pool *pgxpool.Pool) *orderstream.Hub {
	t.Helper()
	hub := orderstream.NewHub(pool, testenv.Logger(t))
	testenv.Go(t, "hub", hub.Run)
	return hub
}

func setup(t *testing.T, keepAlive, recheck time.Duration, listen bool) *harness {
	t.Helper()
	db := testenv.DB(t)
	n := testenv.NATS(t)
	env := testenv.Env(t, db, n)
	hub := orderstream.NewHub(db.Pool, testenv.Logger(t))
	if listen {
		hub = runHub(t, db.Pool)
	}
	h := &orderstream.Handler{Pool: db.Pool, Hub: hub, ClientID: clientID, Logger: testenv.Logger(t), KeepAlive: keepAlive, Recheck: recheck}
	creds, err := tenant.Create(t.Context(), db.Pool, "stream-test")
	if err != nil {
		t.Fatal(err)
	}
	return &harness{t: t, pool: db.Pool, creds: creds, srv: replica(t, env, h)}
}

func (h *harness) newOrder() order.Order {
	h.t.Helper()
	amount, _ := order.ParseAmount("10.00")
	res, err := orderstore.Insert(h.t.Context(), h.pool, h.creds.ClientID, order.CreateRequest{
		RequestID: order.NewRequestID(time.Now()), UserID: 1, Items: []order.Item{{SKU: "SKU-1", Quantity: 1}},
		Amount: amount, Currency: "CNY",
	}, orderstore.InsertOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	return res.Order
}

// move commits a status change straight in the database, as a consumer in
// another process would.
func (h *harness) move(id uuid.UUID, from, to order.Status) {
	h.t.Helper()
	if err := testenv.Move(h.t.Context(), h.pool, id, from, to, ""); err != nil {
		h.t.Fatal(err)
	}
}

type sse struct {
	id   string
	data string
}

// stream is an open event stream read line by line.
type stream struct {
	resp     *http.Response
	cancel   context.CancelFunc
	events   chan sse
	comments chan string
	ended    chan struct{}
}

func (h *harness) open(srvURL string, key string, orderID string, lastEventID ...string) (*stream, *http.Response) {
	h.t.Helper()
	ctx, cancel := context.WithCancel(context.Background()) // the stream is closed by a cleanup, which t.Context() would precede
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srvURL+"/v1/orders/"+orderID+"/events", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	for _, v := range lastEventID {
		req.Header.Add("Last-Event-ID", v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		h.t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		cancel()
		return nil, resp
	}
	s := &stream{resp: resp, cancel: cancel, events: make(chan sse, 100), comments: make(chan string, 100), ended: make(chan struct{})}
	go func() {
		defer close(s.ended)
		sc := bufio.NewScanner(resp.Body)
		var cur sse
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if cur.data != "" {
					s.events <- cur
				}
				cur = sse{}
			case strings.HasPrefix(line, ":"):
				select {
				case s.comments <- line:
				default:
				}
			case strings.HasPrefix(line, "id: "):
				cur.id = strings.TrimPrefix(line, "id: ")
			case strings.HasPrefix(line, "data: "):
				cur.data = strings.TrimPrefix(line, "data: ")
			}
		}
	}()
	h.t.Cleanup(s.close)
	return s, resp
}

func (s *stream) close() {
	s.cancel()
	<-s.ended
	_ = s.resp.Body.Close()
}

func (s *stream) next(t *testing.T) orderstream.Event {
	t.Helper()
	var e sse
	select {
	case e = <-s.events:
	case <-s.ended:
		select { // events read before the end come first
		case e = <-s.events:
		default:
			t.Fatal("stream ended, want another event")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no event within 10s")
	}
	var ev orderstream.Event
	if err := json.Unmarshal([]byte(e.data), &ev); err != nil {
		t.Fatalf("event data %q: %v", e.data, err)
	}
	if e.id != strconv.Itoa(ev.Seq) {
		t.Fatalf("id: %q for seq %d", e.id, ev.Seq)
	}
	return ev
}

func (s *stream) waitEnd(t *testing.T) {
	t.Helper()
	testenv.Receive(t, s.ended, 10*time.Second, "the stream to end")
	select {
	case e := <-s.events:
		t.Fatalf("unexpected event %+v", e)
	default:
	}
}

func TestHistoryLiveAndResume(t *testing.T) {
	t.Parallel()
	h := setup(t, time.Minute, time.Minute, true) // only NOTIFY can wake the stream in time
	o := h.newOrder()
	s, _ := h.open(h.srv.URL, h.creds.APIKey, o.ID.String())
	if ev := s.next(t); ev.Seq != 1 || ev.Status != order.StatusProcessing || ev.OrderID != o.ID {
		t.Fatalf("first event %+v", ev)
	}
	h.move(o.ID, order.StatusProcessing, order.StatusReserved)
	if ev := s.next(t); ev.Seq != 2 || ev.Status != order.StatusReserved {
		t.Fatalf("live event %+v", ev)
	}
	s.close() // the client drops; two changes happen meanwhile
	h.move(o.ID, order.StatusReserved, order.StatusPaid)
	h.move(o.ID, order.StatusPaid, order.StatusConfirmed)

	s2, _ := h.open(h.srv.URL, h.creds.APIKey, o.ID.String(), "2")
	for _, want := range []order.Status{order.StatusPaid, order.StatusConfirmed} {
		if ev := s2.next(t); ev.Status != want || ev.Seq != map[order.Status]int{order.StatusPaid: 3, order.StatusConfirmed: 4}[want] {
			t.Fatalf("resumed event %+v, want %s", ev, want)
		}
	}
	s2.waitEnd(t) // closes after the terminal event

	// Resuming after the terminal event: 204, which tells an EventSource
	// to stop reconnecting (a 200 that ends has it reconnect every 2 s).
	if s3, resp := h.open(h.srv.URL, h.creds.APIKey, o.ID.String(), "4"); s3 != nil || resp.StatusCode != http.StatusNoContent {
		if s3 != nil {
			s3.close()
		}
		t.Fatalf("resume after the terminal event: %d, want 204 No Content", resp.StatusCode)
	}
	// The whole history again, from the start.
	s4, _ := h.open(h.srv.URL, h.creds.APIKey, o.ID.String(), "0")
	for seq := 1; seq <= 4; seq++ {
		if ev := s4.next(t); ev.Seq != seq {
			t.Fatalf("history event %+v, want seq %d", ev, seq)
		}
	}
	s4.waitEnd(t)
}

// TestAcrossReplicas: the stream is served by one replica, the change is
// committed by the database (any process); the stream learns of it through
// NOTIFY, not through anything in the replica's process.
func TestAcrossReplicas(t *testing.T) {
	t.Parallel()
	h := setup(t, time.Minute, time.Minute, true)
	db2 := testenv.Pool(t, h.pool.Config().ConnString())
	n := testenv.NATS(t)
	env2 := testenv.Env(t, nil, n)
	env2.Pool = db2
	hub2 := runHub(t, db2)
	other := replica(t, env2, &orderstream.Handler{Pool: db2, Hub: hub2, ClientID: clientID, KeepAlive: time.Minute, Recheck: time.Minute})
	o := h.newOrder()
	s1, _ := h.open(h.srv.URL, h.creds.APIKey, o.ID.String())
	s2, _ := h.open(other.URL, h.creds.APIKey, o.ID.String())
	s1.next(t)
	s2.next(t)
	h.move(o.ID, order.StatusProcessing, order.StatusRejected)
	for _, s := range []*stream{s1, s2} {
		if ev := s.next(t); ev.Status != order.StatusRejected {
			t.Fatalf("event %+v", ev)
		}
		s.waitEnd(t)
	}
}

// TestRecheckWithoutNotifications: with no listener at all, the periodic
// re-read still delivers the change.
func TestRecheckWithoutNotifications(t *testing.T) {
	t.Parallel()
	h := setup(t, time.Minute, 50*time.Millisecond, false)
	o := h.newOrder()
	s, _ := h.open(h.srv.URL, h.creds.APIKey, o.ID.String())
	s.next(t)
	h.move(o.ID, order.StatusProcessing, order.StatusCancelled)
	if ev := s.next(t); ev.Status != order.StatusCancelled {
		t.Fatalf("event %+v", ev)
	}
	s.waitEnd(t)
}

func TestKeepAlive(t *testing.T) {
	t.Parallel()
	h := setup(t, 30*time.Millisecond, time.Minute, true)
	o := h.newOrder()
	s, _ := h.open(h.srv.URL, h.creds.APIKey, o.ID.String())
	s.next(t)
	if c := testenv.Receive(t, s.comments, 10*time.Second, "a keep-alive comment"); c != ": keep-alive" {
		t.Fatalf("comment %q", c)
	}
}

func problemCode(t *testing.T, resp *http.Response) int {
	t.Helper()
	defer resp.Body.Close()
	var p struct {
		Code int `json:"code"`
	}
	b, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(b, &p); err != nil || resp.Header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("%d %s: not a problem document", resp.StatusCode, b)
	}
	return p.Code
}

func TestRefusals(t *testing.T) {
	t.Parallel()
	h := setup(t, time.Minute, time.Minute, true)
	o := h.newOrder()
	other, err := tenant.Create(t.Context(), h.pool, "other")
	if err != nil {
		t.Fatal(err)
	}
	check := func(name string, key, id string, wantStatus, wantCode int, lastEventID ...string) {
		t.Helper()
		s, resp := h.open(h.srv.URL, key, id, lastEventID...)
		if s != nil {
			t.Errorf("%s: stream opened, want %d", name, wantStatus)
			return
		}
		if resp.StatusCode != wantStatus {
			t.Errorf("%s: status %d, want %d", name, resp.StatusCode, wantStatus)
		}
		if code := problemCode(t, resp); code != wantCode {
			t.Errorf("%s: code %d, want %d", name, code, wantCode)
		}
	}
	check("another client's order", other.APIKey, o.ID.String(), 404, 203)
	check("unknown order", h.creds.APIKey, uuid.NewString(), 404, 203)
	check("malformed order id", h.creds.APIKey, "not-a-uuid", 404, 203)
	check("no key", "", o.ID.String(), 401, 202)
	check("unknown key", "opk_nope", o.ID.String(), 401, 202)
	for _, bad := range []string{"abc", "-1", "+1", "01", "1.5", "1e3", "99999999999", "2147483648", "0x10", "1 2"} {
		check("Last-Event-ID "+strconv.Quote(bad), h.creds.APIKey, o.ID.String(), 400, 201, bad)
	}
	check("two Last-Event-ID headers", h.creds.APIKey, o.ID.String(), 400, 201, "1", "2")
}

func TestParseLastEventID(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]int{"": 0, " ": 0, "0": 0, "7": 7, " 12 ": 12, "2147483647": 2147483647} {
		if got, err := orderstream.ParseLastEventID(in); err != nil || got != want {
			t.Errorf("ParseLastEventID(%q) = %d, %v", in, got, err)
		}
	}
}

func FuzzParseLastEventID(f *testing.F) {
	for _, s := range []string{"", "0", "12", "-1", "01", "x", "2147483648"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := orderstream.ParseLastEventID(s)
		if err != nil {
			return
		}
		if n < 0 || (strings.TrimSpace(s) != "" && strconv.Itoa(n) != strings.TrimSpace(s)) {
			t.Fatalf("ParseLastEventID(%q) = %d", s, n)
		}
	})
}

package producer

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"golang.org/x/time/rate"

	"orderpipe/producer/problem"
	"orderpipe/shared/app"
	"orderpipe/shared/metrics"
	"orderpipe/shared/order"
	"orderpipe/shared/tenant"
	"orderpipe/shared/tracing"
)

// MaxBodyBytes is the largest create-order body accepted (64 KiB).
const MaxBodyBytes = 64 << 10

// Header names of the contract.
const (
	HeaderIdempotencyKey = "Idempotency-Key"
	HeaderReplayed       = "Idempotent-Replayed"
)

//go:embed openapi.json
var openAPI []byte

// OpenAPI returns the OpenAPI 3.1 document of the intake API.
func OpenAPI() []byte { return append([]byte(nil), openAPI...) }

// route is one operation of the API; the OpenAPI test checks the document
// against this table.
type route struct {
	method, pattern string
	// statuses the operation answers with; guarded operations add
	// guardedStatuses (authentication, rate limit, in-flight bound,
	// unavailable database).
	statuses []int
	guarded  bool
}

var guardedStatuses = []int{401, 429, 500, 503}

// routes lists the intake's own operations.
var routes = []route{
	{"POST", "/v1/orders", []int{200, 202, 400, 409, 413, 415, 422}, true},
	{"GET", "/v1/orders", []int{200, 400, 404}, true},
	{"POST", "/v1/idempotency-tokens", []int{201, 400, 413, 415}, true},
	{"GET", "/v1/orders/{order_id}", []int{200, 404}, true},
	{"GET", "/openapi.json", []int{200}, false},
}

type clientKey struct{}

// ClientFrom returns the authenticated client of a request handled inside
// the auth middleware.
func ClientFrom(ctx context.Context) (tenant.Client, bool) {
	c, ok := ctx.Value(clientKey{}).(tenant.Client)
	return c, ok
}

// ClientID returns the id of the authenticated client of a request handled
// inside the auth middleware (the form the events stream and the MCP
// endpoint take).
func ClientID(r *http.Request) (uuid.UUID, bool) {
	c, ok := ClientFrom(r.Context())
	return c.ID, ok
}

// API is the intake's HTTP layer.
type API struct {
	svc      *Service
	env      *app.Env
	inflight chan struct{}
	streams  chan struct{}
	keys     *tenant.KeyCache

	mu        sync.Mutex
	limiters  map[uuid.UUID]*rate.Limiter
	failures  map[string]*rate.Limiter // unknown API keys per remote address
	good      map[[32]byte]struct{}    // hashes of keys that authenticated here
	perClient map[uuid.UUID]int        // open streams and /mcp requests
}

// Handler returns the intake's HTTP handler: the order routes, the OpenAPI
// document, /healthz, /readyz, /metrics and whatever opts.Extra adds.
func Handler(env *app.Env, opts Options) http.Handler {
	h, _ := NewAPI(env, opts)
	return h
}

// NewAPI returns the handler and the API (whose Service the MCP endpoint
// may share).
func NewAPI(env *app.Env, opts Options) (http.Handler, *API) {
	return newAPI(env, NewService(env, opts))
}

func newAPI(env *app.Env, svc *Service) (http.Handler, *API) {
	a := &API{svc: svc, env: env, inflight: make(chan struct{}, svc.opts.MaxInFlight), streams: make(chan struct{}, svc.opts.MaxStreams),
		limiters: map[uuid.UUID]*rate.Limiter{}, failures: map[string]*rate.Limiter{}, good: map[[32]byte]struct{}{},
		perClient: map[uuid.UUID]int{}, keys: tenant.NewKeyCache(5*time.Second, 10000)}
	mux := http.NewServeMux()
	guarded := func(h http.HandlerFunc) http.Handler { return a.deadline(a.bound(a.Authenticate(h))) }
	mux.Handle("POST /v1/orders", guarded(a.create))
	mux.Handle("GET /v1/orders", guarded(a.getByRequestID))
	mux.Handle("POST /v1/idempotency-tokens", guarded(a.issueToken))
	mux.Handle("GET /v1/orders/{order_id}", guarded(a.get))
	mux.HandleFunc("GET /openapi.json", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(openAPI)
	})
	env.Mount(mux)
	if svc.opts.Extra != nil {
		svc.opts.Extra(mux, func(h http.Handler) http.Handler { return a.streamBound(a.Authenticate(a.clientStreamBound(h))) })
	}
	return problemsForMux(mux, env.Logger), a
}

// Service returns the create and read logic behind the API.
func (a *API) Service() *Service { return a.svc }

// problemsForMux answers the mux's own 404 and 405 (unknown path, wrong
// method) with problem documents, keeping the mux's Allow header.
func problemsForMux(mux *http.ServeMux, logger *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h, pattern := mux.Handler(r)
		if pattern == "GET /readyz" {
			readyWithoutDetails(h, w, r, logger)
			return
		}
		if pattern != "" && !traced(pattern) {
			mux.ServeHTTP(w, r)
			return
		}
		if pattern != "" {
			// Continue the caller's trace (W3C traceparent), so that the
			// order's events and logs carry it.
			md := map[string]string{}
			for _, k := range []string{"traceparent", "tracestate", "baggage"} {
				if v := r.Header.Get(k); v != "" {
					md[k] = v
				}
			}
			ctx, span := tracing.Tracer().Start(tracing.Extract(r.Context(), md), pattern)
			defer span.End()
			mux.ServeHTTP(w, r.WithContext(ctx)) // sets the path values, which Handler does not
			return
		}
		rec := &statusOnly{header: http.Header{}}
		h.ServeHTTP(rec, r)
		switch rec.code {
		case http.StatusMethodNotAllowed:
			p := problem.Newf(problem.MethodNotAllowed, "%s is not allowed on %s", r.Method, r.URL.Path)
			p.Allow = rec.header.Get("Allow")
			problem.Write(w, p)
		case http.StatusNotFound:
			problem.Write(w, problem.Newf(problem.NotFound, "no such path: %s", r.URL.Path))
		default: // a redirect (path cleaning): pass it on
			for k, v := range rec.header {
				w.Header()[k] = v
			}
			w.WriteHeader(rec.code)
		}
	})
}

// traced reports whether requests to a pattern get a span: the API's, not
// health checks, metrics scrapes or the document.
func traced(pattern string) bool {
	switch pattern {
	case "GET /healthz", "GET /readyz", "GET /metrics", "GET /openapi.json":
		return false
	}
	return true
}

// statusOnly records the status and headers of the mux's error handlers and
// drops their text body.
type statusOnly struct {
	header http.Header
	code   int
}

func (s *statusOnly) Header() http.Header { return s.header }
func (s *statusOnly) WriteHeader(code int) {
	if s.code == 0 {
		s.code = code
	}
}
func (s *statusOnly) Write(b []byte) (int, error) {
	if s.code == 0 {
		s.code = http.StatusOK
	}
	return len(b), nil
}

// deadline takes the server deadline once, as the request enters: the
// authentication, the body read, the transaction and the inline publish
// all share it, so a request ends within Timeout however its time is
// spent among them.
func (a *API) deadline(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), a.svc.opts.Timeout)
		defer cancel()
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// bound refuses a request at once (503, code 103) when MaxInFlight are
// being handled.
// InFlight is how many requests hold a slot of the in-flight bound now.
func (a *API) InFlight() int { return len(a.inflight) }

func (a *API) bound(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case a.inflight <- struct{}{}:
			defer func() { <-a.inflight }()
			next.ServeHTTP(w, r)
		default:
			problem.Write(w, problem.New(problem.Overloaded, "the intake is at its bound of requests in flight"))
		}
	})
}

// Authenticate checks the bearer API key (401, code 202) and the client's
// rate (429, code 102), then calls next with the client in the context
// (ClientFrom). A database failure during the check is 503, code 101. A
// remote address past its budget of unknown keys (AuthFailureRate,
// AuthFailureBurst) gets 429, code 102, without a query, unless its key
// authenticated in this process before.
func (a *API) Authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, ok := bearer(r.Header.Get("Authorization"))
		if !ok {
			a.unauthenticated(w, r, "send Authorization: Bearer <api key>")
			return
		}
		// An address that keeps sending unknown keys is refused before
		// its guesses cost a query; a key that authenticated in this
		// process before is still looked up (so a client behind the same
		// address is not locked out).
		addr := remoteHost(r)
		hash := tenant.HashKey(key)
		if wait, ok := a.failuresLeft(addr); !ok && !a.knownGood(hash) {
			rateLimited(w, r, wait, "too many requests with unknown API keys from this address")
			return
		}
		// Within the request's deadline when it has one (the intake's
		// routes); the streams and /mcp bound only this query.
		ctx, cancel := context.WithTimeout(r.Context(), a.svc.opts.Timeout)
		c, err := a.keys.Authenticate(ctx, a.env.Pool, key)
		cancel()
		if errors.Is(err, tenant.ErrUnauthenticated) {
			a.failed(addr)
			a.unauthenticated(w, r, "unknown API key")
			return
		}
		if err != nil {
			a.env.Logger.WarnContext(r.Context(), "authenticate", slog.Any("error", err))
			a.writeError(w, r, err)
			return
		}
		a.remember(hash)
		if wait, ok := a.allow(c); !ok {
			rateLimited(w, r, wait, "this client is over its request rate")
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), clientKey{}, c)))
	})
}

// rateLimited answers 429 (code RateLimited) with Retry-After wait,
// counting an order-create request as rate limited.
func rateLimited(w http.ResponseWriter, r *http.Request, wait time.Duration, msg string) {
	if r.Method == http.MethodPost {
		metrics.IntakeRequests.WithLabelValues(metrics.OutcomeRateLimited).Inc()
	}
	p := problem.New(problem.RateLimited, msg)
	p.RetryAfter = wait
	problem.Write(w, p)
}

func (a *API) unauthenticated(w http.ResponseWriter, r *http.Request, detail string) {
	if r.Method == http.MethodPost {
		metrics.IntakeRequests.WithLabelValues(metrics.OutcomeUnauthenticated).Inc()
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="orderpipe"`)
	problem.Write(w, problem.New(problem.Unauthenticated, detail))
}

// bearer extracts the token of an "Authorization: Bearer <token>" header
// (the scheme is case-insensitive).
func bearer(h string) (string, bool) {
	scheme, token, ok := strings.Cut(strings.TrimSpace(h), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

// maxFailureEntries bounds the map of remote addresses that sent unknown
// keys; past it, the addresses whose buckets are full again are dropped.
const maxFailureEntries = 10000

// failuresLeft reports whether addr may still try a key (its bucket of
// failures has a token), or how long until it may.
func (a *API) failuresLeft(addr string) (time.Duration, bool) {
	a.mu.Lock()
	lim, ok := a.failures[addr]
	a.mu.Unlock()
	if !ok {
		return 0, true
	}
	now := time.Now()
	tokens := lim.TokensAt(now)
	if tokens >= 1 {
		return 0, true
	}
	wait := time.Duration((1 - tokens) / float64(lim.Limit()) * float64(time.Second))
	return max(wait, time.Second), false
}

// failed takes a token from addr's bucket of failures.
func (a *API) failed(addr string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	lim, ok := a.failures[addr]
	if !ok {
		if len(a.failures) >= maxFailureEntries {
			now := time.Now()
			for k, l := range a.failures {
				if l.TokensAt(now) >= float64(l.Burst()) {
					delete(a.failures, k)
				}
			}
		}
		lim = rate.NewLimiter(rate.Limit(a.svc.opts.AuthFailureRate), a.svc.opts.AuthFailureBurst)
		a.failures[addr] = lim
	}
	lim.Allow()
}

// maxGoodKeys bounds the set of keys known to be good; it starts over
// when full.
const maxGoodKeys = 100000

func (a *API) knownGood(hash [32]byte) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	_, ok := a.good[hash]
	return ok
}

func (a *API) remember(hash [32]byte) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.good[hash]; ok {
		return
	}
	if len(a.good) >= maxGoodKeys {
		clear(a.good)
	}
	a.good[hash] = struct{}{}
}

// remoteHost is the address a request came from, without its port; an
// IPv6 address stands for its /64 (one host's usual allocation).
func remoteHost(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	if ip, err := netip.ParseAddr(host); err == nil && ip.Is6() && !ip.Is4In6() {
		if p, err := ip.WithZone("").Prefix(64); err == nil {
			return p.String()
		}
	}
	return host
}

// streamBound refuses an Extra route's request at once (503, code 103)
// when MaxStreams are open, and limits its body to MaxBodyBytes.
func (a *API) streamBound(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case a.streams <- struct{}{}:
			defer func() { <-a.streams }()
		default:
			problem.Write(w, problem.New(problem.Overloaded, "the intake is at its bound of open streams"))
			return
		}
		if r.ContentLength > MaxBodyBytes {
			problem.Write(w, problem.Newf(problem.TooLarge, "the body is larger than %d bytes", MaxBodyBytes))
			return
		}
		if r.Body != nil {
			r.Body = http.MaxBytesReader(w, r.Body, MaxBodyBytes)
		}
		next.ServeHTTP(w, r)
	})
}

// clientStreamBound refuses an Extra route's request (429, code 102) when
// its client has MaxStreamsPerClient open; inside Authenticate.
func (a *API) clientStreamBound(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, _ := ClientFrom(r.Context())
		a.mu.Lock()
		if a.perClient[c.ID] >= a.svc.opts.MaxStreamsPerClient {
			a.mu.Unlock()
			p := problem.New(problem.RateLimited, "this client has as many streams open as it may")
			p.RetryAfter = time.Second
			problem.Write(w, p)
			return
		}
		a.perClient[c.ID]++
		a.mu.Unlock()
		defer func() {
			a.mu.Lock()
			if a.perClient[c.ID]--; a.perClient[c.ID] <= 0 {
				delete(a.perClient, c.ID)
			}
			a.mu.Unlock()
		}()
		next.ServeHTTP(w, r)
	})
}

// readyWithoutDetails serves /readyz (h) on the public port with each
// dependency's state as one word ("ok", or "unavailable" for an error
// text): raw errors name hosts, users and databases. They are logged.
func readyWithoutDetails(h http.Handler, w http.ResponseWriter, r *http.Request, logger *slog.Logger) {
	rec := &recorder{statusOnly: statusOnly{header: http.Header{}}}
	h.ServeHTTP(rec, r)
	if rec.code == 0 {
		rec.code = http.StatusOK
	}
	var checks map[string]any
	if err := json.Unmarshal(rec.body.Bytes(), &checks); err != nil {
		checks = map[string]any{"status": "unavailable"}
	}
	for name, v := range checks {
		if s, ok := v.(string); ok && oneWord(s) {
			continue
		}
		logger.WarnContext(r.Context(), "readiness check failed", slog.String("dependency", name), slog.Any("error", v))
		checks[name] = "unavailable"
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(rec.code)
	_ = json.NewEncoder(w).Encode(checks)
}

// oneWord reports whether a readiness value is a state ("ok",
// "degraded"), not an error text.
func oneWord(s string) bool {
	if s == "" || len(s) > 20 {
		return false
	}
	for _, c := range s {
		if c < 'a' || c > 'z' {
			return false
		}
	}
	return true
}

// recorder keeps a handler's status and body.
type recorder struct {
	statusOnly
	body bytes.Buffer
}

func (rc *recorder) Write(b []byte) (int, error) {
	if rc.code == 0 {
		rc.code = http.StatusOK
	}
	return rc.body.Write(b)
}

// allow takes a token from the client's bucket, or says how long until one
// is there. The bucket follows the client's own limits (as of its last
// authentication), else the intake's defaults.
func (a *API) allow(c tenant.Client) (time.Duration, bool) {
	limit, burst := rate.Limit(a.svc.opts.RateLimit), a.svc.opts.RateBurst
	if c.Limits.Rate > 0 {
		limit = rate.Limit(c.Limits.Rate)
	}
	if c.Limits.Burst > 0 {
		burst = c.Limits.Burst
	}
	a.mu.Lock()
	lim, ok := a.limiters[c.ID]
	if !ok {
		lim = rate.NewLimiter(limit, burst)
		a.limiters[c.ID] = lim
	}
	a.mu.Unlock()
	if lim.Limit() != limit {
		lim.SetLimit(limit)
	}
	if lim.Burst() != burst {
		lim.SetBurst(burst)
	}
	now := time.Now()
	res := lim.ReserveN(now, 1)
	if d := res.DelayFrom(now); d > 0 {
		res.CancelAt(now)
		return d, false
	}
	return 0, true
}

// writeError answers err as a problem; the errors that are the server's,
// not the client's, are logged.
func (a *API) writeError(w http.ResponseWriter, r *http.Request, err error) {
	p := problem.From(err)
	if p.Code.Retryable() {
		a.env.Logger.WarnContext(r.Context(), "request failed", slog.String("method", r.Method), slog.String("path", r.URL.Path),
			slog.Int("code", int(p.Code)), slog.Any("error", err))
	}
	p.Instance = r.URL.Path
	problem.Write(w, p)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// create is POST /v1/orders.
func (a *API) create(w http.ResponseWriter, r *http.Request) {
	c, _ := ClientFrom(r.Context())
	invalid := func(err error) {
		metrics.IntakeRequests.WithLabelValues(metrics.OutcomeRejectedInvalid).Inc()
		a.writeError(w, r, err)
	}
	if err := checkJSON(r.Header.Get("Content-Type")); err != nil {
		invalid(err)
		return
	}
	body, err := a.readBody(w, r)
	var late *problem.Problem
	if errors.As(err, &late) { // the body did not arrive within the deadline
		metrics.IntakeRequests.WithLabelValues(metrics.OutcomeUnavailable).Inc()
		a.writeError(w, r, err)
		return
	}
	if err != nil {
		invalid(err)
		return
	}
	opts := a.svc.DecodeOptions()
	if vals, ok := r.Header[HeaderIdempotencyKey]; ok {
		opts.HasIdempotencyKey = true
		opts.IdempotencyKey = strings.Join(vals, ",")
	}
	req, err := order.DecodeCreateRequest(body, opts)
	if err != nil {
		invalid(err)
		return
	}
	o, replayed, err := a.svc.Create(r.Context(), c.ID, req)
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	if replayed {
		w.Header().Set(HeaderReplayed, "true")
		w.Header().Set("Content-Location", "/v1/orders/"+o.ID.String())
		writeJSON(w, http.StatusOK, o)
		return
	}
	w.Header().Set("Location", "/v1/orders/"+o.ID.String())
	writeJSON(w, http.StatusAccepted, o)
}

// readBody reads a request body of at most MaxBodyBytes within the
// request's deadline (a client that trickles it does not hold a slot for
// longer). The error is a *http.MaxBytesError (413), the server's deadline
// (503, code 101: a body still arriving at the deadline may be a valid
// order on a slow network, to retry with the same request_id), or an
// invalid-input *order.ValidationError.
func (a *API) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	rc := http.NewResponseController(w)
	dl, ok := r.Context().Deadline()
	if !ok {
		dl = time.Now().Add(a.svc.opts.Timeout)
	}
	_ = rc.SetReadDeadline(dl)
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	_ = rc.SetReadDeadline(time.Time{}) // the connection may serve further requests
	var mbe *http.MaxBytesError
	switch {
	case err == nil, errors.As(err, &mbe):
	case errors.Is(err, os.ErrDeadlineExceeded):
		err = problem.New(problem.Unavailable, "the request body did not arrive within the server's deadline; retry with the same request_id")
	default:
		err = &order.ValidationError{Fields: []order.FieldError{{Field: "body", Message: "could not be read: " + err.Error()}}}
	}
	return body, err
}

// issueToken is POST /v1/idempotency-tokens: an empty body (or an empty
// JSON object) in, 201 {"token","expires_at"} out.
func (a *API) issueToken(w http.ResponseWriter, r *http.Request) {
	c, _ := ClientFrom(r.Context())
	body, err := a.readBody(w, r)
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	if len(bytes.TrimSpace(body)) > 0 {
		if err := checkJSON(r.Header.Get("Content-Type")); err != nil {
			a.writeError(w, r, err)
			return
		}
		var fields map[string]json.RawMessage
		if json.Unmarshal(body, &fields) != nil || fields == nil || len(fields) > 0 {
			a.writeError(w, r, &order.ValidationError{Fields: []order.FieldError{{Field: "body", Message: "must be empty or {}: a token takes no parameters"}}})
			return
		}
	}
	t, err := a.svc.IssueToken(r.Context(), c.ID)
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, t)
}

// checkJSON accepts application/json (charset utf-8 if given); anything
// else is 415.
func checkJSON(ct string) error {
	if ct == "" {
		return problem.New(problem.UnsupportedMediaType, "Content-Type is missing; send application/json")
	}
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil || mt != "application/json" {
		return problem.Newf(problem.UnsupportedMediaType, "Content-Type %q is not application/json", ct)
	}
	if cs, ok := params["charset"]; ok && !strings.EqualFold(cs, "utf-8") {
		return problem.Newf(problem.UnsupportedMediaType, "charset %q is not utf-8", cs)
	}
	return nil
}

// get is GET /v1/orders/{order_id}.
func (a *API) get(w http.ResponseWriter, r *http.Request) {
	c, _ := ClientFrom(r.Context())
	id, err := uuid.Parse(r.PathValue("order_id"))
	if err != nil {
		a.writeError(w, r, problem.New(problem.NotFound, "no such order (order ids are UUIDs)"))
		return
	}
	o, err := a.svc.Get(r.Context(), c.ID, id)
	a.writeOK(w, r, o, err)
}

// getByRequestID is GET /v1/orders?request_id=X.
func (a *API) getByRequestID(w http.ResponseWriter, r *http.Request) {
	c, _ := ClientFrom(r.Context())
	q := r.URL.Query()
	rid := q.Get("request_id")
	if err := order.ValidateRequestID(rid); err != nil || len(q["request_id"]) != 1 {
		msg := "is required, once"
		if err != nil && rid != "" {
			msg = err.Error()
		}
		a.writeError(w, r, &order.ValidationError{Fields: []order.FieldError{{Field: "request_id", Message: msg}}})
		return
	}
	o, err := a.svc.GetByRequestID(r.Context(), c.ID, rid)
	a.writeOK(w, r, o, err)
}

// writeOK writes v with 200 OK, or err as a problem when err is not nil.
func (a *API) writeOK(w http.ResponseWriter, r *http.Request, v any, err error) {
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

// Package producer is orderpipe's intake: the HTTP API that accepts orders
// idempotently per (client, request_id), stores each one with its accepted
// event in the transactional outbox, publishes the event right after the
// commit, and answers 202 at once.
//
// Accepted means durable: the 202 (or the 200 of a replay) is sent only
// after the order row and its outbox event are committed in PostgreSQL.
// Publishing to NATS is a step after that: when NATS is down, or the
// process dies between the commit and the publish, the event stays in the
// outbox and the relay loop (Run starts one in every producer process)
// publishes it later with the same Nats-Msg-Id, so the broker drops any
// duplicate. NATS being down therefore never refuses an order; PostgreSQL
// being down does (503, code 101, with Retry-After).
//
// The create-order logic is Service.Create, which the MCP tool calls
// without HTTP; its errors map to codes through producer/problem.
package producer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/google/uuid"

	"orderpipe/shared/app"
	"orderpipe/shared/config"
	"orderpipe/shared/failpoint"
	"orderpipe/shared/idemtoken"
	"orderpipe/shared/metrics"
	"orderpipe/shared/order"
	"orderpipe/shared/orderstore"
	"orderpipe/shared/outbox"
)

// FailAfterCommit fires after an order's transaction committed and before
// its accepted event is published.
const FailAfterCommit = "intake.after-commit"

// FailAfterTokenClaim fires after a request claimed its idempotency token
// and before its order is written.
const FailAfterTokenClaim = "intake.after-token-claim"

// Environment variables that only the intake reads.
var (
	EnvTimeout     = config.DurationSetting("ORDERPIPE_INTAKE_TIMEOUT", "the intake's deadline for its own work on one request (database and broker calls); clients' per-attempt timeouts must be longer", DefaultTimeout)
	EnvRateLimit   = config.IntSetting("ORDERPIPE_RATE_LIMIT", "requests per second that one API client may send to the intake (token bucket rate), unless the client has its own (clients create --rate-limit)", DefaultRateLimit, 1)
	EnvRateBurst   = config.IntSetting("ORDERPIPE_RATE_BURST", "burst of one API client's token bucket, unless the client has its own (clients create --burst)", DefaultRateBurst, 1)
	EnvMaxInFlight = config.IntSetting("ORDERPIPE_MAX_IN_FLIGHT", "requests the intake handles at once; more get 503 (code 103) at once", DefaultMaxInFlight, 1)
)

// Environment variables of the bounds on the events streams and /mcp.
var (
	EnvMaxStreams          = config.IntSetting("ORDERPIPE_MAX_STREAMS", "event streams and /mcp requests the intake serves at once; more get 503 (code 103) at once", DefaultMaxStreams, 1)
	EnvMaxStreamsPerClient = config.IntSetting("ORDERPIPE_MAX_STREAMS_PER_CLIENT", "event streams and /mcp requests one API client may have open at once; more get 429 (code 102)", DefaultMaxStreamsPerClient, 1)
)

// Defaults of Options.
const (
	DefaultTimeout              = 5 * time.Second
	DefaultRateLimit            = 1000
	DefaultRateBurst            = 2000
	DefaultMaxInFlight          = 1024
	DefaultInlinePublishTimeout = time.Second
	DefaultMaxStreams           = 1024
	DefaultMaxStreamsPerClient  = 16
	DefaultAuthFailureRate      = 1
	DefaultAuthFailureBurst     = 20
)

// Options configure the intake. The zero value of a field means its
// default.
type Options struct {
	// Timeout is the server deadline: everything one request does
	// (authentication, the order transaction, the inline publish) happens
	// within it. Clients set their per-attempt timeout above it.
	Timeout time.Duration
	// RateLimit is the default per-client rate in requests per second;
	// RateBurst its bucket size. A client's own limits
	// (tenant.Client.Limits) take their place.
	RateLimit float64
	RateBurst int
	// MaxInFlight bounds the requests handled at once.
	MaxInFlight int
	// MaxStreams bounds the Extra routes' requests (event streams, /mcp)
	// served at once; MaxStreamsPerClient bounds one client's.
	MaxStreams          int
	MaxStreamsPerClient int
	// AuthFailureRate is how many requests with an unknown API key one
	// remote address may send per second (AuthFailureBurst at once); past
	// it, its requests get 429 (code 102) before any database query.
	AuthFailureRate  float64
	AuthFailureBurst int
	// InlinePublishTimeout bounds the publish right after the commit; the
	// relay catches up with whatever it could not publish.
	InlinePublishTimeout time.Duration
	// Relay publishes accepted events inline; default a relay on env.
	Relay *outbox.Relay
	// Extra adds routes to the intake's mux (the events stream, the MCP
	// endpoint). auth wraps a handler with the intake's authentication
	// and per-client rate limit; inside it, ClientFrom(r.Context())
	// returns the caller. Extra routes are not counted against
	// MaxInFlight (streams are long-lived) but against MaxStreams and
	// MaxStreamsPerClient, their bodies are limited to MaxBodyBytes, and
	// they get the intake's JSON problems for unknown paths and methods. To document one in
	// openapi.json, mark its operation "x-orderpipe-extra": true (the
	// router test leaves those to the tests of the package that adds them).
	Extra func(mux *http.ServeMux, auth func(http.Handler) http.Handler)
	// TokenTTL is the time to live of an issued idempotency token.
	TokenTTL time.Duration
	// NewOrderNo replaces order.NewOrderNo (tests).
	NewOrderNo func(time.Time) string
}

// OptionsFromEnv reads the intake's variables.
func OptionsFromEnv() (Options, error) {
	var o Options
	errs := []error{EnvTimeout.Into(&o.Timeout)}
	rateInt, err := EnvRateLimit.Get()
	o.RateLimit = float64(rateInt)
	errs = append(errs, err,
		EnvRateBurst.Into(&o.RateBurst),
		EnvMaxInFlight.Into(&o.MaxInFlight),
		EnvMaxStreams.Into(&o.MaxStreams),
		EnvMaxStreamsPerClient.Into(&o.MaxStreamsPerClient),
		idemtoken.EnvTTL.Into(&o.TokenTTL),
	)
	return o, errors.Join(errs...)
}

// defaultOptions holds the value that an unset field of Options stands for.
var defaultOptions = Options{
	Timeout:              DefaultTimeout,
	RateLimit:            DefaultRateLimit,
	RateBurst:            DefaultRateBurst,
	MaxInFlight:          DefaultMaxInFlight,
	MaxStreams:           DefaultMaxStreams,
	MaxStreamsPerClient:  DefaultMaxStreamsPerClient,
	AuthFailureRate:      DefaultAuthFailureRate,
	AuthFailureBurst:     DefaultAuthFailureBurst,
	TokenTTL:             idemtoken.DefaultTTL,
	InlinePublishTimeout: DefaultInlinePublishTimeout,
}

// defaults fills in the fields that are not positive (unset).
func (o *Options) defaults() {
	config.FillNotPositive(o, defaultOptions)
}

// Service is the create and read logic of the intake, without HTTP.
type Service struct {
	env   *app.Env
	opts  Options
	relay *outbox.Relay
	batch *batcher
}

// NewService returns the intake service on env.
func NewService(env *app.Env, opts Options) *Service {
	opts.defaults()
	relay := opts.Relay
	if relay == nil {
		relay = &outbox.Relay{Pool: env.Pool, JS: env.JS, Topology: env.Topology, Logger: env.Logger,
			PublishTimeout: opts.InlinePublishTimeout}
	}
	s := &Service{env: env, opts: opts, relay: relay}
	s.batch = newBatcher(s)
	return s
}

// DecodeOptions returns the request rules of this deployment, for a caller
// that decodes a create request itself (the MCP tool).
func (s *Service) DecodeOptions() order.DecodeOptions {
	return order.DecodeOptions{AllowPrivateCallbacks: s.env.Config.AllowPrivateCallbacks}
}

// Timeout is the server deadline of one request.
func (s *Service) Timeout() time.Duration { return s.opts.Timeout }

// Create accepts an order for a client: it returns the new order (replayed
// false) once it is committed with its accepted event, or the existing
// order of the same (client, request_id) and payload (replayed true). A
// different payload under the same request_id returns an error wrapping
// order.ErrRequestIDReused; an unreachable database one that
// problem.From maps to a class 1 code. The work is bounded by the server
// deadline, or by ctx's deadline when that is earlier (the HTTP intake
// passes the one it took when the request entered).
func (s *Service) Create(ctx context.Context, clientID uuid.UUID, req order.CreateRequest) (o order.Order, replayed bool, err error) {
	t0 := time.Now()
	outcome := metrics.OutcomeUnavailable
	defer func() {
		metrics.IntakeRequests.WithLabelValues(outcome).Inc()
		metrics.IntakeDuration.WithLabelValues(outcome).Observe(time.Since(t0).Seconds())
	}()
	// The HTTP intake took the server deadline as the request entered; a
	// second timer per request is only needed for a caller without one
	// as near.
	if dl, ok := ctx.Deadline(); !ok || time.Until(dl) > s.opts.Timeout {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.opts.Timeout)
		defer cancel()
	}
	if idemtoken.IsToken(req.RequestID) {
		claimed, cerr := idemtoken.Claim(ctx, s.env.Pool, clientID, req.RequestID, s.opts.Timeout)
		if cerr != nil {
			if errors.Is(cerr, idemtoken.ErrUnknown) || errors.Is(cerr, idemtoken.ErrExpired) {
				outcome = metrics.OutcomeRejectedInvalid
			}
			return order.Order{}, false, fmt.Errorf("create order with token %s: %w", req.RequestID, cerr)
		}
		if claimed {
			// err is the named result: settled with what the caller gets.
			defer func() { s.settleToken(ctx, req.RequestID, err) }()
			if ferr := failpoint.Inject(FailAfterTokenClaim); ferr != nil {
				return order.Order{}, false, ferr
			}
		}
	}
	res, err := s.batch.insert(ctx, clientID, req)
	if res.OrderNoCollisions > 0 {
		metrics.UniqueConflicts.WithLabelValues("order_no").Add(float64(res.OrderNoCollisions))
		s.env.Logger.WarnContext(ctx, "order number collided and was replaced", slog.Int("collisions", res.OrderNoCollisions),
			slog.String("request_id", req.RequestID))
	}
	if res.RequestIDConflict {
		metrics.UniqueConflicts.WithLabelValues("request_id").Inc()
	}
	if errors.Is(err, order.ErrRequestIDReused) {
		outcome = metrics.OutcomeMismatch
		return order.Order{}, false, err
	}
	if err != nil {
		return order.Order{}, false, fmt.Errorf("create order for request %s: %w", req.RequestID, err)
	}
	if res.Replayed {
		outcome = metrics.OutcomeReplayed
		s.logOrder(ctx, slog.LevelDebug, "order request replayed", clientID, res.Order)
		return res.Order, true, nil
	}
	outcome = metrics.OutcomeCreated
	s.logOrder(ctx, slog.LevelInfo, "order accepted", clientID, res.Order)
	return res.Order, false, nil
}

// logOrder logs msg about an order at level. Its attributes are built
// only when the level is enabled: at the intake's rate, building a child
// logger per request for a line that is then dropped cost about 3% of
// the process's CPU.
func (s *Service) logOrder(ctx context.Context, level slog.Level, msg string, clientID uuid.UUID, o order.Order) {
	if !s.env.Logger.Enabled(ctx, level) {
		return
	}
	s.env.Logger.LogAttrs(ctx, level, msg, slog.String("request_id", o.RequestID), slog.String("order_id", o.ID.String()),
		slog.String("client_id", clientID.String()), slog.String("order_no", o.No))
}

// settleToken ends a request's hold on its token: used when its order
// exists (created, replayed, or there under another payload), else its
// lease lapses so that the next attempt claims it at once. A failure here
// leaves the token processing until its lease passes; the order's dedupe
// still answers the next attempt correctly.
func (s *Service) settleToken(ctx context.Context, token string, err error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	var serr error
	if err == nil || errors.Is(err, order.ErrRequestIDReused) {
		serr = idemtoken.MarkUsed(ctx, s.env.Pool, token)
	} else {
		serr = idemtoken.Lapse(ctx, s.env.Pool, token)
	}
	if serr != nil {
		s.env.Logger.WarnContext(ctx, "settle idempotency token", slog.String("request_id", token), slog.Any("error", serr))
	}
}

// IssueToken issues a client an idempotency token that lives for the
// configured time to live.
func (s *Service) IssueToken(ctx context.Context, clientID uuid.UUID) (idemtoken.Token, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	t, err := idemtoken.Issue(ctx, s.env.Pool, clientID, s.opts.TokenTTL)
	if err == nil {
		metrics.TokensIssued.Inc()
	}
	return t, err
}

// Get returns a client's order by id (orderstore.ErrNotFound when it is
// not the client's).
func (s *Service) Get(ctx context.Context, clientID, orderID uuid.UUID) (order.Order, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	return orderstore.Get(ctx, s.env.Pool, clientID, orderID)
}

// GetByRequestID returns a client's order by request_id.
func (s *Service) GetByRequestID(ctx context.Context, clientID uuid.UUID, requestID string) (order.Order, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	return orderstore.GetByRequestID(ctx, s.env.Pool, clientID, requestID)
}

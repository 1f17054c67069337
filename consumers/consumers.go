// Package consumers runs the pipeline's steps: one Watermill router whose
// handlers read durable JetStream pull consumers, one per step, named after
// the step (see consumers/step for what a step is, and consumers/inventory,
// consumers/payment, consumers/confirm for the steps).
//
// At least once in, exactly once out: every message may be delivered many
// times (redelivery, a republish, a replay, two replicas), and every effect
// happens once because the step's dedupe row and its effect commit in one
// PostgreSQL transaction; the order moves by a conditional update; the
// next event is written to the outbox in that same transaction and
// published right after the commit (and by the relay that runs beside the
// router if the process dies in between). Concurrent messages of one step
// share that transaction (a group commit, commit.go); a batch that fails
// runs each of its messages again alone.
//
// Middleware, outermost first: correlation (request and order ids on the
// context logger), poison (a permanent error, or the last allowed
// delivery failing, puts the message in the dead_letters table and acks
// it), retry (a few in-process retries of a transient error with
// backoff; then the message is nacked and JetStream redelivers it later),
// recoverer (a panic becomes a permanent error). Watermill's in-memory
// Deduplicator is not used: it is not atomic with the handler's writes.
package consumers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmetrics "github.com/ThreeDotsLabs/watermill/components/metrics"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"orderpipe/consumers/step"
	"orderpipe/shared/app"
	"orderpipe/shared/metrics"
	"orderpipe/shared/orderevent"
	"orderpipe/shared/outbox"
	"orderpipe/shared/tracing"
)

// Failpoints of the router.
const (
	// FailAfterCommit fires after a step's transaction committed and
	// before its outbox events are published and the message acked.
	FailAfterCommit = "consumer.after-commit"
)

// Pipeline is a router with its steps and the outbox relay of the process.
type Pipeline struct {
	env    *app.Env
	cfg    Config
	router *message.Router
	relay  *outbox.Relay
	steps  []step.Step
	subs   []*subscriber
}

type loggerKey struct{}

// Logger returns the logger of a message's context (with request_id and
// order_id), or slog.Default.
func Logger(ctx context.Context) *slog.Logger {
	if l, ok := ctx.Value(loggerKey{}).(*slog.Logger); ok {
		return l
	}
	return slog.Default()
}

// Build wires the steps into a router on env. Run starts it.
func Build(env *app.Env, cfg Config, steps ...step.Step) (*Pipeline, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("consumer config: %w", err)
	}
	wlog := watermill.NewSlogLoggerWithLevelMapping(env.Logger.With(slog.String("component", "watermill")), map[slog.Level]slog.Level{
		slog.LevelInfo: slog.LevelDebug, // Watermill's start/stop chatter
		// "Handler returned error" for every nack: a transient error that
		// will be redelivered is a warning; our poison middleware logs
		// what is given up on as an error.
		slog.LevelError: slog.LevelWarn,
	})
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: cfg.DrainTimeout}, wlog)
	if err != nil {
		return nil, fmt.Errorf("create router: %w", err)
	}
	// Watermill's own router metrics (handler execution time and messages
	// received, labelled by handler and success only), on the process's
	// registry beside ours: orderpipe_watermill_*.
	wmetrics.NewPrometheusMetricsBuilder(env.Metrics, "orderpipe", "watermill").AddPrometheusRouterMetrics(router)
	p := &Pipeline{
		env:    env,
		cfg:    cfg,
		router: router,
		relay:  &outbox.Relay{Pool: env.Pool, JS: env.JS, Topology: env.Topology, Logger: env.Logger, Ensure: env.EnsureStream},
		steps:  steps,
	}
	router.AddMiddleware(
		p.correlation,
		p.poison,
		middleware.Retry{
			MaxRetries:          cfg.Retries,
			InitialInterval:     cfg.RetryInterval,
			MaxInterval:         cfg.RetryMaxInterval,
			Multiplier:          2,
			RandomizationFactor: 0.2,
			ShouldRetry: func(params middleware.RetryParams) bool {
				return !step.IsPermanent(params.Err)
			},
			ResetContextOnRetry: true,
		}.Middleware,
		middleware.Recoverer,
	)
	seen := map[string]bool{}
	for _, st := range steps {
		if st.Name == "" || seen[st.Name] || len(st.Events) == 0 || (st.Handle == nil) == (st.Batch == nil) || (st.Prepare != nil && st.Batch == nil) {
			return nil, fmt.Errorf("step %q: want a unique name, events, and a Handle or a Batch (with or without a Prepare)", st.Name)
		}
		seen[st.Name] = true
		var subjects []string
		for _, e := range st.Events {
			subjects = append(subjects, env.Topology.Subject(e))
		}
		sub := newSubscriber(env.JS, env.Topology.Stream, consumerConfig(st.Name, subjects, cfg), cfg, env.Logger.With(slog.String("step", st.Name)), env.EnsureStream)
		p.subs = append(p.subs, sub)
		router.AddConsumerHandler(st.Name, st.Name, sub, p.handler(st))
	}
	return p, nil
}

// Relay is the process's outbox relay.
func (p *Pipeline) Relay() *outbox.Relay { return p.relay }

// Running is closed once every handler is subscribed.
func (p *Pipeline) Running() chan struct{} { return p.router.Running() }

// Run runs the router and the outbox relay until ctx ends, then stops
// fetching, lets in-flight messages finish (up to the drain timeout) and
// returns.
func (p *Pipeline) Run(ctx context.Context) error {
	rctx, cancelRelay := context.WithCancel(context.WithoutCancel(ctx))
	relayDone := make(chan error, 1)
	go func() { relayDone <- p.relay.Run(rctx) }()

	routerDone := make(chan error, 1)
	go func() { routerDone <- p.router.Run(context.WithoutCancel(ctx)) }()

	var err error
	var drainUntil time.Time // one drain timeout for the router and the consumers together
	select {
	case <-ctx.Done():
		drainUntil = time.Now().Add(p.cfg.DrainTimeout)
		err = p.router.Close()
		if rerr := <-routerDone; rerr != nil {
			err = errors.Join(err, rerr)
		}
	case err = <-routerDone:
		if err == nil {
			err = errors.New("router stopped")
		}
		drainUntil = time.Now().Add(p.cfg.DrainTimeout)
		_ = p.router.Close()
	}
	for _, s := range p.subs {
		s.stop()
	}
	for _, s := range p.subs {
		if cerr := s.closeBy(drainUntil); cerr != nil {
			err = errors.Join(err, cerr)
		}
	}
	// The relay stops last; rows it leaves pending wait for another
	// process's relay or the next start (their events were published
	// inline unless the broker was away).
	cancelRelay()
	if rerr := <-relayDone; rerr != nil {
		err = errors.Join(err, rerr)
	}
	return err
}

func metaInt(msg *message.Message, key string) int {
	n, _ := strconv.Atoi(msg.Metadata.Get(key))
	return n
}

// correlation starts the step's span (a consumer span in the trace that
// the intake started and the event carried), and puts on the message's
// context a logger naming the message (request_id, order_id, client_id,
// msg_id; trace_id comes from the span when logging with the context). The
// correlation id in the metadata is the request_id, the id the client
// chose.
func (p *Pipeline) correlation(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		rid := msg.Metadata.Get(orderevent.HeaderRequestID)
		if rid != "" {
			middleware.SetCorrelationID(rid, msg)
		}
		name := message.HandlerNameFromCtx(msg.Context())
		oid := msg.Metadata.Get(orderevent.HeaderOrderID)
		ctx, span := tracing.Tracer().Start(msg.Context(), "step "+name,
			trace.WithSpanKind(trace.SpanKindConsumer),
			trace.WithAttributes(
				attribute.String("messaging.system", "nats"),
				attribute.String("messaging.destination.name", msg.Metadata.Get(metaSubject)),
				attribute.String("messaging.message.id", msg.UUID),
				attribute.Int("messaging.delivery.count", metaInt(msg, metaDelivered)),
				attribute.String("orderpipe.order_id", oid),
				attribute.String("orderpipe.request_id", rid),
			))
		defer span.End()
		l := p.env.Logger.With(
			slog.String("handler", name),
			slog.String("msg_id", msg.UUID),
			slog.String("request_id", rid),
			slog.String("order_id", oid),
			slog.String("client_id", msg.Metadata.Get(orderevent.HeaderClientID)),
			slog.Int("delivered", metaInt(msg, metaDelivered)),
		)
		msg.SetContext(context.WithValue(ctx, loggerKey{}, l))
		out, err := middleware.CorrelationID(h)(msg)
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, "step failed; the message will be redelivered")
		}
		return out, err
	}
}

// errPastLastDelivery is the handler's answer to a delivery past the last
// allowed one whose step is not done: no step runs, the message is
// dead-lettered.
var errPastLastDelivery = errors.New("no step run past the last allowed delivery")

// poison dead-letters a message whose error is permanent, or whose last
// allowed delivery (cfg.MaxDeliver) failed, and acks it; the order is left
// to the compensator. Other errors pass through (nack, redelivered later).
//
// A message is acked only once its dead letter is stored: when storing it
// fails (PostgreSQL down), the message is nacked and comes back. A delivery
// past cfg.MaxDeliver (the last allowed one could not store its dead
// letter, or its process died, or its ack was lost) runs no step: the
// handler only checks the dedupe row (errPastLastDelivery when the step
// is not done), and the message is dead-lettered or, done, acked.
func (p *Pipeline) poison(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		delivered := metaInt(msg, metaDelivered)
		out, err := h(msg)
		if err == nil {
			return out, nil
		}
		name := message.HandlerNameFromCtx(msg.Context())
		permanent := step.IsPermanent(err)
		if !permanent && delivered < p.cfg.MaxDeliver {
			metrics.HandlerMessages.WithLabelValues(name, metrics.HandlerRetried).Inc()
			Logger(msg.Context()).WarnContext(msg.Context(), "step failed, will be redelivered", slog.Any("error", err),
				slog.Duration("in", p.cfg.Delay(delivered)))
			return nil, err
		}
		reason := err.Error()
		if !permanent {
			reason = fmt.Sprintf("retries exhausted after %d deliveries: %s", delivered, reason)
		}
		id, fresh, dlErr := putDeadLetter(context.WithoutCancel(msg.Context()), p.env.Pool, name, msg, reason, delivered)
		if dlErr != nil {
			Logger(msg.Context()).ErrorContext(msg.Context(), "dead-letter the message; it will be delivered again", slog.Any("error", dlErr), slog.Any("cause", err),
				slog.Duration("in", p.cfg.Delay(delivered)))
			return nil, errors.Join(err, dlErr)
		}
		metrics.HandlerMessages.WithLabelValues(name, metrics.HandlerDeadLettered).Inc()
		if fresh { // not a redelivery after a lost ack: a message given up on once
			metrics.DeadLetters.WithLabelValues(name).Inc()
		}
		trace.SpanFromContext(msg.Context()).SetStatus(codes.Error, "dead-lettered")
		Logger(msg.Context()).ErrorContext(msg.Context(), "message dead-lettered; the order is left to the compensator",
			slog.Int64("dead_letter_id", id), slog.Bool("permanent", permanent), slog.Any("error", err))
		return nil, nil
	}
}

// handler runs one step for one message: decode, skip what is done, Handle
// with a Commit that does the dedupe row and the effect in one transaction.
func (p *Pipeline) handler(st step.Step) message.NoPublishHandlerFunc {
	c := newCommitter(p, st.Name, st.Batch)
	return func(msg *message.Message) error {
		t0 := time.Now()
		defer func() { metrics.HandlerDuration.WithLabelValues(st.Name).Observe(time.Since(t0).Seconds()) }()
		ctx := msg.Context()
		ev, err := orderevent.Decode(msg.Payload)
		if err != nil {
			return step.Permanent(fmt.Errorf("decode message %s: %w", msg.UUID, err))
		}
		wanted := false
		for _, e := range st.Events {
			wanted = wanted || e == ev.Name
		}
		if !wanted {
			// A payload that does not match its subject: not ours to handle.
			return step.Permanent(fmt.Errorf("%w: event %s on a subject of %v", orderevent.ErrMalformed, ev.Name, st.Events))
		}
		headers := map[string]string{}
		for k, v := range msg.Metadata {
			if k != "" && k[0] != '_' {
				headers[k] = v
			}
		}
		m := step.Message{
			ID:        ev.MsgID(),
			Subject:   msg.Metadata.Get(metaSubject),
			Event:     ev,
			Delivered: metaInt(msg, metaDelivered),
			Headers:   headers,
			Ctx:       ctx,
		}
		// A redelivery may find its work done (the commit went through and
		// the ack was lost): the pre-check skips it before Handle, which may
		// call the provider. A first delivery has no such past, so it skips
		// the read: the dedupe row in the commit's transaction decides in
		// any case (a copy published twice beyond the broker's duplicate
		// window finds it there, and a provider call before it is made with
		// the same Idempotency-Key, so it gets the same answer).
		var done bool
		if !p.cfg.noDedupe && m.Delivered > 1 {
			if err := p.env.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM processed_messages WHERE consumer = $1 AND message_id = $2)`,
				st.Name, m.ID).Scan(&done); err != nil {
				return fmt.Errorf("check dedupe row of %s: %w", m.ID, err)
			}
		}
		if done {
			metrics.HandlerMessages.WithLabelValues(st.Name, metrics.HandlerDuplicate).Inc()
			Logger(ctx).DebugContext(ctx, "duplicate delivery, already processed")
			return nil
		}
		if m.Delivered > p.cfg.MaxDeliver {
			return step.Permanent(fmt.Errorf("%w (%d): it ended without its dead letter stored (PostgreSQL unavailable, or its process stopped)", errPastLastDelivery, p.cfg.MaxDeliver))
		}
		committed := false
		commit := func(ctx context.Context, apply step.Apply) (bool, error) {
			if committed {
				return false, errCommitTwice
			}
			r := c.commit(ctx, m, apply)
			committed = r.committed
			return r.fresh, r.err
		}
		switch {
		case st.Prepare != nil:
			return st.Prepare(ctx, m, func(ctx context.Context, intent any) (bool, error) {
				if committed {
					return false, errCommitTwice
				}
				withIntent := m
				withIntent.Intent = intent
				r := c.commit(ctx, withIntent, nil)
				committed = r.committed
				return r.fresh, r.err
			})
		case st.Batch != nil:
			_, err := commit(ctx, nil)
			return err
		}
		return st.Handle(ctx, m, commit)
	}
}

// observeMoves records, for the status changes a step just committed (its
// outbox rows, as written and published), the time since the order was
// accepted, and counts the orders that reached a terminal state. The
// acceptance time is the one in the order's id (a UUIDv7 the intake takes
// just before the statement that sets created_at, to the millisecond), so
// this needs no read of its own; an id of another version is counted but
// not timed.
func observeMoves(rows []outbox.Row) {
	for _, x := range rows {
		status := orderevent.Name(x.Event).Status()
		if x.OrderID.Version() == 7 {
			sec, nsec := x.OrderID.Time().UnixTime()
			metrics.StageSeconds.WithLabelValues(string(status)).Observe(time.Since(time.Unix(sec, nsec)).Seconds())
		}
		if status.Terminal() {
			metrics.OrdersFinished.WithLabelValues(string(status)).Inc()
		}
	}
}

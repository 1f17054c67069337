package webhook

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"orderpipe/shared/callbackurl"
	"orderpipe/shared/metrics"
	"orderpipe/shared/tracing"
)

// Worker sends due deliveries. Any number of workers (in any number of
// processes) may run on one database: a claim takes rows with FOR UPDATE
// SKIP LOCKED and hides them for Lease by moving next_attempt_at, so no
// transaction stays open while a receiver answers, and a worker that dies
// mid-send leaves its rows to be claimed again when the lease ends.
//
// A slow or dead receiver holds at most PerClient of the Concurrency send
// slots, and a client whose slots are all busy is left out of the next
// claims, so the other clients' deliveries go on at full speed. The
// pipeline itself never waits for a receiver: the notifier only inserts
// rows.
type Worker struct {
	// Pool is the database.
	Pool *pgxpool.Pool
	// Logger receives one line per failed attempt and per given-up delivery.
	Logger *slog.Logger
	// Client sends the requests; default NewClient(ClientOptions{AllowPrivate}).
	Client *http.Client
	// AllowPrivate relaxes CheckURL (http, private literals) for dev/tests.
	// The dial-time check is Client's.
	AllowPrivate bool
	// Concurrency is the most sends in flight in this worker; default 32.
	Concurrency int
	// PerClient is the most sends in flight for one client; default 4.
	// It is at most Concurrency: a larger value (the default too) is
	// lowered to it. SettingsFromEnv refuses a larger one instead.
	PerClient int
	// Batch is the most rows one claim looks at; default 20.
	Batch int
	// Interval is how often the worker looks for due rows when idle;
	// default 500ms.
	Interval time.Duration
	// Schedule is the wait before each retry; default DefaultSchedule.
	// After len(Schedule)+1 failed attempts the delivery is failed.
	Schedule []time.Duration
	// Lease hides a claimed row from other claims while it is sent;
	// default 1 minute (well above the client's timeout).
	Lease    time.Duration
	mu       sync.Mutex
	inflight map[uuid.UUID]int
	total    int
	freed    chan struct{}
	wg       sync.WaitGroup
}

func (w *Worker) defaults() error {
	if w.Pool == nil {
		return errors.New("webhook worker: no pool")
	}
	if w.Logger == nil {
		w.Logger = slog.New(slog.DiscardHandler)
	}
	if w.Client == nil {
		w.Client = NewClient(ClientOptions{AllowPrivate: w.AllowPrivate})
	}
	if w.Concurrency <= 0 {
		w.Concurrency = 32
	}
	if w.PerClient <= 0 {
		w.PerClient = 4
	}
	if w.PerClient > w.Concurrency {
		w.PerClient = w.Concurrency
	}
	if w.Batch <= 0 {
		w.Batch = 20
	}
	if w.Interval <= 0 {
		w.Interval = 500 * time.Millisecond
	}
	if w.Schedule == nil {
		w.Schedule = DefaultSchedule
	}
	if w.Lease <= 0 {
		w.Lease = time.Minute
	}
	w.inflight = map[uuid.UUID]int{}
	w.freed = make(chan struct{}, 1)
	return nil
}

// Run sends due deliveries until ctx ends, then waits for the sends in
// flight (each bounded by the client's timeout) and records them.
func (w *Worker) Run(ctx context.Context) error {
	if err := w.defaults(); err != nil {
		return err
	}
	defer w.wg.Wait()
	t := time.NewTicker(w.Interval)
	defer t.Stop()
	for {
		n, err := w.claimAndSend(ctx)
		if err != nil && ctx.Err() == nil {
			w.Logger.Warn("claim webhook deliveries", slog.Any("error", err))
		}
		if n > 0 && ctx.Err() == nil {
			continue // there may be more due rows and free slots
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-w.freed:
		}
	}
}

type claimed struct {
	Delivery
	lease     uuid.UUID // the claim's fence token
	secret    string
	requestID string
	trace     map[string]string
}

// claimAndSend claims as many due rows as there are free slots and starts
// sending them; it returns how many it started.
func (w *Worker) claimAndSend(ctx context.Context) (int, error) {
	w.mu.Lock()
	free := w.Concurrency - w.total
	saturated := []uuid.UUID{}
	for c, n := range w.inflight {
		if n >= w.PerClient {
			saturated = append(saturated, c)
		}
	}
	w.mu.Unlock()
	if free <= 0 {
		return 0, nil
	}
	rows, err := w.claim(ctx, free, saturated)
	if err != nil {
		return 0, err
	}
	sctx := context.WithoutCancel(ctx) // a started send finishes and is recorded
	for _, d := range rows {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			defer w.release(d.ClientID)
			w.send(sctx, d)
		}()
	}
	return len(rows), nil
}

func (w *Worker) release(client uuid.UUID) {
	w.mu.Lock()
	w.total--
	if w.inflight[client]--; w.inflight[client] <= 0 {
		delete(w.inflight, client)
	}
	w.mu.Unlock()
	select {
	case w.freed <- struct{}{}:
	default:
	}
}

// claim locks up to Batch due rows of clients that are not saturated, picks
// those that fit the free slots (PerClient each), moves their
// next_attempt_at by Lease and returns them with their client's secret.
func (w *Worker) claim(ctx context.Context, free int, saturated []uuid.UUID) ([]claimed, error) {
	var out []claimed
	err := pgx.BeginFunc(ctx, w.Pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `
			SELECT webhook_id, client_id FROM webhook_deliveries
			WHERE status = 'pending' AND next_attempt_at <= now() AND NOT (client_id = ANY($1))
			ORDER BY next_attempt_at
			LIMIT $2
			FOR UPDATE SKIP LOCKED`, saturated, w.Batch)
		if err != nil {
			return err
		}
		type cand struct {
			id     string
			client uuid.UUID
		}
		cands, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (cand, error) {
			var c cand
			return c, r.Scan(&c.id, &c.client)
		})
		if err != nil {
			return err
		}
		w.mu.Lock()
		var picked []string
		taken := map[uuid.UUID]int{}
		for _, c := range cands {
			if len(picked) == free {
				break
			}
			if w.inflight[c.client]+taken[c.client] >= w.PerClient {
				continue
			}
			taken[c.client]++
			picked = append(picked, c.id)
		}
		w.mu.Unlock()
		if len(picked) == 0 {
			return nil
		}
		rows, err = tx.Query(ctx, `
			UPDATE webhook_deliveries d SET next_attempt_at = now() + $2 * interval '1 millisecond',
				lease_token = gen_random_uuid()
			FROM api_clients c
			WHERE d.webhook_id = ANY($1) AND c.client_id = d.client_id
			RETURNING d.webhook_id, d.order_id, d.seq, d.client_id, d.url, d.payload, d.status, d.attempts,
				d.next_attempt_at, d.last_status_code, d.last_error, d.last_latency_ms, d.created_at, d.delivered_at,
				c.webhook_secret, d.request_id, d.trace_context, d.lease_token`, picked, w.Lease.Milliseconds())
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (claimed, error) {
			var c claimed
			var payload []byte
			var status string
			err := r.Scan(&c.WebhookID, &c.OrderID, &c.Seq, &c.ClientID, &c.URL, &payload, &status, &c.Attempts,
				&c.NextAttemptAt, &c.LastStatusCode, &c.LastError, &c.LastLatencyMS, &c.CreatedAt, &c.DeliveredAt, &c.secret,
				&c.requestID, &c.trace, &c.lease)
			c.Payload, c.Status = payload, Status(status)
			return c, err
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("claim due webhooks: %w", err)
	}
	w.mu.Lock()
	for _, c := range out {
		w.inflight[c.ClientID]++
		w.total++
	}
	w.mu.Unlock()
	return out, nil
}

// Result is the outcome of one send.
type Result struct {
	// StatusCode is the receiver's answer (0 when there was none).
	StatusCode int
	// Latency is the time to the response or the error.
	Latency time.Duration
	// Err is why the attempt failed (nil for a 2xx answer).
	Err error
	// Permanent marks a failure that no retry can fix (a URL that is not
	// allowed, a bad secret); the delivery is failed at once.
	Permanent bool
}

// Send signs and posts one delivery's payload now, and reads at most
// MaxResponseBody of the answer. It does not touch the database.
func Send(ctx context.Context, client *http.Client, allowPrivate bool, d Delivery, secret string) Result {
	u, err := checkSendURL(d.URL, allowPrivate)
	if err != nil {
		return Result{Err: err, Permanent: true}
	}
	signer, err := NewSigner(secret)
	if err != nil {
		return Result{Err: err, Permanent: true}
	}
	now := time.Now()
	sig, err := signer.Sign(d.WebhookID, now, d.Payload)
	if err != nil {
		return Result{Err: err, Permanent: true}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), bytes.NewReader(d.Payload))
	if err != nil {
		return Result{Err: fmt.Errorf("build request: %w", redactURLError(err, d.URL)), Permanent: true}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "orderpipe-webhooks/1")
	req.Header.Set(HeaderID, d.WebhookID)
	req.Header.Set(HeaderTimestamp, strconv.FormatInt(now.Unix(), 10))
	req.Header.Set(HeaderSignature, sig)
	// The receiver can join the order's trace: W3C traceparent of this
	// delivery's span, a child of the status change's trace.
	tp := map[string]string{}
	tracing.Inject(ctx, tp)
	for k, v := range tp {
		req.Header.Set(k, v)
	}
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return Result{Latency: time.Since(start), Err: redactURLError(err, d.URL)}
	}
	_, rerr := io.Copy(io.Discard, io.LimitReader(resp.Body, MaxResponseBody))
	_ = resp.Body.Close()
	r := Result{StatusCode: resp.StatusCode, Latency: time.Since(start)}
	switch {
	case resp.StatusCode >= 300 && resp.StatusCode < 400:
		r.Err = fmt.Errorf("receiver answered %d (redirects are not followed)", resp.StatusCode)
	case resp.StatusCode < 200 || resp.StatusCode >= 300:
		r.Err = fmt.Errorf("receiver answered %d", resp.StatusCode)
	case rerr != nil:
		r.Err = fmt.Errorf("read response: %w", rerr)
	}
	return r
}

// redactURLError keeps the callback URL's query and user info (tokens)
// out of an error from net/http, whose *url.Error names the URL: the
// error is rebuilt with the URL redacted, what it wraps kept for
// errors.Is and errors.As.
func redactURLError(err error, raw string) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return &url.Error{Op: ue.Op, URL: callbackurl.Redact(ue.URL), Err: scrubbed{ue.Err, raw}}
	}
	return scrubbed{err, raw}
}

// scrubbed is an error whose message has the callback URL scrubbed.
type scrubbed struct {
	err error
	raw string
}

func (s scrubbed) Error() string { return callbackurl.Scrub(s.err.Error(), s.raw) }
func (s scrubbed) Unwrap() error { return s.err }

func (w *Worker) send(ctx context.Context, c claimed) {
	attempt := c.Attempts + 1
	ctx, span := tracing.Tracer().Start(tracing.Extract(ctx, c.trace), "webhook.deliver", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("webhook.id", c.WebhookID), attribute.Int("webhook.attempt", attempt)))
	defer span.End()
	r := Send(ctx, w.Client, w.AllowPrivate, c.Delivery, c.secret)
	if r.Err != nil {
		span.SetStatus(codes.Error, r.Err.Error())
	}
	log := w.Logger.With(slog.String("webhook_id", c.WebhookID), slog.String("order_id", c.OrderID.String()),
		slog.String("request_id", c.requestID), slog.String("client_id", c.ClientID.String()), slog.Int("attempt", attempt))
	var wait time.Duration
	status := StatusDelivered
	switch {
	case r.Err == nil:
	case r.Permanent || attempt > len(w.Schedule):
		status = StatusFailed
	default:
		status = StatusPending
		wait = jitter(w.Schedule[attempt-1])
	}
	// An attempt the address guard refused is "refused" while it is
	// retried; the one that gives the delivery up is "failed", whatever
	// the cause, so that the failed deliveries are all counted there.
	outcome := map[Status]string{StatusDelivered: "delivered", StatusPending: "retry", StatusFailed: "failed"}[status]
	if status == StatusPending && (errors.Is(r.Err, ErrForbiddenAddress) || errors.Is(r.Err, ErrForbiddenURL)) {
		outcome = "refused"
	}
	metrics.WebhookDeliveries.WithLabelValues(outcome).Inc()
	if r.Err != nil {
		log.WarnContext(ctx, "webhook attempt failed", slog.Int("status_code", r.StatusCode), slog.Any("error", r.Err),
			slog.String("next", string(status)), slog.Duration("retry_in", wait))
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	switch err := w.record(rctx, c, attempt, r, status, wait); {
	case errors.Is(err, errLeaseLost):
		// Claimed again after the lease ended, or resent: the newer
		// claim's outcome stands.
		log.WarnContext(ctx, "webhook outcome not recorded: the delivery was claimed again or resent meanwhile",
			slog.Int("status_code", r.StatusCode))
	case err != nil:
		// The lease ends and the row is claimed again: one extra send, same id.
		log.ErrorContext(ctx, "record webhook attempt", slog.Any("error", err))
	}
}

// jitter spreads a wait by ±10% so that a receiver's outage does not bring
// every retry back at the same instant.
func jitter(d time.Duration) time.Duration {
	return d - d/10 + time.Duration(rand.Int64N(int64(d/5)+1))
}

// errLeaseLost is record's answer when the row no longer carries the
// claim's lease token.
var errLeaseLost = errors.New("webhook lease lost")

// record writes one attempt's outcome, fenced by the claim's lease token:
// when the row was claimed again or resent since, nothing is written and
// the error is errLeaseLost.
func (w *Worker) record(ctx context.Context, c claimed, attempt int, r Result, status Status, wait time.Duration) error {
	id := c.WebhookID
	var code *int
	if r.StatusCode != 0 {
		code = &r.StatusCode
	}
	var msg *string
	if r.Err != nil {
		s := callbackurl.Scrub(r.Err.Error(), c.URL) // Send redacts already; a last guard for the column
		if len(s) > 1000 {
			s = s[:1000]
		}
		msg = &s
	}
	latency := int(r.Latency.Milliseconds())
	return pgx.BeginFunc(ctx, w.Pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `
			UPDATE webhook_deliveries SET
				status = $2, attempts = $3,
				next_attempt_at = now() + $4 * interval '1 millisecond',
				last_status_code = $5, last_error = $6, last_latency_ms = $7,
				delivered_at = CASE WHEN $2 = 'delivered' THEN now() END,
				lease_token = NULL
			WHERE webhook_id = $1 AND lease_token = $8`, id, string(status), attempt, wait.Milliseconds(), code, msg, latency, c.lease)
		if err != nil {
			return fmt.Errorf("update webhook %s after attempt %d: %w", id, attempt, err)
		}
		if tag.RowsAffected() == 0 {
			return fmt.Errorf("record attempt %d of webhook %s: %w", attempt, id, errLeaseLost)
		}
		if _, err := tx.Exec(ctx, `
			INSERT INTO webhook_attempts (webhook_id, attempt, status_code, latency_ms, error)
			VALUES ($1, $2, $3, $4, $5)`, id, attempt, code, latency, msg); err != nil {
			return fmt.Errorf("record attempt %d of webhook %s: %w", attempt, id, err)
		}
		return nil
	})
}

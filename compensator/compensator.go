// Package compensator finds orders stuck in a non-terminal state and drives
// them on or unwinds them (DESIGN.md guarantee 5).
//
// An order is stuck when it has stayed in processing, reserved or paid for
// longer than that state's deadline, counted from when it entered the state
// or from its last re-drive. A stuck order is re-driven: the event of its
// current state is published again with a message id of its own
// (orderevent.MsgID with the re-drive number), so that the broker's
// duplicate window does not swallow it; the consumers' conditional updates
// and dedupe rows make it harmless if the step already ran. After
// MaxAttempts re-drives in one state the order is unwound in one
// transaction: its stock released, a refund of its charge recorded as due,
// the order moved to cancelled (the usual status event tells the client).
// The refund itself is asked of the payment provider after that commit,
// with an Idempotency-Key derived from the order, and recorded when the
// provider answers; a crash in between repeats the call with the same key,
// which the provider answers with the first refund.
//
// Any number of compensators may run at once, on any number of machines,
// with no leader: each pass claims stuck orders with SELECT ... FOR UPDATE
// SKIP LOCKED in keyset batches, and writes back with a compare-and-set on
// the status and the re-drive count it read (WHERE status = $seen AND
// redrive_attempts = $seenAttempt). A consumer that moves the order between
// the compensator's read and its write wins, and the compensator does
// nothing to that order (the race of riverqueue/river#1302). A pass never
// moves an order backwards, and never forward except to cancelled through
// the same conditional orderstore.Transition the consumers use.
//
// A pass is a list of named phases (phases). For each stuck order one
// function, plan, decides what to do; the pass applies the decision and a
// dry run reports it, so the two cannot drift apart. A re-drive counts as an
// attempt only once the broker acknowledged it, and a pass that cannot reach
// the broker re-drives and unwinds nothing: a broker outage costs time,
// never orders. Open orders whose last event the broker lost are healed at
// once. Each pass also publishes outbox rows left pending (a process died
// between its commit and its publish) and deletes processed_messages rows
// older than the dedupe retention. A dry run does all of its reading in a
// READ ONLY transaction and writes nothing anywhere.
package compensator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"orderpipe/shared/failpoint"
	"orderpipe/shared/idemtoken"
	"orderpipe/shared/metrics"
	"orderpipe/shared/order"
	"orderpipe/shared/orderevent"
	"orderpipe/shared/orderstore"
	"orderpipe/shared/outbox"
	"orderpipe/shared/postgres"
	"orderpipe/shared/psp"
	"orderpipe/shared/stock"
	"orderpipe/shared/tracing"
)

// Failpoint names in this package.
const (
	// FailMidPass fires after each order's action, inside the batch
	// transaction (before its commit).
	FailMidPass = "compensator.mid-pass"
	// FailAfterBatch fires after a batch committed and before its events
	// were published.
	FailAfterBatch = "compensator.after-batch"
)

// Kind is the kind of an action (compensator_actions.action, and the label
// of metrics.CompensatorActions).
type Kind string

// The kinds of action.
const (
	KindRedrive Kind = "redrive"
	KindUnwind  Kind = "unwind"
	KindRefund  Kind = "refund"
	KindSkip    Kind = "skip"
)

// Action is one thing the compensator did (or, in a dry run, would do) to
// an order.
type Action struct {
	OrderID uuid.UUID
	// ClientID and RequestID name the order in the log.
	ClientID  uuid.UUID
	RequestID string
	// Kind says what was done.
	Kind Kind
	// From is the order's status when the compensator acted.
	From order.Status
	// Attempt is the re-drive number (for an unwind, the re-drives spent).
	Attempt int
	// Reason says why.
	Reason string
	// DryRun marks an action that was not taken.
	DryRun bool
}

// String is the one line that `compensator --once` prints per action.
func (a Action) String() string {
	kind := string(a.Kind)
	if a.DryRun {
		kind = "would-" + kind
	}
	return fmt.Sprintf("%-13s %s %-10s attempt=%d %s", kind, a.OrderID, a.From, a.Attempt, a.Reason)
}

// Result is what one pass found and did.
type Result struct {
	// Stuck counts the orders past their deadline per open status when
	// the pass began.
	Stuck map[order.Status]int
	// OldestOpen is the age of the oldest non-terminal order (0: none).
	OldestOpen time.Duration
	// Redriven, Unwound, Refunded, Skipped and Healed count the actions
	// (would-be actions in a dry run).
	Redriven, Unwound, Refunded, Skipped, Healed int
	// Republished counts outbox rows published again (in a dry run: rows
	// that are due).
	Republished int
	// Swept counts processed_messages rows deleted (in a dry run: due).
	Swept int64
	// TokensSwept counts expired unused idempotency tokens deleted.
	TokensSwept int64
	// TokensSettled counts idempotency tokens whose holder died, settled
	// (used with their order, or unused again).
	TokensSettled int64
	// OutboxPruned counts published outbox rows of finished orders
	// deleted after the outbox retention.
	OutboxPruned int64
	// Actions lists every action, in the order taken.
	Actions []Action
	// DryRun marks a pass that wrote nothing.
	DryRun bool
	// BrokerUnavailable marks a pass that could not reach the broker: it
	// re-drove and unwound nothing.
	BrokerUnavailable bool
	// Forced marks a pass of a compensator started with Force.
	Forced bool
	// Took is how long the pass ran.
	Took time.Duration
}

// Summary is the one-line summary that `compensator --once` prints.
func (r Result) Summary() string {
	var stuck []string
	for _, s := range openStatuses {
		stuck = append(stuck, fmt.Sprintf("%s=%d", s, r.Stuck[s]))
	}
	prefix := "pass"
	if r.DryRun {
		prefix = "dry run (nothing changed)"
	}
	if r.Forced {
		prefix = "forced " + prefix
	}
	if r.BrokerUnavailable {
		prefix += " (broker unavailable: nothing re-driven or unwound)"
	}
	return fmt.Sprintf("%s: stuck %s; redriven %d, unwound %d, refunded %d, skipped %d, healed %d; outbox republished %d; dedupe rows swept %d; outbox rows pruned %d; tokens settled %d, expired tokens swept %d; oldest open order %s; took %s",
		prefix, strings.Join(stuck, " "), r.Redriven, r.Unwound, r.Refunded, r.Skipped, r.Healed, r.Republished, r.Swept, r.OutboxPruned, r.TokensSettled, r.TokensSwept,
		r.OldestOpen.Round(time.Second), r.Took.Round(time.Millisecond))
}

func (r *Result) add(a Action) {
	r.Actions = append(r.Actions, a)
	switch a.Kind {
	case KindRedrive:
		r.Redriven++
	case KindUnwind:
		r.Unwound++
	case KindRefund:
		r.Refunded++
	case KindSkip:
		r.Skipped++
	case KindHeal:
		r.Healed++
	}
}

// Compensator runs passes over stuck orders.
type Compensator struct {
	cfg      Config
	pool     *pgxpool.Pool
	relay    *outbox.Relay
	provider *psp.Client
	logger   *slog.Logger
	// OnAction, if set, is called with each action as it is taken (after
	// its commit), e.g. to print it.
	OnAction func(Action)

	// healFrom is the order id after which the next pass's heal goes on
	// (uuid.Nil: from the start), when the last one stopped at its bound.
	healMu   sync.Mutex
	healFrom uuid.UUID
	// lookupHook, set by tests only (export_test.go), is called before
	// heal asks the broker about an order's event.
	lookupHook func(orderID uuid.UUID)
}

// New validates cfg and returns a compensator. relay publishes re-drive and
// cancellation events; provider may be nil, in which case refunds stay due
// (and are reported) until a compensator with a provider runs.
func New(cfg Config, pool *pgxpool.Pool, relay *outbox.Relay, provider *psp.Client, logger *slog.Logger) (*Compensator, error) {
	cfg, err := cfg.Validate()
	if err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.Default()
	}
	return &Compensator{cfg: cfg, pool: pool, relay: relay, provider: provider, logger: logger}, nil
}

// Config returns the validated configuration.
func (c *Compensator) Config() Config { return c.cfg }

// Run makes a pass at once and then every Interval until ctx ends. A
// failed pass is logged, counted by phase
// (orderpipe_compensator_pass_failures_total), and the next one tries
// again.
func (c *Compensator) Run(ctx context.Context) error {
	t := time.NewTicker(c.cfg.Interval)
	defer t.Stop()
	for {
		res, err := c.RunOnce(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			c.logger.Warn("compensator pass", slog.Any("error", err), slog.String("summary", res.Summary()))
		} else if len(res.Actions) > 0 || res.Republished > 0 || res.Swept > 0 || res.TokensSwept > 0 || res.TokensSettled > 0 || res.OutboxPruned > 0 {
			c.logger.Info("compensator pass", slog.String("summary", res.Summary()))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// RunOnce makes one pass: its phases (phases) in order. A phase that fails
// does not stop the others; the errors are returned together, and each
// failed phase is counted (orderpipe_compensator_pass_failures_total). A
// pass that cannot reach the broker, at its start or in any phase, skips
// the phases after that need it. A pass that ran every phase, and whose
// failures are only those that a metric of their own reports (the broker
// unavailable, reportedError), sets
// orderpipe_compensator_last_success_timestamp_seconds when it ends.
func (c *Compensator) RunOnce(ctx context.Context) (Result, error) {
	t0 := time.Now()
	if c.cfg.DryRun {
		res, err := c.dryRun(ctx)
		res.Took = time.Since(t0)
		return res, err
	}
	res := Result{Forced: c.cfg.Force}
	var errs []error
	completed, brokerDown := true, false
	for _, ph := range c.phases() {
		if ctx.Err() != nil {
			completed = false
			break
		}
		if ph.needsBroker && res.BrokerUnavailable {
			continue
		}
		err := ph.run(ctx, &res)
		if err == nil {
			continue
		}
		errs = append(errs, err)
		if ctx.Err() == nil {
			metrics.CompensatorPassFailures.WithLabelValues(ph.name).Inc()
		}
		if !onlyReported(err) {
			completed = false
		}
		if errors.Is(err, ErrBrokerUnavailable) {
			res.BrokerUnavailable = true
			brokerDown = brokerDown || ph.name == phaseBroker
		}
		if errors.Is(err, failpoint.ErrInjected) {
			break // a simulated crash ends the pass there
		}
	}
	switch {
	case brokerDown:
		metrics.CompensatorBrokerUp.Set(0)
		c.logger.Warn("compensator pass: the broker is unavailable; nothing was re-driven or unwound, and re-drive attempts are not counted until it is back")
	case res.BrokerUnavailable:
		metrics.CompensatorBrokerUp.Set(0)
		c.logger.Warn("compensator pass: the broker went away during the pass; re-drives it did not acknowledge were taken back and not counted, and the phases after that need the broker were skipped")
	case c.relay != nil:
		metrics.CompensatorBrokerUp.Set(1)
	}
	res.Took = time.Since(t0)
	if completed && ctx.Err() == nil {
		metrics.CompensatorLastSuccess.Set(float64(time.Now().UnixMilli()) / 1e3)
	}
	return res, errors.Join(errs...)
}

// reportedError is a failure that a metric and an alert of its own
// report: a refund the payment provider did not make
// (orderpipe_refunds_due); the broker found unavailable is reported too
// (orderpipe_compensator_broker_up), and recognized by its sentinel (see
// onlyReported). It is still an error of the pass, but it does not keep
// the pass from counting as completed
// (orderpipe_compensator_last_success_timestamp_seconds), so that "no
// compensator completes its passes" means the compensators are down or
// failing, not that the broker or the provider is.
type reportedError struct{ err error }

func (e reportedError) Error() string { return e.err.Error() }
func (e reportedError) Unwrap() error { return e.err }

// reported marks reportedError for onlyReported.
func (reportedError) reported() {}

// onlyReported reports whether every failure in err (through errors.Join,
// several %w and wrapping) is a reportedError, or an error that wraps
// ErrBrokerUnavailable itself ("%w: …"): wherever in a pass the broker is
// found gone, RunOnce reports it (orderpipe_compensator_broker_up 0). It
// walks the tree itself: errors.As would find one reported failure among
// others.
func onlyReported(err error) bool {
	if err == nil {
		return true
	}
	if _, ok := err.(interface{ reported() }); ok {
		return true
	}
	if wrapsItself(err, ErrBrokerUnavailable) {
		return true
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, x := range j.Unwrap() {
			if !onlyReported(x) {
				return false
			}
		}
		return true
	}
	if inner := errors.Unwrap(err); inner != nil {
		return onlyReported(inner)
	}
	return false
}

// wrapsItself reports whether err is target or wraps it at its own level
// (fmt.Errorf("%w: …", target, …)), not deeper: errors.Is would look
// further, into a join whose other failures are not the broker's.
//
//nolint:errorlint // identity comparisons on purpose, at this level only
func wrapsItself(err, target error) bool {
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		return u.Unwrap() == target
	case interface{ Unwrap() []error }:
		return slices.Contains(u.Unwrap(), target)
	}
	return err == target
}

// ErrBrokerUnavailable marks a pass that could not reach the broker (or
// whose re-drives it did not acknowledge). It is the outbox's own, which
// the relay's publishes return, so that a pass sees the broker gone
// whichever of them found it so.
var ErrBrokerUnavailable = outbox.ErrBrokerUnavailable

// brokerReachable asks JetStream for the stream's state.
func (c *Compensator) brokerReachable(ctx context.Context) error {
	if c.relay == nil || c.relay.JS == nil {
		return nil
	}
	if nc := c.relay.JS.Conn(); nc != nil && !nc.IsConnected() {
		return fmt.Errorf("%w: not connected to NATS (%s)", ErrBrokerUnavailable, nc.Status())
	}
	_, err := c.viewStream(ctx)
	return err
}

// sinceExpr is when an open order's deadline started: its last status
// change, its last re-drive, or the broker's return after an outage a pass
// saw (broker_outage.back_at), whichever is latest. greatest ignores the
// NULL of a broker never found away.
const sinceExpr = `greatest(o.updated_at, coalesce(o.redriven_at, o.updated_at), (SELECT back_at FROM broker_outage))`

// stuckExpr is true for an open order past its deadline; $1, $2, $3 are the
// deadlines of processing, reserved and paid in seconds.
const stuckExpr = sinceExpr + ` <= now() - make_interval(secs => CASE o.status WHEN 'processing' THEN $1::float8 WHEN 'reserved' THEN $2::float8 ELSE $3::float8 END)`

// noteBroker records what a pass's check of the broker found: when it was
// unavailable, or its return after an outage (back_at, from which the
// stuck deadlines count again). A re-drive the broker did not acknowledge
// is not an outage: it is taken back, and the pass says so.
func (c *Compensator) noteBroker(ctx context.Context, available bool) error {
	sql := `INSERT INTO broker_outage (unavailable_at) VALUES (now())
		ON CONFLICT (one) DO UPDATE SET unavailable_at = now()`
	if available {
		sql = `UPDATE broker_outage SET back_at = now() WHERE back_at IS NULL OR back_at < unavailable_at`
	}
	if _, err := c.pool.Exec(ctx, sql); err != nil {
		return fmt.Errorf("record the broker's availability: %w", err)
	}
	return nil
}

func (c *Compensator) deadlineArgs() []any {
	return []any{c.cfg.StuckProcessing.Seconds(), c.cfg.StuckReserved.Seconds(), c.cfg.StuckPaid.Seconds()}
}

// measure counts stuck orders per state and the age of the oldest open one,
// and sets the gauges.
func (c *Compensator) measure(ctx context.Context, q postgres.DB, res *Result) error {
	res.Stuck = map[order.Status]int{}
	rows, err := q.Query(ctx, `
		SELECT o.status, count(*) FILTER (WHERE `+stuckExpr+`),
		       coalesce(extract(epoch FROM now() - min(o.created_at)), 0)::float8
		FROM orders o WHERE o.status IN ('processing', 'reserved', 'paid')
		GROUP BY o.status`, c.deadlineArgs()...)
	if err != nil {
		return fmt.Errorf("count stuck orders: %w", err)
	}
	defer rows.Close()
	var oldest float64
	for rows.Next() {
		var s string
		var n int
		var age float64
		if err := rows.Scan(&s, &n, &age); err != nil {
			return fmt.Errorf("count stuck orders: %w", err)
		}
		res.Stuck[order.Status(s)] = n
		oldest = max(oldest, age)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("count stuck orders: %w", err)
	}
	res.OldestOpen = time.Duration(oldest * float64(time.Second))
	if res.DryRun {
		return nil
	}
	for _, s := range openStatuses {
		metrics.StuckOrders.WithLabelValues(string(s)).Set(float64(res.Stuck[s]))
	}
	metrics.OldestOpenOrderAge.Set(oldest)
	// The oldest event nobody published: the first pending row in id
	// order (outbox_pending_idx), one row read.
	var pending float64
	if err := q.QueryRow(ctx, `
		SELECT coalesce((SELECT extract(epoch FROM now() - created_at)::float8
		                 FROM outbox WHERE published_at IS NULL ORDER BY id LIMIT 1), 0)`).Scan(&pending); err != nil {
		return fmt.Errorf("read the oldest pending outbox event: %w", err)
	}
	metrics.OutboxOldestPendingAge.Set(max(pending, 0))
	return nil
}

// stuckOrder is a claimed order as the compensator read it.
type stuckOrder struct {
	ID        uuid.UUID
	Status    order.Status
	ClientID  uuid.UUID
	RequestID string
	// Attempts and RedriveStatus are the columns as read (for the
	// compare-and-set); Attempt is the count for the current status.
	Attempts      int
	RedriveStatus *string
	Since         time.Time
	EnteredAt     time.Time
	Age           time.Duration
}

// attempt returns the re-drives already spent in the current status.
func (o stuckOrder) attempt() int {
	if o.RedriveStatus != nil && *o.RedriveStatus == string(o.Status) {
		return o.Attempts
	}
	return 0
}

// selectStuck reads up to limit stuck orders after cursor; lock adds FOR
// UPDATE SKIP LOCKED.
func (c *Compensator) selectStuck(ctx context.Context, q postgres.DB, cursor uuid.UUID, limit int, lock bool) ([]stuckOrder, error) {
	sql := `
		SELECT o.order_id, o.status, o.client_id, o.request_id, o.redrive_attempts, o.redrive_status,
		       greatest(o.updated_at, coalesce(o.redriven_at, o.updated_at)), o.updated_at,
		       extract(epoch FROM now() - ` + sinceExpr + `)::float8
		FROM orders o
		WHERE o.status IN ('processing', 'reserved', 'paid') AND o.order_id > $4 AND ` + stuckExpr + `
		ORDER BY o.order_id
		LIMIT $5`
	if lock {
		sql += ` FOR UPDATE SKIP LOCKED`
	}
	rows, err := q.Query(ctx, sql, append(c.deadlineArgs(), cursor, limit)...)
	if err != nil {
		return nil, fmt.Errorf("select stuck orders: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (stuckOrder, error) {
		var o stuckOrder
		var s string
		var age float64
		err := r.Scan(&o.ID, &s, &o.ClientID, &o.RequestID, &o.Attempts, &o.RedriveStatus, &o.Since, &o.EnteredAt, &age)
		o.Status = order.Status(s)
		o.Age = time.Duration(age * float64(time.Second))
		return o, err
	})
	if err != nil {
		return nil, fmt.Errorf("select stuck orders: %w", err)
	}
	return out, nil
}

// scan walks the stuck orders in keyset batches, one transaction each.
func (c *Compensator) scan(ctx context.Context, res *Result) error {
	cursor := uuid.Nil
	var errs []error
	for {
		n, last, err := c.batch(ctx, cursor, res)
		if err != nil {
			errs = append(errs, err)
			// A batch that did not commit stops the pass rather than loop
			// on it; so does an injected crash.
			if n == 0 || ctx.Err() != nil || errors.Is(err, failpoint.ErrInjected) || errors.Is(err, ErrBrokerUnavailable) {
				break
			}
		}
		if n < c.cfg.BatchSize {
			break
		}
		cursor = last
	}
	return errors.Join(errs...)
}

// batch claims one batch after cursor and acts on each order in it. It
// returns how many orders it claimed and the last one's id.
//
// A re-drive is written (attempt counted, event in the outbox) in the
// batch's transaction and published after its commit; one that the broker
// did not acknowledge is then taken back (undoRedrive), so that an attempt
// counts only when the broker has the event.
func (c *Compensator) batch(ctx context.Context, cursor uuid.UUID, res *Result) (int, uuid.UUID, error) {
	var (
		claimed   []stuckOrder
		actions   []Action
		redrives  []redriven
		outboxIDs []int64
		orderErrs []error
	)
	err := pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		var err error
		claimed, err = c.selectStuck(ctx, tx, cursor, c.cfg.BatchSize, true)
		if err != nil {
			return err
		}
		var restock []stock.Line
		for _, o := range claimed {
			// A savepoint per order: one order's failure does not undo
			// the others'.
			var a Action
			var oid int64
			var lines []stock.Line
			err := pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error {
				var err error
				if a, err = c.plan(ctx, sp, o, false); err != nil {
					return err
				}
				switch a.Kind {
				case KindRedrive:
					a, oid, err = c.redrive(ctx, sp, o, a)
				case KindUnwind:
					a, oid, lines, err = c.unwind(ctx, sp, o, a)
				}
				if err == nil && a.Kind == KindSkip {
					return errSkip
				}
				return err
			})
			switch {
			case errors.Is(err, errSkip):
				actions = append(actions, a)
			case err != nil:
				if ctx.Err() != nil {
					return err
				}
				orderErrs = append(orderErrs, err)
				continue
			case a.Kind == KindRedrive:
				redrives = append(redrives, redriven{a: a, o: o, outboxID: oid})
				outboxIDs = append(outboxIDs, oid)
			default:
				actions = append(actions, a)
				restock = append(restock, lines...)
				if oid != 0 {
					outboxIDs = append(outboxIDs, oid)
				}
			}
			if err := failpoint.Inject(FailMidPass); err != nil {
				return err
			}
		}
		// The unwound orders' stock, each SKU once, in SKU order, at the
		// end: the rows are locked for the commit only.
		return stock.Restock(ctx, tx, restock)
	})
	if err != nil {
		return 0, uuid.Nil, fmt.Errorf("compensator batch after %s: %w", cursor, err)
	}
	for _, a := range actions {
		c.taken(a, res)
	}
	var errs []error
	errs = append(errs, orderErrs...)
	last := uuid.Nil
	if len(claimed) > 0 {
		last = claimed[len(claimed)-1].ID
	}
	if err := failpoint.Inject(FailAfterBatch); err != nil {
		// A simulated crash: the re-drives stay counted with their events
		// pending in the outbox. The relay or the next pass publishes
		// them, and no order is re-driven or unwound while an event of
		// its own is pending.
		for _, r := range redrives {
			res.add(r.a)
		}
		return len(claimed), last, errors.Join(append(errs, err)...)
	}
	pubErr := c.relay.Publish(ctx, outboxIDs...)
	if pubErr != nil {
		// Unwinds' events stay in the outbox; the relay or the next pass
		// publishes them.
		c.logger.Warn("publish compensator events; they stay in the outbox", slog.Any("error", pubErr))
	}
	if len(redrives) > 0 {
		lost, err := c.unacknowledged(ctx, redrives)
		if err != nil {
			errs = append(errs, err)
		}
		for _, r := range redrives {
			if !lost[r.outboxID] {
				c.taken(r.a, res)
				continue
			}
			if err := c.undoRedrive(ctx, r); err != nil {
				errs = append(errs, err)
			}
		}
		if len(lost) > 0 {
			err := fmt.Errorf("%w: %d re-drive(s) not acknowledged, not counted", ErrBrokerUnavailable, len(lost))
			if pubErr != nil {
				err = fmt.Errorf("%w: %w", err, pubErr)
			}
			errs = append(errs, err)
		}
	}
	return len(claimed), last, errors.Join(errs...)
}

// redriven is a re-drive written in a batch's transaction, not yet known
// to be acknowledged by the broker.
type redriven struct {
	a        Action
	o        stuckOrder
	outboxID int64
}

// taken accounts for an action that happened.
func (c *Compensator) taken(a Action, res *Result) {
	res.add(a)
	metrics.CompensatorActions.WithLabelValues(string(a.Kind)).Inc()
	if a.Kind == KindUnwind {
		metrics.OrdersFinished.WithLabelValues(string(order.StatusCancelled)).Inc()
	}
	c.logAction(a)
}

// unleasedPending is the condition on an outbox row whose event nobody
// published and nobody is publishing: a row under another publisher's
// lease (a relay, or another compensator's republish, took it right after
// the commit) is on its way to the broker, and its re-drive stands.
const unleasedPending = `published_at IS NULL AND (claimed_until IS NULL OR claimed_until < now())`

// unacknowledged returns the outbox ids of re-drives still unpublished and
// not being published by another publisher.
func (c *Compensator) unacknowledged(ctx context.Context, rs []redriven) (map[int64]bool, error) {
	ids := make([]int64, len(rs))
	for i, r := range rs {
		ids[i] = r.outboxID
	}
	rows, err := c.pool.Query(ctx, `SELECT id FROM outbox WHERE id = ANY($1) AND `+unleasedPending, ids)
	if err != nil {
		return nil, fmt.Errorf("read the re-drives' outbox rows: %w", err)
	}
	lost, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("read the re-drives' outbox rows: %w", err)
	}
	out := make(map[int64]bool, len(lost))
	for _, id := range lost {
		out[id] = true
	}
	return out, nil
}

// undoRedrive takes back a re-drive the broker did not acknowledge: its
// event leaves the outbox (unless a relay published it or leased it
// meanwhile, in which case it stands), its attempt is not counted, its action is not recorded.
func (c *Compensator) undoRedrive(ctx context.Context, r redriven) error {
	err := pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `DELETE FROM outbox WHERE id = $1 AND `+unleasedPending, r.outboxID)
		if err != nil || tag.RowsAffected() == 0 {
			return err
		}
		if _, err := tx.Exec(ctx, `
			UPDATE orders SET redrive_attempts = $3, redrive_status = $4
			WHERE order_id = $1 AND redrive_status = $2 AND redrive_attempts = $5`,
			r.o.ID, string(r.o.Status), r.o.Attempts, r.o.RedriveStatus, r.a.Attempt); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `
			DELETE FROM compensator_actions WHERE id = (
				SELECT max(id) FROM compensator_actions
				WHERE order_id = $1 AND action = 'redrive' AND from_status = $2 AND attempt = $3)`,
			r.o.ID, string(r.o.Status), r.a.Attempt)
		return err
	})
	if err != nil {
		return fmt.Errorf("take back the unacknowledged re-drive %d of order %s: %w", r.a.Attempt, r.o.ID, err)
	}
	c.logger.Warn("re-drive not acknowledged by the broker; not counted", slog.String("order_id", r.o.ID.String()),
		slog.String("request_id", r.o.RequestID), slog.String("status", string(r.o.Status)), slog.Int("attempt", r.a.Attempt))
	return nil
}

var errSkip = errors.New("skip")

// logAction reports a to OnAction and logs it, in a span of its own so the
// line carries a trace id like every other line about an order.
func (c *Compensator) logAction(a Action) {
	if c.OnAction != nil {
		c.OnAction(a)
	}
	ctx, span := tracing.Tracer().Start(context.Background(), "compensator "+string(a.Kind))
	defer span.End()
	c.logger.InfoContext(ctx, "compensator action", slog.String("action", string(a.Kind)), slog.String("order_id", a.OrderID.String()),
		slog.String("request_id", a.RequestID), slog.String("client_id", a.ClientID.String()),
		slog.String("from_status", string(a.From)), slog.Int("attempt", a.Attempt), slog.String("reason", a.Reason),
		slog.Bool("dry_run", a.DryRun))
}

// claimCAS is the compare-and-set on what the compensator read: it fails
// (0 rows) when a consumer or another compensator changed the order since.
const claimCAS = `
	UPDATE orders SET redrive_attempts = $5, redrive_status = $2, redriven_at = now()
	WHERE order_id = $1 AND status = $2 AND redrive_attempts = $3 AND redrive_status IS NOT DISTINCT FROM $4`

// redrive applies the planned re-drive a: it re-publishes the event of o's
// current status with the next re-drive number, in tx.
func (c *Compensator) redrive(ctx context.Context, tx pgx.Tx, o stuckOrder, a Action) (Action, int64, error) {
	attempt := a.Attempt
	tag, err := tx.Exec(ctx, claimCAS, o.ID, string(o.Status), o.Attempts, o.RedriveStatus, attempt)
	if err != nil {
		return a, 0, fmt.Errorf("re-drive order %s: %w", o.ID, err)
	}
	if tag.RowsAffected() == 0 {
		return c.skip(o, "the order changed since it was read"), 0, nil
	}
	var reason *string
	if err := tx.QueryRow(ctx, `SELECT reason FROM orders WHERE order_id = $1`, o.ID).Scan(&reason); err != nil {
		return a, 0, fmt.Errorf("re-drive order %s: %w", o.ID, err)
	}
	e := orderevent.Event{
		Version:    orderevent.Version,
		Name:       orderevent.ForStatus(o.Status),
		OrderID:    o.ID,
		ClientID:   o.ClientID,
		RequestID:  o.RequestID,
		Status:     o.Status,
		OccurredAt: o.EnteredAt.UTC(),
		Redrive:    attempt,
	}
	if reason != nil {
		e.Reason = *reason
	}
	oid, err := outbox.Enqueue(ctx, tx, e)
	if err != nil {
		return a, 0, fmt.Errorf("re-drive order %s: %w", o.ID, err)
	}
	a.Reason += "; published " + e.MsgID()
	if err := c.record(ctx, tx, a); err != nil {
		return a, 0, err
	}
	return a, oid, nil
}

// unwind applies the planned unwind a: it undoes what was done for o and
// cancels it, in tx: its reservations released (the returned lines, which
// the batch gives back to the stock at its end, every SKU once and in SKU
// order, so that no stock row is held across the batch's other orders), a
// refund of any charge recorded as due (the provider is called after the
// commit), the order moved to cancelled if it is still where it was read.
func (c *Compensator) unwind(ctx context.Context, tx pgx.Tx, o stuckOrder, a Action) (Action, int64, []stock.Line, error) {
	spent := a.Attempt
	tag, err := tx.Exec(ctx, claimCAS, o.ID, string(o.Status), o.Attempts, o.RedriveStatus, o.Attempts)
	if err != nil {
		return a, 0, nil, fmt.Errorf("unwind order %s: %w", o.ID, err)
	}
	if tag.RowsAffected() == 0 {
		return c.skip(o, "the order changed since it was read"), 0, nil, nil
	}
	lines, err := stock.Unreserve(ctx, tx, o.ID)
	if err != nil {
		return a, 0, nil, fmt.Errorf("unwind order %s: %w", o.ID, err)
	}
	if err := markRefundDue(ctx, tx, o.ID); err != nil {
		return a, 0, nil, fmt.Errorf("unwind order %s: %w", o.ID, err)
	}
	public := fmt.Sprintf("not completed in time: no progress in %s after %d re-drives", o.Status, spent)
	moved, err := orderstore.Transition(ctx, tx, o.ID, o.Status, order.StatusCancelled, public)
	if err != nil {
		return a, 0, nil, fmt.Errorf("unwind order %s: %w", o.ID, err)
	}
	if !moved.OK {
		// Cannot happen while the row is locked and the CAS held; if it
		// does, the consumer won and we do nothing.
		return c.skip(o, fmt.Sprintf("the order is %s now", moved.Current)), 0, nil, nil
	}
	if err := c.record(ctx, tx, a); err != nil {
		return a, 0, nil, err
	}
	return a, moved.Event.ID, lines, nil
}

// eventPending reports whether an event of the order still waits in the
// outbox: the broker has not acknowledged it (it is down, or the process
// that wrote it died). The relay publishes it; until then the order is not
// unwound (its last re-drive may not have reached anyone).
func eventPending(ctx context.Context, q postgres.DB, orderID uuid.UUID) (bool, error) {
	var pending bool
	if err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM outbox WHERE order_id = $1 AND published_at IS NULL)`, orderID).Scan(&pending); err != nil {
		return false, fmt.Errorf("read pending events of order %s: %w", orderID, err)
	}
	return pending, nil
}

const whyPending = "not unwound: an event of the order is not acknowledged by the broker yet; the relay publishes it first"

func (c *Compensator) skip(o stuckOrder, why string) Action {
	return Action{OrderID: o.ID, ClientID: o.ClientID, RequestID: o.RequestID, Kind: KindSkip, From: o.Status, Attempt: o.attempt(), Reason: why}
}

// record writes a to compensator_actions.
func (c *Compensator) record(ctx context.Context, tx pgx.Tx, a Action) error {
	_, err := tx.Exec(ctx, `INSERT INTO compensator_actions (order_id, action, from_status, attempt, reason, actor, forced) VALUES ($1, $2, $3, $4, $5, $6, $7)`,
		a.OrderID, a.Kind, string(a.From), a.Attempt, a.Reason, c.cfg.Actor, c.cfg.Force)
	if err != nil {
		return fmt.Errorf("record %s of order %s: %w", a.Kind, a.OrderID, err)
	}
	return nil
}

// republish publishes outbox rows pending for longer than OutboxMinAge.
func (c *Compensator) republish(ctx context.Context, res *Result) error {
	for range c.cfg.RepublishRounds { // bounded per pass
		n, err := c.relay.PublishPending(ctx, c.cfg.OutboxMinAge)
		res.Republished += n
		if err != nil {
			return fmt.Errorf("publish pending outbox rows: %w", err)
		}
		if n == 0 || (c.relay.Batch > 0 && n < c.relay.Batch) {
			return nil
		}
	}
	return nil
}

// tokens settles the idempotency tokens whose holder died, deletes those
// that expired unused longer than their retention ago, in batches, and
// counts the tokens not used yet per state for the gauge.
func (c *Compensator) tokens(ctx context.Context, res *Result) error {
	settled, err := idemtoken.Settle(ctx, c.pool)
	if err != nil {
		return err
	}
	res.TokensSettled = settled
	if err := c.drain(&res.TokensSwept, func() (int64, error) {
		return idemtoken.Sweep(ctx, c.pool, c.cfg.TokenRetention, c.cfg.SweepBatchSize)
	}); err != nil {
		return err
	}
	counts, err := idemtoken.CountOutstanding(ctx, c.pool)
	if err != nil {
		return err
	}
	for st, n := range counts {
		metrics.Tokens.WithLabelValues(string(st)).Set(float64(n))
	}
	return nil
}

// drain calls del, one batch of deletes at a time, until a batch is short,
// adding what it deleted to *n.
func (c *Compensator) drain(n *int64, del func() (int64, error)) error {
	for {
		k, err := del()
		*n += k
		if err != nil || k < int64(c.cfg.SweepBatchSize) {
			return err
		}
	}
}

// sweep deletes processed_messages rows older than the retention and
// published outbox rows of finished orders older than the outbox
// retention, in batches.
func (c *Compensator) sweep(ctx context.Context, res *Result) error {
	exec := func(what, sql string, retention time.Duration) func() (int64, error) {
		return func() (int64, error) {
			tag, err := c.pool.Exec(ctx, sql, retention.Seconds(), c.cfg.SweepBatchSize)
			if err != nil {
				return 0, fmt.Errorf("%s: %w", what, err)
			}
			return tag.RowsAffected(), nil
		}
	}
	if err := c.drain(&res.Swept, exec("sweep expired dedupe rows", `
		DELETE FROM processed_messages WHERE ctid = ANY (ARRAY(
			SELECT ctid FROM processed_messages
			WHERE processed_at < now() - make_interval(secs => $1::float8)
			LIMIT $2 FOR UPDATE SKIP LOCKED))`, c.cfg.DedupeRetention)); err != nil {
		return err
	}
	// Published events of orders that are no longer open: the order's
	// history stays in order_events; heal needs only open orders' rows.
	// Old rows come first in id order, so the primary key finds them, up
	// to the first row created within the retention: every row below it is
	// older, and a row published within the retention was created within
	// it. Without that bound, a prune that found nothing to delete read the
	// whole outbox (the retention's worth of events) at every pass.
	if err := c.drain(&res.OutboxPruned, exec("prune published outbox rows", `
		DELETE FROM outbox WHERE id = ANY (ARRAY(
			SELECT ob.id FROM outbox ob
			WHERE ob.id < coalesce((SELECT y.id FROM outbox y WHERE y.created_at >= now() - make_interval(secs => $1::float8) ORDER BY y.id LIMIT 1), 9223372036854775807)
			  AND ob.published_at < now() - make_interval(secs => $1::float8)
			  AND NOT EXISTS (SELECT 1 FROM orders o WHERE o.order_id = ob.order_id AND o.status IN ('processing', 'reserved', 'paid'))
			ORDER BY ob.id LIMIT $2 FOR UPDATE SKIP LOCKED))`, c.cfg.OutboxRetention)); err != nil {
		return err
	}
	return nil
}

package consumers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"orderpipe/consumers/step"
	"orderpipe/shared/failpoint"
	"orderpipe/shared/groupcommit"
	"orderpipe/shared/metrics"
	"orderpipe/shared/outbox"
	"orderpipe/shared/postgres"
)

// Group commit of a step's messages. The handlers of one step run
// concurrently (Config.Workers of them); each calls its Commit, which does
// not open a transaction of its own but joins the step's queue. One flusher
// per step takes whatever is queued (at most maxCommitBatch) and runs it in
// ONE transaction: the batch's dedupe rows in one statement, then each fresh
// message's Apply in turn, then one commit. After the commit the batch's
// outbox events are published together and each handler gets its answer;
// meanwhile the flusher already runs the next batch. Nothing waits on a
// timer: at low load a batch is one message and goes at once; under load
// messages queue behind the running transaction and share the next commit,
// so the commit's WAL flush, the transaction's round trips and the inline
// publish's read and stamp are paid once per batch, not once per message.
//
// A batch is all or nothing, and no message's answer depends on the others:
// when any Apply fails, or the commit does, the transaction is rolled back
// and each message of the batch runs again alone, in a transaction of its
// own, and gets the answer it would have got had it come alone. An Apply
// must therefore keep no state across runs (see step.Apply).
//
// One flusher per step, not more: two transactions of the same step lock
// rows (an order's, a SKU's) in the orders in which their messages came,
// and two of them at once could wait for each other in a cycle.

// maxCommitBatch bounds the messages of one transaction.
const maxCommitBatch = 64

type commitJob struct {
	ctx   context.Context
	msg   step.Message
	apply step.Apply // nil for a step.Batch step
	done  chan commitResult
}

type commitResult struct {
	// fresh is false when the dedupe row existed already: the work was
	// done by another delivery and apply did not run.
	fresh bool
	// committed is true when the transaction committed (err may still
	// be set: a failure after the commit).
	committed bool
	err       error
}

// committer is one step's queue and flusher.
type committer struct {
	p    *Pipeline
	step string
	// batch is the step's set-based work (step.Step.Batch), run once per
	// batch; nil: each message's own apply runs in turn.
	batch step.Batch
	q     groupcommit.Queue[*commitJob]
}

func newCommitter(p *Pipeline, name string, batch step.Batch) *committer {
	c := &committer{p: p, step: name, batch: batch}
	c.q = groupcommit.Queue[*commitJob]{Flush: c.flush, MaxBatch: maxCommitBatch, Flushers: 1}
	return c
}

// commit queues one message's apply for the step's next transaction and
// waits for the outcome (after the commit and the inline publish).
func (c *committer) commit(ctx context.Context, m step.Message, apply step.Apply) commitResult {
	j := &commitJob{ctx: ctx, msg: m, apply: apply, done: make(chan commitResult, 1)}
	c.q.Add(j)
	// Not cut short by ctx: the batch may commit this message's work, and
	// the handler must know whether it did before the message is settled.
	return <-j.done
}

// flush runs one batch's transaction, then (in the background, so that the
// next batch need not wait) publishes its events and answers its handlers.
// A failed batch of more than one runs again message by message.
func (c *committer) flush(batch []*commitJob) {
	t0 := time.Now()
	fresh, events, err := c.transact(batch)
	metrics.StepBatchSize.WithLabelValues(c.step).Observe(float64(len(batch)))
	metrics.StepBatchDuration.WithLabelValues(c.step).Observe(time.Since(t0).Seconds())
	if err != nil {
		if len(batch) == 1 {
			batch[0].done <- commitResult{err: err}
			return
		}
		c.p.env.Logger.Debug("step batch failed; running its messages one by one", slog.String("step", c.step),
			slog.Int("messages", len(batch)), slog.Any("error", err))
		for _, j := range batch {
			c.flush([]*commitJob{j})
		}
		return
	}
	go c.published(batch, fresh, events)
}

// published is the part after the commit: metrics, the inline publish of
// the batch's events from memory (the relay publishes them later if this
// fails), the answers.
func (c *committer) published(batch []*commitJob, fresh []bool, events []outbox.Row) {
	// The commit stands whatever became of the handler that led the batch
	// (its context may have ended: a slow run at its bound), so its events
	// go now; the publish is bounded by the relay's PublishTimeout.
	ctx := context.WithoutCancel(batch[0].ctx)
	var after error
	n := 0
	for i := range batch {
		if !fresh[i] {
			metrics.HandlerMessages.WithLabelValues(c.step, metrics.HandlerDuplicate).Inc()
			continue
		}
		n++
		metrics.HandlerMessages.WithLabelValues(c.step, metrics.HandlerProcessed).Inc()
	}
	if n > 0 {
		after = failpoint.Inject(FailAfterCommit)
	}
	var acked outbox.Acked
	if after == nil {
		// The rows the transaction wrote serve the metrics and the
		// publish, as the intake's do: no read after the commit, and no
		// relay takes them before they are MinAge old. The metrics count
		// every move, with the broker down too.
		observeMoves(events)
		var err error
		if acked, err = c.p.relay.PublishRows(ctx, events); err != nil {
			// Committed: the relay publishes the pending rows later.
			Logger(ctx).WarnContext(ctx, "inline publish after commit; the relay will retry", slog.Any("error", err), slog.Int("events", len(events)))
		}
	}
	for i, j := range batch {
		r := commitResult{fresh: fresh[i], committed: true}
		if fresh[i] {
			r.err = after
		}
		j.done <- r
	}
	// The answers went first: a row left unstamped is published again by
	// the relay, and the broker (or the next step's dedupe row) drops the
	// copy.
	if err := c.p.relay.Stamp(ctx, acked); err != nil {
		Logger(ctx).WarnContext(ctx, "stamp published events; the relay publishes them again", slog.Any("error", err))
	}
}

// transact runs the batch in one transaction and returns, per message,
// whether it was fresh (its dedupe row new, its apply run), and the outbox
// rows of all applies. The transaction's statements run on their generic
// plans (postgres.GenericPlans): a step's small batches are not planned
// again at every run.
func (c *committer) transact(batch []*commitJob) (fresh []bool, events []outbox.Row, err error) {
	ctx, cancel := batchContext(batch)
	defer cancel()
	fresh = make([]bool, len(batch))
	err = pgx.BeginTxFunc(ctx, c.p.env.Pool, postgres.GenericPlans, func(tx pgx.Tx) error {
		if err := c.dedupe(ctx, tx, batch, fresh); err != nil {
			return err
		}
		if c.batch != nil {
			var ms []step.Message
			for i, j := range batch {
				if fresh[i] {
					ms = append(ms, j.msg)
				}
			}
			if len(ms) == 0 {
				return nil
			}
			out, err := c.batch(ctx, tx, ms)
			events = out
			return err
		}
		for i, j := range batch {
			if !fresh[i] {
				continue
			}
			// The message's own context (its logger, its span), without
			// its cancellation: the transaction is the batch's.
			actx, acancel := sameDeadline(context.WithoutCancel(j.ctx), ctx)
			out, err := j.apply(actx, tx)
			acancel()
			if err != nil {
				return err
			}
			events = append(events, out...)
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	return fresh, events, nil
}

// dedupe inserts the batch's dedupe rows in one statement and marks which
// messages are fresh: those whose row is new, each id once (the same
// message twice in one batch — a redelivery beside a slow first delivery —
// is done by the first).
func (c *committer) dedupe(ctx context.Context, tx pgx.Tx, batch []*commitJob, fresh []bool) error {
	if c.p.cfg.noDedupe {
		for i := range fresh {
			fresh[i] = true
		}
		return nil
	}
	msgIDs := make([]string, len(batch))
	for i, j := range batch {
		msgIDs[i] = j.msg.ID
	}
	// In one order, so that two replicas' batches holding the same
	// messages (redeliveries) wait for each other instead of deadlocking.
	slices.Sort(msgIDs)
	rows, err := tx.Query(ctx, `
		INSERT INTO processed_messages (consumer, message_id) SELECT $1, unnest($2::text[])
		ON CONFLICT DO NOTHING RETURNING message_id`, c.step, msgIDs)
	if err != nil {
		return fmt.Errorf("insert dedupe rows: %w", err)
	}
	inserted, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("insert dedupe rows: %w", err)
	}
	isNew := make(map[string]bool, len(inserted))
	for _, id := range inserted {
		isNew[id] = true
	}
	for i, j := range batch {
		fresh[i] = isNew[j.msg.ID]
		delete(isNew, j.msg.ID)
	}
	return nil
}

// batchContext is the batch's context: the first message's values, no
// cancellation (a handler that gives up must not abort the others'
// transaction), and the latest of the messages' deadlines.
func batchContext(batch []*commitJob) (context.Context, context.CancelFunc) {
	var dl time.Time
	for _, j := range batch {
		if d, ok := j.ctx.Deadline(); ok && d.After(dl) {
			dl = d
		}
	}
	base := context.WithoutCancel(batch[0].ctx)
	if dl.IsZero() {
		return context.WithCancel(base)
	}
	return context.WithDeadline(base, dl)
}

// sameDeadline returns ctx with the deadline of like, if it has one.
func sameDeadline(ctx, like context.Context) (context.Context, context.CancelFunc) {
	if d, ok := like.Deadline(); ok {
		return context.WithDeadline(ctx, d)
	}
	return context.WithCancel(ctx)
}

// errCommitTwice is a handler's second call of its Commit.
var errCommitTwice = errors.New("commit called twice in one handler run")

package producer

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"orderpipe/shared/failpoint"
	"orderpipe/shared/groupcommit"
	"orderpipe/shared/metrics"
	"orderpipe/shared/order"
	"orderpipe/shared/orderstore"
	"orderpipe/shared/outbox"
)

// Group commit. Concurrent create requests are written together: each
// request joins a queue (shared/groupcommit), and up to maxFlushers
// goroutines take whatever is queued (at most maxBatch) and write it in one
// statement
// (orderstore.InsertBatch), then publish the batch's accepted events
// together from memory and wait for the broker's acks, then answer each
// request from the batch, then stamp the events published. Nothing waits on a
// timer: at low load a batch is one request and goes at once; under load
// requests queue behind a running flush and share the next commit, so the
// cost of a commit (the WAL fsync) and of the round trips is paid once per
// batch instead of once per request. A request is answered only after its
// row committed; one whose deadline comes while its batch still waits for
// the acks is answered from the commit (the relay publishes its event).

const (
	maxBatch    = 256
	maxFlushers = 2
)

type job struct {
	ctx      context.Context
	clientID uuid.UUID
	req      order.CreateRequest
	done     chan orderstore.BatchResult
	// committed is the request's result once its batch committed, set
	// before the batch's publish: a request whose deadline comes while
	// the batch waits for the broker is answered from it.
	committed atomic.Pointer[orderstore.BatchResult]
}

type batcher struct {
	s *Service
	// db is the group commit's own pool (app.Env.Reserve): its flushers'
	// writes and reads never wait behind the process's other work for a
	// connection, and run on connections that have their statements
	// prepared and planned.
	db *pgxpool.Pool
	q  groupcommit.Queue[*job]

	mu       sync.Mutex
	inFlight map[orderstore.Key]*leader // the requests being written, by key
	// known holds keys whose order this process saw committed (bounded:
	// it starts over when full); a request of a known key is a replay and
	// is read (reads), not written.
	known map[orderstore.Key]struct{}
	reads groupcommit.Queue[*readJob]
}

// maxKnown bounds the keys the batcher remembers as committed.
const maxKnown = 65536

// readJob is a request of a known key waiting for its order to be read.
type readJob struct {
	ctx  context.Context
	key  orderstore.Key
	done chan readResult
}

type readResult struct {
	o     order.Order
	found bool
	err   error
}

// leader is a request in flight that concurrent requests of the same key
// wait for: done is closed once res is set. waiters counts them.
type leader struct {
	done    chan struct{}
	res     orderstore.BatchResult
	waiters int
}

func newBatcher(s *Service) *batcher {
	db, err := s.env.Reserve(2 * maxFlushers) // the write and the read flushers
	if err != nil {
		s.env.Logger.Warn("the intake's group commit shares the process's pool", slog.Any("error", err))
		db = s.env.Pool
	}
	b := &batcher{s: s, db: db, inFlight: map[orderstore.Key]*leader{}, known: map[orderstore.Key]struct{}{}}
	b.reads = groupcommit.Queue[*readJob]{Flush: b.flushReads, MaxBatch: maxBatch, Flushers: maxFlushers}
	b.q = groupcommit.Queue[*job]{Flush: b.flush, MaxBatch: maxBatch, Flushers: maxFlushers}
	return b
}

// insert writes one create request in the next batch and returns its
// result. A request whose key (client, request_id) is already being
// written by this process waits for that request instead (a retry storm
// costs one row, not one per retry) and is answered from its order: a
// replay when the payloads match, order.ErrRequestIDReused when they do
// not. When the request it waited for failed, it is written itself.
func (b *batcher) insert(ctx context.Context, clientID uuid.UUID, req order.CreateRequest) (orderstore.Inserted, error) {
	key := orderstore.Key{ClientID: clientID, RequestID: req.RequestID}
	for {
		b.mu.Lock()
		l, waiting := b.inFlight[key]
		_, known := b.known[key]
		if waiting {
			l.waiters++
		} else {
			l = &leader{done: make(chan struct{})}
			b.inFlight[key] = l
		}
		b.mu.Unlock()
		if !waiting {
			r, err := b.readOrWrite(ctx, key, known, req)
			b.mu.Lock()
			delete(b.inFlight, key)
			if err == nil {
				if len(b.known) >= maxKnown {
					clear(b.known)
				}
				b.known[key] = struct{}{}
			}
			b.mu.Unlock()
			l.res = orderstore.BatchResult{Inserted: r, Err: err}
			close(l.done)
			return r, err
		}
		select {
		case <-l.done:
		case <-ctx.Done():
			return orderstore.Inserted{}, ctx.Err()
		}
		if l.res.Err != nil {
			continue // its failure is its own (a deadline, a mismatch): try again
		}
		metrics.IntakeCoalesced.Inc()
		r, err := orderstore.Replay(l.res.Order, req.Fingerprint())
		r.RequestIDConflict = true
		return r, err
	}
}

// readOrWrite answers a request of a key known to be committed from a
// read of its order (a replay, or ErrRequestIDReused), and writes any
// other request, or one whose read found nothing.
func (b *batcher) readOrWrite(ctx context.Context, key orderstore.Key, known bool, req order.CreateRequest) (orderstore.Inserted, error) {
	if known {
		j := &readJob{ctx: ctx, key: key, done: make(chan readResult, 1)}
		b.reads.Add(j)
		var r readResult
		select {
		case r = <-j.done:
		case <-ctx.Done():
			return orderstore.Inserted{}, ctx.Err()
		}
		if r.err != nil {
			return orderstore.Inserted{}, r.err
		}
		if r.found {
			return orderstore.Replay(r.o, req.Fingerprint())
		}
	}
	return b.write(ctx, key.ClientID, req)
}

// flushReads reads the orders of one batch of known keys in one query.
func (b *batcher) flushReads(batch []*readJob) {
	live, ctx, cancel := liveBatch(batch, b.s.opts.Timeout, func(j *readJob) context.Context { return j.ctx },
		func(j *readJob, err error) { j.done <- readResult{err: err} })
	defer cancel()
	if len(live) == 0 {
		return
	}
	clients, rids := make([]uuid.UUID, len(live)), make([]string, len(live))
	for i, j := range live {
		clients[i], rids[i] = j.key.ClientID, j.key.RequestID
	}
	stored, err := orderstore.GetByRequestIDs(ctx, b.db, clients, rids)
	for _, j := range live {
		o, found := stored[j.key]
		j.done <- readResult{o: o, found: found, err: err}
	}
}

// liveBatch drops from batch the requests whose context already ended
// (answering each with its error through fail) and returns the others with
// the batch's context: no cancellation, and the latest of their deadlines
// (timeout from now when none has one).
func liveBatch[T any](batch []T, timeout time.Duration, ctxOf func(T) context.Context, fail func(T, error)) ([]T, context.Context, context.CancelFunc) {
	live := batch[:0:0]
	var deadline time.Time
	for _, j := range batch {
		if err := ctxOf(j).Err(); err != nil {
			fail(j, err)
			continue
		}
		live = append(live, j)
		if dl, ok := ctxOf(j).Deadline(); ok && dl.After(deadline) {
			deadline = dl
		}
	}
	if len(live) == 0 {
		return nil, context.Background(), func() {}
	}
	if deadline.IsZero() {
		deadline = time.Now().Add(timeout)
	}
	ctx, cancel := context.WithDeadline(context.WithoutCancel(ctxOf(live[0])), deadline)
	return live, ctx, cancel
}

// write puts one create request in the next batch and returns its result.
func (b *batcher) write(ctx context.Context, clientID uuid.UUID, req order.CreateRequest) (orderstore.Inserted, error) {
	j := &job{ctx: ctx, clientID: clientID, req: req, done: make(chan orderstore.BatchResult, 1)}
	b.q.Add(j)
	select {
	case r := <-j.done:
		return r.Inserted, r.Err
	case <-ctx.Done():
		// Committed while its batch waits for the broker's acks: the
		// order and its event are durable, and the relay publishes what
		// the batch does not (DESIGN.md, guarantee 3).
		if r := j.committed.Load(); r != nil {
			return r.Inserted, r.Err
		}
		// The batch may still commit it: the client's retry is replayed.
		return orderstore.Inserted{}, ctx.Err()
	}
}

// flush writes one batch and answers its requests.
func (b *batcher) flush(batch []*job) {
	s := b.s
	// The batch outlives a request that gives up: its row may commit, and
	// the client's retry is answered from it.
	live, ctx, cancel := liveBatch(batch, s.opts.Timeout, func(j *job) context.Context { return j.ctx },
		func(j *job, err error) { j.done <- orderstore.BatchResult{Err: err} })
	defer cancel()
	if len(live) == 0 {
		return
	}
	items := make([]orderstore.NewOrder, len(live))
	for i, j := range live {
		items[i] = orderstore.NewOrder{Ctx: j.ctx, ClientID: j.clientID, Req: j.req}
	}
	res, err := orderstore.InsertBatch(ctx, b.db, items, s.opts.NewOrderNo)
	if err != nil {
		if len(live) == 1 || errors.Is(err, context.DeadlineExceeded) {
			for _, j := range live {
				j.done <- orderstore.BatchResult{Err: err}
			}
			return
		}
		// One bad request must not fail the others: write each alone.
		s.env.Logger.Warn("batch insert failed; writing its requests one by one", slog.Int("requests", len(live)), slog.Any("error", err))
		for _, j := range live {
			b.flush([]*job{j})
		}
		return
	}
	var rows []outbox.Row
	var retried []int64
	for i, j := range live {
		if res[i].Retry {
			// Its order number collided: the one-request path retries.
			r, err := orderstore.Insert(ctx, b.db, j.clientID, j.req, orderstore.InsertOptions{NewOrderNo: s.opts.NewOrderNo})
			res[i].Inserted, res[i].Err = r, err
			res[i].OrderNoCollisions++
			if err == nil && !r.Replayed && r.OutboxID != 0 {
				retried = append(retried, r.OutboxID)
			}
		} else if res[i].Err == nil && !res[i].Replayed && res[i].OutboxID != 0 {
			rows = append(rows, res[i].Event)
		}
		j.committed.Store(&res[i])
	}
	var acked outbox.Acked
	if len(rows)+len(retried) > 0 {
		if err := failpoint.Inject(FailAfterCommit); err != nil {
			s.env.Logger.Warn("accepted events left to the relay", slog.Any("error", err))
		} else {
			pctx, pcancel := context.WithTimeout(ctx, s.opts.InlinePublishTimeout)
			var err error
			if acked, err = s.relay.PublishRows(pctx, rows); err != nil {
				s.env.Logger.Warn("inline publish of accepted events failed; left to the relay", slog.Int("events", len(rows)), slog.Any("error", err))
			}
			if err := s.relay.Publish(pctx, retried...); err != nil {
				s.env.Logger.Warn("inline publish of accepted events failed; left to the relay", slog.Int("events", len(retried)), slog.Any("error", err))
			}
			pcancel()
		}
	}
	for i, j := range live {
		j.done <- res[i]
	}
	// The answers went first: a row left unstamped is published again by
	// the relay, and the broker drops the copy.
	if err := s.relay.Stamp(ctx, acked); err != nil {
		s.env.Logger.Warn("stamp published accepted events; the relay publishes them again", slog.Any("error", err))
	}
}

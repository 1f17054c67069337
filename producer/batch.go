package producer

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/google/uuid"

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
// row committed.

const (
	maxBatch    = 256
	maxFlushers = 2
)

type job struct {
	ctx      context.Context
	clientID uuid.UUID
	req      order.CreateRequest
	done     chan orderstore.BatchResult
}

type batcher struct {
	s *Service
	q groupcommit.Queue[*job]

	mu       sync.Mutex
	inFlight map[reqKey]*leader // the requests being written, by key
}

// reqKey is a create request's identity: its client and request_id.
type reqKey struct {
	client    uuid.UUID
	requestID string
}

// leader is a request in flight that concurrent requests of the same key
// wait for: done is closed once res is set. waiters counts them.
type leader struct {
	done    chan struct{}
	res     orderstore.BatchResult
	waiters int
}

func newBatcher(s *Service) *batcher {
	b := &batcher{s: s, inFlight: map[reqKey]*leader{}}
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
	key := reqKey{clientID, req.RequestID}
	for {
		b.mu.Lock()
		l, waiting := b.inFlight[key]
		if waiting {
			l.waiters++
		} else {
			l = &leader{done: make(chan struct{})}
			b.inFlight[key] = l
		}
		b.mu.Unlock()
		if !waiting {
			r, err := b.write(ctx, clientID, req)
			b.mu.Lock()
			delete(b.inFlight, key)
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

// write puts one create request in the next batch and returns its result.
func (b *batcher) write(ctx context.Context, clientID uuid.UUID, req order.CreateRequest) (orderstore.Inserted, error) {
	j := &job{ctx: ctx, clientID: clientID, req: req, done: make(chan orderstore.BatchResult, 1)}
	b.q.Add(j)
	select {
	case r := <-j.done:
		return r.Inserted, r.Err
	case <-ctx.Done():
		// The batch may still commit it: the client's retry is replayed.
		return orderstore.Inserted{}, ctx.Err()
	}
}

// flush writes one batch and answers its requests.
func (b *batcher) flush(batch []*job) {
	s := b.s
	live := batch[:0:0]
	var deadline time.Time
	for _, j := range batch {
		if err := j.ctx.Err(); err != nil {
			j.done <- orderstore.BatchResult{Err: err}
			continue
		}
		live = append(live, j)
		if dl, ok := j.ctx.Deadline(); ok && dl.After(deadline) {
			deadline = dl
		}
	}
	if len(live) == 0 {
		return
	}
	if deadline.IsZero() {
		deadline = time.Now().Add(s.opts.Timeout)
	}
	// The batch outlives a request that gives up: its row may commit, and
	// the client's retry is answered from it.
	ctx, cancel := context.WithDeadline(context.WithoutCancel(live[0].ctx), deadline)
	defer cancel()
	items := make([]orderstore.NewOrder, len(live))
	for i, j := range live {
		items[i] = orderstore.NewOrder{Ctx: j.ctx, ClientID: j.clientID, Req: j.req}
	}
	res, err := orderstore.InsertBatch(ctx, s.env.Pool, items, s.opts.NewOrderNo)
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
			r, err := orderstore.Insert(ctx, s.env.Pool, j.clientID, j.req, orderstore.InsertOptions{NewOrderNo: s.opts.NewOrderNo})
			res[i].Inserted, res[i].Err = r, err
			res[i].OrderNoCollisions++
			if err == nil && !r.Replayed && r.OutboxID != 0 {
				retried = append(retried, r.OutboxID)
			}
			continue
		}
		if res[i].Err == nil && !res[i].Replayed && res[i].OutboxID != 0 {
			rows = append(rows, res[i].Event)
		}
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

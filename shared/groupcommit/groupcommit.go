// Package groupcommit is the queue behind orderpipe's group commits: the
// intake's (concurrent create requests written in one transaction) and
// each pipeline step's (concurrent messages of one step in one
// transaction). Callers Add an item; up to Flushers goroutines take
// whatever is queued, at most MaxBatch items at a time, and hand it to
// Flush. Nothing waits on a timer: at low load a batch is one item and goes
// at once; under load items queue behind a running flush and share the
// next one. How a batch is written, and how each caller hears its answer,
// is the Flush function's business.
package groupcommit

import "sync"

// Queue is one group commit's queue. The zero value is not usable: set
// Flush, and MaxBatch and Flushers to at least 1.
type Queue[T any] struct {
	// Flush writes one batch, in the order the items were added. It runs
	// in a flusher goroutine; the next batch waits for it.
	Flush func(batch []T)
	// MaxBatch bounds the items of one batch.
	MaxBatch int
	// Flushers bounds the batches in flight at once.
	Flushers int

	mu       sync.Mutex
	queue    []T
	flushing int
}

// Add queues item for the next batch, starting a flusher if fewer than
// Flushers run.
func (q *Queue[T]) Add(item T) {
	q.mu.Lock()
	q.queue = append(q.queue, item)
	if q.flushing < q.Flushers {
		q.flushing++
		go q.flushLoop()
	}
	q.mu.Unlock()
}

// Len is how many items wait for a batch.
func (q *Queue[T]) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.queue)
}

func (q *Queue[T]) flushLoop() {
	for {
		q.mu.Lock()
		if len(q.queue) == 0 {
			q.flushing--
			q.mu.Unlock()
			return
		}
		n := min(len(q.queue), q.MaxBatch)
		batch := append([]T(nil), q.queue[:n]...)
		q.queue = append(q.queue[:0:0], q.queue[n:]...)
		q.mu.Unlock()
		q.Flush(batch)
	}
}

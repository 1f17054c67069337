package groupcommit_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"orderpipe/shared/groupcommit"
	"orderpipe/shared/tooling/testenv"
)

// TestItemsQueueBehindARunningFlush: items added while a flush runs wait
// and share the next batch, which holds at most MaxBatch of them, in the
// order they were added; no more than Flushers batches run at once, and
// every item is flushed exactly once.
func TestItemsQueueBehindARunningFlush(t *testing.T) {
	release := make(chan struct{})
	var (
		mu      sync.Mutex
		batches [][]int
		running atomic.Int32
		most    atomic.Int32
	)
	q := &groupcommit.Queue[int]{MaxBatch: 4, Flushers: 1, Flush: func(b []int) {
		n := running.Add(1)
		if n > most.Load() {
			most.Store(n)
		}
		if b[0] == 0 {
			<-release // the first batch holds the flusher until the rest is queued
		}
		mu.Lock()
		batches = append(batches, b)
		mu.Unlock()
		running.Add(-1)
	}}
	q.Add(0)
	testenv.WaitFor(t, 5*time.Second, "the first batch taken", func() bool { return q.Len() == 0 })
	for i := 1; i <= 10; i++ {
		q.Add(i)
	}
	if q.Len() != 10 {
		t.Fatalf("queued %d, want 10 behind the running flush", q.Len())
	}
	close(release)
	testenv.WaitFor(t, 5*time.Second, "every item flushed", func() bool {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, b := range batches {
			n += len(b)
		}
		return n == 11
	})
	mu.Lock()
	defer mu.Unlock()
	want := [][]int{{0}, {1, 2, 3, 4}, {5, 6, 7, 8}, {9, 10}}
	if len(batches) != len(want) {
		t.Fatalf("batches %v, want %v", batches, want)
	}
	for i := range want {
		for j := range want[i] {
			if len(batches[i]) != len(want[i]) || batches[i][j] != want[i][j] {
				t.Fatalf("batches %v, want %v", batches, want)
			}
		}
	}
	if most.Load() != 1 {
		t.Errorf("%d flushes at once, want 1", most.Load())
	}
}

// TestFlushersRunSideBySide: with two flushers, two batches may run at
// once, and not three.
func TestFlushersRunSideBySide(t *testing.T) {
	release := make(chan struct{})
	var running, most atomic.Int32
	var done sync.WaitGroup
	done.Add(6)
	q := &groupcommit.Queue[int]{MaxBatch: 1, Flushers: 2, Flush: func([]int) {
		n := running.Add(1)
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		<-release
		running.Add(-1)
		done.Done()
	}}
	for i := range 6 {
		q.Add(i)
	}
	testenv.WaitFor(t, 5*time.Second, "two batches running", func() bool { return running.Load() == 2 })
	close(release)
	done.Wait()
	if most.Load() != 2 {
		t.Errorf("%d flushes at once, want 2", most.Load())
	}
}

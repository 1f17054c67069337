package tenant

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
)

// blockedCache returns a cache whose lookups wait for release, then answer
// the client id; calls counts the lookups.
func blockedCache() (k *KeyCache, release chan struct{}, calls func() int32, id uuid.UUID) {
	release, id = make(chan struct{}), uuid.New()
	var n atomic.Int32
	k = NewKeyCache(time.Hour, 10)
	k.lookup = func(context.Context, *pgxpool.Pool, string) (Client, error) {
		n.Add(1)
		<-release
		return Client{ID: id}, nil
	}
	return k, release, n.Load, id
}

// TestKeyCacheLooksUpOnceForConcurrentMisses: a burst of requests with one
// key on a cold cache makes one lookup, not one per request; every request
// gets the lookup's answer, and the next one is served from the cache.
func TestKeyCacheLooksUpOnceForConcurrentMisses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k, release, calls, id := blockedCache()
		key := APIKeyPrefix + "burst"
		var wg sync.WaitGroup
		var wrong atomic.Int32
		for range 50 {
			wg.Go(func() {
				c, err := k.Authenticate(t.Context(), nil, key)
				if err != nil || c.ID != id {
					wrong.Add(1)
				}
			})
		}
		synctest.Wait() // every caller blocked: in the lookup, or waiting for it
		if n := calls(); n != 1 {
			t.Errorf("%d lookups for 50 concurrent requests with one key, want 1", n)
		}
		close(release)
		wg.Wait()
		if wrong.Load() != 0 {
			t.Errorf("%d requests did not get the lookup's client", wrong.Load())
		}
		if c, err := k.Authenticate(t.Context(), nil, key); err != nil || c.ID != id || calls() != 1 {
			t.Errorf("after the burst: %+v, %v, %d lookups; want the cached client and no new lookup", c, err, calls())
		}
	})
}

// TestKeyCacheGivesUpAtItsCallersDeadline: a caller waiting for a shared
// lookup (a pool that waits for a connection, a database that hangs) gets
// its own deadline's error when that passes, not the lookup's answer up to
// lookupTimeout later: the intake's deadline bounds authentication too.
// The lookup goes on for the others, and its answer is cached.
func TestKeyCacheGivesUpAtItsCallersDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k, release, calls, id := blockedCache()
		key := APIKeyPrefix + "slow"
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		done := make(chan error, 1)
		go func() {
			_, err := k.Authenticate(ctx, nil, key)
			done <- err
		}()
		time.Sleep(2 * time.Second) // the bubble's clock: past the caller's deadline
		synctest.Wait()
		answered := false
		select {
		case err := <-done:
			answered = true
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("after its deadline: %v, want context.DeadlineExceeded", err)
			}
		default:
			t.Error("the caller still waits for the shared lookup after its deadline")
		}
		close(release)
		synctest.Wait()
		if c, err := k.Authenticate(t.Context(), nil, key); err != nil || c.ID != id || calls() != 1 {
			t.Errorf("after the lookup: %+v, %v, %d lookups; want the cached client and no new lookup", c, err, calls())
		}
		if !answered {
			if err := <-done; err != nil {
				t.Errorf("the late answer: %v", err)
			}
		}
	})
}

package tenant

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestKeyCacheLooksUpOnceForConcurrentMisses: a burst of requests with one
// key on a cold cache makes one lookup, not one per request; every request
// gets the lookup's answer, and the next one is served from the cache.
func TestKeyCacheLooksUpOnceForConcurrentMisses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		var calls atomic.Int32
		id := uuid.New()
		k := NewKeyCache(time.Hour, 10)
		k.lookup = func(context.Context, *pgxpool.Pool, string) (Client, error) {
			calls.Add(1)
			<-release
			return Client{ID: id}, nil
		}
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
		if n := calls.Load(); n != 1 {
			t.Errorf("%d lookups for 50 concurrent requests with one key, want 1", n)
		}
		close(release)
		wg.Wait()
		if wrong.Load() != 0 {
			t.Errorf("%d requests did not get the lookup's client", wrong.Load())
		}
		if c, err := k.Authenticate(t.Context(), nil, key); err != nil || c.ID != id || calls.Load() != 1 {
			t.Errorf("after the burst: %+v, %v, %d lookups; want the cached client and no new lookup", c, err, calls.Load())
		}
	})
}

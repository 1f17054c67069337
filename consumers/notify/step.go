package notify

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"orderpipe/consumers/step"
	"orderpipe/shared/orderstore"
	"orderpipe/shared/outbox"
	"orderpipe/shared/postgres"
)

// Step returns the notifier step for the consumers' router: on every status
// event, Apply in the transaction of the step's dedupe row. It publishes
// nothing. An event without its history row is permanent (dead-lettered),
// like an unknown order.
//
// An order without a callback URL gets no webhook, ever: the URL is set
// when the order is created and never changes. Its events are acked after
// one read on db, with no transaction and no dedupe row, since there is no
// effect to do once (most orders of a shop that polls or streams have none,
// and each would otherwise cost a commit per status change). The step
// remembers the last orders it found without one, so that their later
// events are acked without even the read.
func Step(db postgres.DB) step.Step {
	silent := newOrderSet(silentOrders)
	return step.Step{Name: Name, Events: Events(), Handle: func(ctx context.Context, m step.Message, commit step.Commit) error {
		key := [2]uuid.UUID{m.Event.ClientID, m.Event.OrderID}
		if silent.has(key) {
			return nil
		}
		o, err := orderstore.Get(ctx, db, m.Event.ClientID, m.Event.OrderID)
		if err != nil {
			return fmt.Errorf("notify %s of order %s: %w", m.Event.Name, m.Event.OrderID, err)
		}
		if o.CallbackURL == "" {
			silent.add(key)
			return nil
		}
		// The order as read above, not read again in the transaction: the
		// change itself comes from the history there, and the rest is
		// fixed at creation but for updated_at, which either read takes
		// after the change committed.
		_, err = commit(ctx, func(ctx context.Context, tx pgx.Tx) ([]outbox.Row, error) {
			_, err := applyTo(ctx, tx, o, m.Event)
			if errors.Is(err, ErrNoHistory) {
				return nil, step.Permanent(err)
			}
			return nil, err
		})
		return err
	}}
}

// silentOrders bounds how many orders without a callback URL the notifier
// remembers (about 5 MB).
const silentOrders = 1 << 16

// orderSet is a bounded set of (client, order) pairs: past its size, the
// oldest entry makes room for the newest.
type orderSet struct {
	mu   sync.Mutex
	in   map[[2]uuid.UUID]struct{}
	ring [][2]uuid.UUID
	next int
}

func newOrderSet(size int) *orderSet {
	return &orderSet{in: make(map[[2]uuid.UUID]struct{}, size), ring: make([][2]uuid.UUID, 0, size)}
}

func (s *orderSet) has(k [2]uuid.UUID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.in[k]
	return ok
}

func (s *orderSet) add(k [2]uuid.UUID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.in[k]; ok {
		return
	}
	if len(s.ring) < cap(s.ring) {
		s.ring = append(s.ring, k)
	} else {
		delete(s.in, s.ring[s.next])
		s.ring[s.next] = k
		s.next = (s.next + 1) % len(s.ring)
	}
	s.in[k] = struct{}{}
}

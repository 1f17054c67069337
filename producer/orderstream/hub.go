// Package orderstream serves GET /v1/orders/{order_id}/events: an order's
// status changes as Server-Sent Events. A stream sends the history so far
// (order_events), then each new change as it commits, with `id:` = the
// change's per-order sequence number; a client that reconnects with
// Last-Event-ID gets only the later changes. Comments keep idle connections
// alive, and the stream ends after the terminal change.
//
// It does not depend on the change having happened in the same process: a
// trigger on order_events sends pg_notify('order_events', order_id) at
// commit, one LISTEN connection per process (Hub) wakes the streams of that
// order, and each stream re-reads order_events from its last sequence
// number. A periodic re-read is the safety net for a notification lost
// while the listening connection was down.
package orderstream

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgxlisten"
)

// Channel is the NOTIFY channel of migrations/00004_webhooks.sql's trigger;
// the payload is the order id.
const Channel = "order_events"

// Hub holds the process's one listening connection and fans its
// notifications out to the streams of each order.
type Hub struct {
	pool   *pgxpool.Pool
	logger *slog.Logger

	mu     sync.Mutex
	subs   map[uuid.UUID]map[chan struct{}]struct{}
	done   chan struct{}
	closed bool
}

// NewHub returns a hub on pool; Run makes it listen.
func NewHub(pool *pgxpool.Pool, logger *slog.Logger) *Hub {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Hub{pool: pool, logger: logger, subs: map[uuid.UUID]map[chan struct{}]struct{}{}, done: make(chan struct{})}
}

// Run listens until ctx ends, reconnecting after a lost connection (and
// then waking every stream, since notifications may have been missed).
// When it returns, every stream ends (Done is closed).
func (h *Hub) Run(ctx context.Context) error {
	defer func() {
		h.mu.Lock()
		if !h.closed {
			h.closed = true
			close(h.done)
		}
		h.mu.Unlock()
	}()
	l := &pgxlisten.Listener{
		Connect: func(ctx context.Context) (*pgx.Conn, error) {
			c, err := h.pool.Acquire(ctx)
			if err != nil {
				return nil, fmt.Errorf("acquire listening connection: %w", err)
			}
			return c.Hijack(), nil // the listener owns and closes it
		},
		LogError: func(ctx context.Context, err error) {
			if ctx.Err() == nil {
				h.logger.Warn("order event listener", slog.Any("error", err))
			}
		},
		ReconnectDelay: time.Second,
	}
	l.Handle(Channel, handler{h})
	err := l.Listen(ctx)
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// Done is closed when Run has returned (the process is shutting down).
func (h *Hub) Done() <-chan struct{} { return h.done }

type handler struct{ h *Hub }

func (x handler) HandleNotification(_ context.Context, n *pgconn.Notification, _ *pgx.Conn) error {
	id, err := uuid.Parse(n.Payload)
	if err != nil {
		return fmt.Errorf("notification payload %q is not an order id", n.Payload)
	}
	x.h.wake(id)
	return nil
}

// HandleBacklog runs after every (re)connect: wake every stream, so that
// each re-reads what it may have missed while no connection listened.
func (x handler) HandleBacklog(context.Context, string, *pgx.Conn) error {
	x.h.wakeAll()
	return nil
}

// Subscribe returns a channel that receives a value (coalesced) whenever a
// change of the order may have committed. Call cancel when done.
func (h *Hub) Subscribe(orderID uuid.UUID) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	h.mu.Lock()
	if h.subs[orderID] == nil {
		h.subs[orderID] = map[chan struct{}]struct{}{}
	}
	h.subs[orderID][ch] = struct{}{}
	h.mu.Unlock()
	return ch, func() {
		h.mu.Lock()
		delete(h.subs[orderID], ch)
		if len(h.subs[orderID]) == 0 {
			delete(h.subs, orderID)
		}
		h.mu.Unlock()
	}
}

func (h *Hub) wake(orderID uuid.UUID) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for ch := range h.subs[orderID] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

func (h *Hub) wakeAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, m := range h.subs {
		for ch := range m {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	}
}

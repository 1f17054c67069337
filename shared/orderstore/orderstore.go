// Package orderstore moves orders through their states in PostgreSQL. A
// move is a conditional update (WHERE status = expected), so a late or
// repeated message can never move an order backwards or twice, and it writes,
// in the caller's transaction, the order_events history row (with the next
// per-order sequence number) and the outbox event that announces the change.
package orderstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"orderpipe/shared/order"
	"orderpipe/shared/orderevent"
	"orderpipe/shared/outbox"
)

// Record writes the history row and the outbox event for an order that has
// just entered status (its row already says so) and returns the outbox row
// id, for the caller to publish right after its commit. The intake calls it
// for a new order; Transition calls it for every move.
func Record(ctx context.Context, tx pgx.Tx, orderID, clientID uuid.UUID, requestID string, status order.Status, reason string) (int64, error) {
	rows, err := RecordMany(ctx, tx, []Change{{OrderID: orderID, ClientID: clientID, RequestID: requestID, Status: status, Reason: reason}})
	if err != nil {
		return 0, err
	}
	return rows[0].ID, nil
}

// Change is one order that has just entered a status, for RecordMany.
type Change struct {
	// Ctx carries the trace that the change's event continues (nil: the
	// caller's).
	Ctx       context.Context
	OrderID   uuid.UUID
	ClientID  uuid.UUID
	RequestID string
	Status    order.Status
	Reason    string
}

// event is the event that announces c, which happened at at.
func (c Change) event(at time.Time) orderevent.Event {
	return orderevent.Event{
		Version:    orderevent.Version,
		Name:       orderevent.ForStatus(c.Status),
		OrderID:    c.OrderID,
		ClientID:   c.ClientID,
		RequestID:  c.RequestID,
		Status:     c.Status,
		Reason:     c.Reason,
		OccurredAt: at,
	}
}

// RecordMany is Record for many orders at once, each at most once, in two
// statements (the history rows, then the outbox events), and returns their
// outbox rows (outbox.EnqueueMany) in the order given.
func RecordMany(ctx context.Context, tx pgx.Tx, cs []Change) ([]outbox.Row, error) {
	n := len(cs)
	ids, statuses, reasons := make([]uuid.UUID, n), make([]string, n), make([]string, n)
	at := make(map[uuid.UUID]int, n)
	for i, c := range cs {
		if _, dup := at[c.OrderID]; dup {
			return nil, fmt.Errorf("record order %s twice in one statement", c.OrderID)
		}
		at[c.OrderID] = i
		ids[i], statuses[i], reasons[i] = c.OrderID, string(c.Status), c.Reason
	}
	rows, err := tx.Query(ctx, `
		INSERT INTO order_events (order_id, seq, status, reason)
		SELECT v.id, coalesce((SELECT max(e.seq) FROM order_events e WHERE e.order_id = v.id), 0) + 1, v.status, NULLIF(v.reason, '')
		FROM unnest($1::uuid[], $2::text[], $3::text[]) AS v(id, status, reason)
		RETURNING order_id, occurred_at`, ids, statuses, reasons)
	if err != nil {
		return nil, fmt.Errorf("record %d status change(s): %w", n, err)
	}
	occurred := make([]time.Time, n)
	for rows.Next() {
		var id uuid.UUID
		var t time.Time
		if err := rows.Scan(&id, &t); err != nil {
			rows.Close()
			return nil, fmt.Errorf("record %d status change(s): %w", n, err)
		}
		occurred[at[id]] = t
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("record %d status change(s): %w", n, err)
	}
	es := make([]outbox.Entry, n)
	for i, c := range cs {
		es[i] = outbox.Entry{Ctx: c.Ctx, Event: c.event(occurred[i].UTC())}
	}
	return outbox.EnqueueMany(ctx, tx, es)
}

// ErrNotFound is returned when no order has the id.
var ErrNotFound = errors.New("order not found")

// Moved says what Transition did.
type Moved struct {
	// OK is true when the order was in the expected state and moved.
	OK bool
	// Current is the order's status after the call (the new one when OK,
	// the one that stopped the move otherwise).
	Current order.Status
	// Event is the outbox row of the event to publish after commit (when
	// OK), ID included, to publish from memory (outbox.Relay.PublishRows).
	Event outbox.Row
}

// Transition moves an order from one status to another if, and only if, it
// is still in from. It locks the order row until the transaction ends. A move
// that the state machine forbids returns order.ErrInvalidTransition.
func Transition(ctx context.Context, tx pgx.Tx, id uuid.UUID, from, to order.Status, reason string) (Moved, error) {
	ms, err := TransitionMany(ctx, tx, []Move{{ID: id, From: from, To: to, Reason: reason}})
	if err != nil {
		return Moved{}, err
	}
	return ms[0], nil
}

// Move is one order's transition for TransitionMany.
type Move struct {
	// Ctx carries the trace that the move's event continues (nil: the
	// caller's).
	Ctx      context.Context
	ID       uuid.UUID
	From, To order.Status
	Reason   string
}

// TransitionMany is Transition for many orders at once, each at most once,
// set-based: one conditional UPDATE for all, one read of the current status
// of those that did not move, and RecordMany for those that did. It returns
// what it did per move, in the order given. A missing order fails the whole
// call with ErrNotFound, a forbidden move with order.ErrInvalidTransition.
func TransitionMany(ctx context.Context, tx pgx.Tx, ms []Move) ([]Moved, error) {
	n := len(ms)
	ids, froms, tos, reasons := make([]uuid.UUID, n), make([]string, n), make([]string, n), make([]string, n)
	at := make(map[uuid.UUID]int, n)
	for i, m := range ms {
		if err := order.CheckTransition(m.From, m.To); err != nil {
			return nil, err
		}
		if _, dup := at[m.ID]; dup {
			return nil, fmt.Errorf("move order %s twice in one statement", m.ID)
		}
		at[m.ID] = i
		ids[i], froms[i], tos[i], reasons[i] = m.ID, string(m.From), string(m.To), m.Reason
	}
	// The joins on "= ANY(ARRAY[…])" keep the moves and the read of the
	// orders that stay on the primary key in any cached plan, the generic
	// one of the steps' transactions included (see postgres.DB).
	rows, err := tx.Query(ctx, `
		UPDATE orders o SET status = v.to_status, reason = NULLIF(v.reason, ''), updated_at = now()
		FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[]) AS v(id, from_status, to_status, reason)
		WHERE o.order_id = ANY(ARRAY[v.id]) AND o.status = ANY(ARRAY[v.from_status])
		RETURNING o.order_id, o.client_id, o.request_id`, ids, froms, tos, reasons)
	if err != nil {
		return nil, fmt.Errorf("move %d order(s): %w", n, err)
	}
	out := make([]Moved, n)
	var changes []Change
	var changed []int
	for rows.Next() {
		var c Change
		if err := rows.Scan(&c.OrderID, &c.ClientID, &c.RequestID); err != nil {
			rows.Close()
			return nil, fmt.Errorf("move %d order(s): %w", n, err)
		}
		i := at[c.OrderID]
		c.Status, c.Reason, c.Ctx = ms[i].To, ms[i].Reason, ms[i].Ctx
		out[i] = Moved{OK: true, Current: ms[i].To}
		changes, changed = append(changes, c), append(changed, i)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("move %d order(s): %w", n, err)
	}
	if len(changes) < n {
		var stay []uuid.UUID
		for i, m := range ms {
			if !out[i].OK {
				stay = append(stay, m.ID)
			}
		}
		rows, err := tx.Query(ctx, `
			SELECT o.order_id, o.status FROM unnest($1::uuid[]) AS v(id) JOIN orders o ON o.order_id = ANY(ARRAY[v.id])`, stay)
		if err != nil {
			return nil, fmt.Errorf("read status of %d order(s): %w", len(stay), err)
		}
		found := 0
		for rows.Next() {
			var id uuid.UUID
			var cur string
			if err := rows.Scan(&id, &cur); err != nil {
				rows.Close()
				return nil, fmt.Errorf("read status of %d order(s): %w", len(stay), err)
			}
			out[at[id]].Current = order.Status(cur)
			found++
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("read status of %d order(s): %w", len(stay), err)
		}
		if found < len(stay) {
			for _, id := range stay {
				if out[at[id]].Current == "" {
					return nil, fmt.Errorf("move order %s: %w", id, ErrNotFound)
				}
			}
		}
	}
	if len(changes) == 0 {
		return out, nil
	}
	events, err := RecordMany(ctx, tx, changes)
	if err != nil {
		return nil, err
	}
	for k, i := range changed {
		out[i].Event = events[k]
	}
	return out, nil
}

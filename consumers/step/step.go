// Package step defines what a pipeline step is, so that each step lives in
// a package of its own (consumers/inventory, consumers/payment, …) and the
// router in package consumers runs them all the same way.
//
// A step reads the events it names from a durable JetStream consumer named
// after the step. For every message the router decodes the event, skips a
// redelivery whose dedupe row exists, and calls Handle with a Commit. Handle
// may first do work outside any transaction (a call to the payment
// provider, which must be safe to repeat), then calls Commit once: Commit
// runs in ONE PostgreSQL transaction (which concurrent messages of the
// same step share: a group commit, see package consumers), inserts (step,
// message id) into processed_messages (ON CONFLICT DO NOTHING: zero rows
// means another delivery already did it, and Apply is not run), runs Apply
// (the effect and the order's conditional move), commits, and then
// publishes the outbox events that Apply returned. The message is acked
// only after Handle returns nil, so it is acked after the commit, never
// before.
//
// A step whose transactional work is better done for many messages at
// once has a Batch instead of an Apply per message: a step whose whole
// work is its transaction (inventory, confirm) has only a Batch, which the
// router runs on each batch of its group commit; a step that works outside
// the transaction first (payment) has a Prepare, which hands its decision
// to the Batch through a CommitIntent. Either way the dedupe rows, the
// commit and the ack after it are as above.
package step

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"orderpipe/shared/order"
	"orderpipe/shared/orderevent"
	"orderpipe/shared/orderstore"
	"orderpipe/shared/outbox"
)

// Message is one decoded delivery.
type Message struct {
	// ID is the dedupe id: the event's deterministic message id
	// (order, event, re-drive), the same for every delivery and every
	// republish of the same event whatever its Nats-Msg-Id.
	ID string
	// Subject is the NATS subject it came on.
	Subject string
	// Event is the decoded payload.
	Event orderevent.Event
	// Delivered is 1 on the first delivery, n on the n-th.
	Delivered int
	// Headers are the message's headers (first value of each).
	Headers map[string]string
	// Ctx is the delivery's context (its span, its logger), for a Batch
	// that runs on another context: the trace its events continue.
	Ctx context.Context
	// Intent is what a step's Prepare decided outside the transaction
	// (passed to its CommitIntent), for its Batch; nil for a message that
	// only needs its dedupe row.
	Intent any
}

// Apply is a step's effect. It runs inside the step's transaction, after
// the dedupe row was inserted, and returns the outbox rows it wrote (the
// Event of orderstore.Transition's Moved) to publish right after the
// commit.
//
// The transaction may be shared with other messages of the same step (the
// router's group commit), and when it fails Apply runs once more, alone, in
// a transaction of its own: an Apply must use only tx for its effects and
// keep no state across runs (a variable it sets must be set afresh on each
// run).
type Apply func(ctx context.Context, tx pgx.Tx) (publish []outbox.Row, err error)

// Commit runs apply in one transaction with the dedupe row, commits, and
// publishes. done is false when the dedupe row already existed (another
// delivery did the work; apply was not run).
type Commit func(ctx context.Context, apply Apply) (done bool, err error)

// CommitIntent hands a message's intent (what the step's Prepare decided
// outside the transaction; nil: nothing to write but the dedupe row) to
// the step's Batch, which runs it with the other messages of its batch in
// one transaction, commits and publishes; done and the error as in Commit.
// When the batch fails, the message's Batch runs again alone, and err is
// that run's error.
type CommitIntent func(ctx context.Context, intent any) (done bool, err error)

// Batch is the whole work of a step whose work is its transaction: the
// effect for many messages at once, set-based, in one transaction after
// their dedupe rows. ms are the batch's fresh messages in the order they
// came (two of them may name the same order: a redelivery beside a
// re-drive); it returns the outbox rows to publish after the commit. An
// error fails the batch, which then runs again one message at a time, so
// that an error (a permanent one, say) belongs to one message.
type Batch func(ctx context.Context, tx pgx.Tx, ms []Message) (publish []outbox.Row, err error)

// Step is one pipeline step.
type Step struct {
	// Name is the durable consumer's name and the consumer column of
	// processed_messages. Letters, digits, '-' and '_' only.
	Name string
	// Events are the events the step reads.
	Events []orderevent.Name
	// Handle processes one message and calls commit at most once. An
	// error marked Permanent (or a malformed event, an impossible
	// transition) dead-letters the message; any other error is retried.
	Handle func(ctx context.Context, m Message, commit Commit) error
	// Batch, instead of Handle, is a step whose whole work is its
	// transaction: the router runs it on the batches of its group commit.
	Batch Batch
	// Prepare, with Batch, is a step that works outside the transaction
	// first (a provider call) and then hands its decision to Batch through
	// commit (at most one successful call): Handle's two parts, the
	// transactional one set-based.
	Prepare func(ctx context.Context, m Message, commit CommitIntent) error
}

// BatchStep is a step whose whole work is its transaction, done for a
// batch of messages at once.
func BatchStep(name string, events []orderevent.Name, batch Batch) Step {
	return Step{Name: name, Events: events, Batch: batch}
}

// FirstPerOrder returns, of a batch's messages, the first one of each
// order, in the order they came: a later message of the same order finds
// the order moved on by the first, and has nothing to do.
func FirstPerOrder(ms []Message) []Message {
	seen := make(map[uuid.UUID]bool, len(ms))
	var out []Message
	for _, m := range ms {
		if !seen[m.Event.OrderID] {
			seen[m.Event.OrderID] = true
			out = append(out, m)
		}
	}
	return out
}

// Published returns the outbox rows of the moves that happened, for a
// step to return to the router: Published(orderstore.TransitionMany(…)).
func Published(ms []orderstore.Moved, err error) ([]outbox.Row, error) {
	if err != nil {
		return nil, err
	}
	var rows []outbox.Row
	for _, m := range ms {
		if m.OK {
			rows = append(rows, m.Event)
		}
	}
	return rows, nil
}

// OrderIDs returns the orders of ms.
func OrderIDs(ms []Message) []uuid.UUID {
	out := make([]uuid.UUID, len(ms))
	for i, m := range ms {
		out[i] = m.Event.OrderID
	}
	return out
}

type permanent struct{ err error }

func (p permanent) Error() string { return p.err.Error() }
func (p permanent) Unwrap() error { return p.err }

// Permanent marks err as one that no retry can fix: the message goes to
// the dead letters at once.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanent{err}
}

// IsPermanent reports whether err can never succeed on a retry: marked
// Permanent, a malformed or unknown event, an impossible transition, a
// missing order, or a panic in the handler.
func IsPermanent(err error) bool {
	var p permanent
	var panicked middleware.RecoveredPanicError
	return errors.As(err, &p) ||
		errors.Is(err, orderevent.ErrMalformed) ||
		errors.Is(err, order.ErrInvalidTransition) ||
		errors.Is(err, orderstore.ErrNotFound) ||
		errors.As(err, &panicked)
}

// Locked is an order as LockOrders read it.
type Locked struct {
	Status order.Status
	// Items is the order's items as stored (JSON).
	Items []byte
}

// LockOrders reads the orders of ms and locks their rows until the
// transaction ends, all in one statement and in order id order (so that
// two batches never lock each other's orders in a cycle), so that the step
// decides on statuses nobody can change under it. A missing order is
// orderstore.ErrNotFound (a permanent error). The join on "= ANY(ARRAY[…])"
// keeps it on the primary key in any cached plan (see postgres.DB).
func LockOrders(ctx context.Context, tx pgx.Tx, ms []Message) (map[uuid.UUID]Locked, error) {
	rows, err := tx.Query(ctx, `
		SELECT o.order_id, o.status, o.items
		FROM (SELECT DISTINCT unnest($1::uuid[])) AS k(id) JOIN orders o ON o.order_id = ANY(ARRAY[k.id])
		ORDER BY o.order_id FOR UPDATE OF o`, OrderIDs(ms))
	if err != nil {
		return nil, fmt.Errorf("lock %d order(s): %w", len(ms), err)
	}
	got := make(map[uuid.UUID]Locked, len(ms))
	for rows.Next() {
		var id uuid.UUID
		var l Locked
		if err := rows.Scan(&id, &l.Status, &l.Items); err != nil {
			rows.Close()
			return nil, fmt.Errorf("lock %d order(s): %w", len(ms), err)
		}
		got[id] = l
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("lock %d order(s): %w", len(ms), err)
	}
	for _, m := range ms {
		if _, ok := got[m.Event.OrderID]; !ok {
			return nil, fmt.Errorf("lock order %s: %w", m.Event.OrderID, orderstore.ErrNotFound)
		}
	}
	return got, nil
}

package compensator_test

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"orderpipe/compensator"
	"orderpipe/shared/natsjs"
	"orderpipe/shared/order"
	"orderpipe/shared/tooling/testenv"
)

// healed waits until the stream holds a healed copy of each order's event.
func (w *world) healed(ids ...uuid.UUID) {
	w.t.Helper()
	testenv.WaitFor(w.t, 10*time.Second, "the healed events in the stream", func() bool {
		for _, id := range ids {
			if !slices.ContainsFunc(w.msgIDs(id), func(m string) bool { return strings.Contains(m, ":heal") }) {
				return false
			}
		}
		return true
	})
}

// TestHealAStreamCreatedAfterTheEvents: the ORDERS stream is deleted and
// made anew (a broker that lost its store looks the same). Open orders
// whose last event was published into the old stream are published again
// on the next pass — long before their stuck deadline — and not counted
// as re-drives; orders that move on are left alone.
func TestHealAStreamCreatedAfterTheEvents(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ids := []uuid.UUID{
		w.newOrder(spec{status: order.StatusProcessing}),
		w.newOrder(spec{status: order.StatusReserved, lines: map[string]int{"SKU-1": 1}}),
		w.newOrder(spec{status: order.StatusPaid, lines: map[string]int{"SKU-1": 1}, payment: "succeeded"}),
	}
	done := w.newOrder(spec{status: order.StatusCancelled, lines: map[string]int{"SKU-2": 1}})
	c := w.comp(w.cfg(3), w.psp) // one-minute deadlines: nothing here is stuck
	if res := w.pass(c); res.Healed != 0 {
		t.Fatalf("healed with the stream intact: %+v", res.Actions)
	}
	if err := w.nats.JS.DeleteStream(t.Context(), w.nats.Topology.Stream); err != nil {
		t.Fatal(err)
	}
	if _, err := natsjs.EnsureStream(t.Context(), w.nats.JS, w.nats.Topology, 1); err != nil {
		t.Fatal(err)
	}
	res := w.pass(c)
	if res.Healed != len(ids) || res.Redriven != 0 || res.Unwound != 0 {
		t.Fatalf("after the stream was re-created: %s\n%+v", res.Summary(), res.Actions)
	}
	w.healed(ids...)
	if n := w.int(`SELECT coalesce(sum(redrive_attempts), 0) FROM orders`); n != 0 {
		t.Fatalf("%d re-drive attempts counted for healed events", n)
	}
	if msgs := w.msgIDs(done); len(msgs) != 0 {
		t.Fatalf("a terminal order's event was published again: %v", msgs)
	}
	if res := w.pass(c); res.Healed != 0 {
		t.Fatalf("healed again though the copies are in the stream: %+v", res.Actions)
	}
	if n := w.int(`SELECT count(*) FROM compensator_actions WHERE action = 'heal'`); n != len(ids) {
		t.Fatalf("%d heal actions recorded, want %d", n, len(ids))
	}
	w.holdsTheContract()
}

// TestAHealedOrderIsNotUnwoundForTheLoss: an order past its deadline
// after its last re-drive, whose event the broker lost (the stream made
// anew). The pass heals it and does not unwind it: the consumers never had
// that event, and its deadline starts again at the copy. A deadline after
// the copy, it is unwound as usual.
func TestAHealedOrderIsNotUnwoundForTheLoss(t *testing.T) {
	t.Parallel()
	w, id := newWorldWithOrder(t, spec{status: order.StatusReserved, lines: map[string]int{"SKU-1": 1}})
	w.exec(`UPDATE orders SET redrive_attempts = 3, redrive_status = 'reserved', redriven_at = now() WHERE order_id = $1`, id)
	c := w.comp(w.cfg(3), w.psp)
	if err := w.nats.JS.DeleteStream(t.Context(), w.nats.Topology.Stream); err != nil {
		t.Fatal(err)
	}
	if _, err := natsjs.EnsureStream(t.Context(), w.nats.JS, w.nats.Topology, 1); err != nil {
		t.Fatal(err)
	}
	w.age(id)
	res := w.pass(c)
	if res.Healed != 1 || res.Unwound != 0 || w.status(id) != order.StatusReserved {
		t.Fatalf("an order whose last event the broker lost: %s, status %s; want healed, not unwound\n%+v", res.Summary(), w.status(id), res.Actions)
	}
	w.healed(id)
	w.age(id)
	if res := w.pass(c); res.Unwound != 1 || w.status(id) != order.StatusCancelled {
		t.Fatalf("a deadline after the copy: %s, status %s; want unwound", res.Summary(), w.status(id))
	}
}

// TestHealEventsGoneFromTheStream: the stream is purged (the sequences fall
// below its first one), and one message is deleted from the middle of a
// stream that keeps the others: each order whose last event is gone is
// healed; the one whose event is still there is not.
func TestHealEventsGoneFromTheStream(t *testing.T) {
	t.Parallel()
	w, purged := newWorldWithOrder(t, spec{status: order.StatusReserved, lines: map[string]int{"SKU-1": 1}})
	s, err := w.nats.JS.Stream(t.Context(), w.nats.Topology.Stream)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Purge(t.Context()); err != nil {
		t.Fatal(err)
	}
	deleted := w.newOrder(spec{status: order.StatusProcessing})
	kept := w.newOrder(spec{status: order.StatusProcessing})
	w.deleteEvent(deleted)
	res := w.pass(w.comp(w.cfg(3), w.psp))
	var healed []uuid.UUID
	for _, a := range res.Actions {
		if a.Kind == "heal" {
			healed = append(healed, a.OrderID)
		}
	}
	if len(healed) != 2 || !slices.Contains(healed, purged) || !slices.Contains(healed, deleted) {
		t.Fatalf("healed %v, want the purged %s and the deleted %s (not %s)\n%+v", healed, purged, deleted, kept, res.Actions)
	}
	w.healed(purged, deleted)
	w.holdsTheContract()
}

// TestHealReadsPastABatchOfHeldEvents: once the stream has a deleted
// message, every idle open order is a candidate, and the broker is asked
// about each. A batch whose candidates' events are all still held must not
// end the search: the lost event of an order further on is healed in the
// same pass. Before, every pass asked about the same first batch, and an
// order past it was never healed.
func TestHealReadsPastABatchOfHeldEvents(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	var held []uuid.UUID
	for range 5 {
		held = append(held, w.newOrder(spec{status: order.StatusProcessing}))
	}
	lost := w.newOrder(spec{status: order.StatusProcessing})
	held = append(held, w.newOrder(spec{status: order.StatusProcessing})) // after it: its deletion is inside the stream
	w.deleteEvent(lost)
	cfg := w.cfg(3)
	cfg.BatchSize = 2
	res := w.pass(w.comp(cfg, w.psp))
	if res.Healed != 1 || len(res.Actions) != 1 || res.Actions[0].OrderID != lost {
		t.Fatalf("healed %d: %+v; want only %s, whose event was deleted", res.Healed, res.Actions, lost)
	}
	w.healed(lost)
	if msgs := w.msgIDs(held[0]); len(msgs) != 1 {
		t.Fatalf("an order whose event is held was published again: %v", msgs)
	}
}

// TestHealHoldsNoLockWhileItAsksTheBroker: in a stream with a deleted
// message, heal asks the broker about each idle open order's last event
// (up to 5 s each when the broker is slow). Before, it asked holding FOR
// UPDATE on its whole batch of candidates, so a consumer's step or another
// compensator phase that needed one of those orders waited for every
// lookup. No candidate's row may be locked while the broker is asked, and
// the lost event is still healed.
func TestHealHoldsNoLockWhileItAsksTheBroker(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ids := []uuid.UUID{w.newOrder(spec{status: order.StatusProcessing}), w.newOrder(spec{status: order.StatusReserved, lines: map[string]int{"SKU-1": 1}})}
	lost := w.newOrder(spec{status: order.StatusProcessing})
	ids = append(ids, lost, w.newOrder(spec{status: order.StatusProcessing})) // after it: its deletion is inside the stream
	w.deleteEvent(lost)
	c := w.comp(w.cfg(3), w.psp)
	var (
		mu      sync.Mutex
		lookups int
		locked  []string
	)
	compensator.SetLookupHook(c, func(id uuid.UUID) {
		// What a step does to its order: take the row, here without waiting.
		err := pgx.BeginFunc(t.Context(), w.db.Pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(t.Context(), `SELECT order_id FROM orders WHERE order_id = ANY($1) FOR UPDATE NOWAIT`, ids)
			return err
		})
		mu.Lock()
		defer mu.Unlock()
		lookups++
		if err != nil {
			locked = append(locked, fmt.Sprintf("asking about %s: %v", id, err))
		}
	})
	res := w.pass(c)
	mu.Lock()
	defer mu.Unlock()
	if lookups == 0 {
		t.Fatal("heal asked the broker about no order; the test proves nothing")
	}
	if len(locked) > 0 {
		t.Fatalf("the candidates' rows were locked while the broker was asked:\n%s", strings.Join(locked, "\n"))
	}
	if res.Healed != 1 || len(res.Actions) != 1 || res.Actions[0].OrderID != lost {
		t.Fatalf("healed %d: %+v; want only %s, whose event was deleted", res.Healed, res.Actions, lost)
	}
	w.healed(lost)
}

// TestHealLeavesAnOrderThatMovedOnWhileTheBrokerWasAsked: the candidates
// are read and the broker asked without a lock, so an order may move on
// meanwhile: here another compensator's heal wrote its copy of the lost
// event. The pass locks the order, sees that its last event is no longer
// the one it found lost, and writes no second copy.
func TestHealLeavesAnOrderThatMovedOnWhileTheBrokerWasAsked(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.newOrder(spec{status: order.StatusProcessing}) // before and after it: its deletion is inside the stream
	lost := w.newOrder(spec{status: order.StatusProcessing})
	w.newOrder(spec{status: order.StatusProcessing})
	w.deleteEvent(lost)
	c := w.comp(w.cfg(3), w.psp)
	asked := false
	compensator.SetLookupHook(c, func(id uuid.UUID) {
		if id == lost {
			asked = true
			w.exec(`INSERT INTO outbox (msg_id, event, payload, headers, order_id)
				SELECT msg_id || ':heal0', event, payload, headers, order_id FROM outbox WHERE order_id = $1 ORDER BY id DESC LIMIT 1`, lost)
		}
	})
	res := w.pass(c)
	if !asked {
		t.Fatal("the broker was not asked about the lost event; the test proves nothing")
	}
	if res.Healed != 0 {
		t.Fatalf("healed %d: %+v; the order's lost event had been copied already", res.Healed, res.Actions)
	}
	if n := w.int(`SELECT count(*) FROM outbox WHERE order_id = $1 AND msg_id LIKE '%:heal%'`, lost); n != 1 {
		t.Fatalf("%d copies of the lost event, want the other compensator's only", n)
	}
}

// Package payment is the payment step: on orders.reserved it charges the
// order through the payment provider (shared/psp) with the Idempotency-Key
// payments.ChargeKey, the same for every retry, and then, in the step's
// transaction, records the answer (shared/payments) and moves the order:
// succeeded → paid; declined → stock released → cancelled with the reason.
// A transient failure (409, 5xx, timeout) is retried with the same key, so
// an order is never charged twice. A permanent refusal (a 4xx other than
// 402 and 409, or 410 for a key voided meanwhile) is no dead end: the key is
// voided, the stock released and the order cancelled with the provider's
// reason, so the client hears of it.
//
// Before the provider is called the payment is recorded as pending: whoever
// finds a pending payment knows that a charge may exist under its key. The
// concurrent messages' first steps (read the order, record its pending
// payment) share one statement (payments.PendingMany). The
// provider call happens outside any transaction (it may be slow; the router
// keeps the message alive with in-progress acks meanwhile).
//
// Several deliveries may charge the same order at once (the original
// message, a compensator re-drive, a dead-letter replay: each with a dedupe
// id of its own). They all get the provider's one answer for the key; the
// first to commit moves the order, and the others, finding it paid or
// further, record their dedupe row and do nothing else. Only an order that
// was cancelled or rejected meanwhile gives its charge back
// (payments.Settle).
package payment

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"orderpipe/consumers/step"
	"orderpipe/shared/failpoint"
	"orderpipe/shared/groupcommit"
	"orderpipe/shared/order"
	"orderpipe/shared/orderevent"
	"orderpipe/shared/orderstore"
	"orderpipe/shared/outbox"
	"orderpipe/shared/payments"
	"orderpipe/shared/psp"
	"orderpipe/shared/stock"
)

// Name is the step's durable consumer name.
const Name = "payment"

// FailAfterCharge fires after the provider answered a charge and before
// the answer is recorded.
const FailAfterCharge = "payment.after-charge"

// Step returns the payment step.
func Step(pool *pgxpool.Pool, client *psp.Client) step.Step {
	p := &paymentStep{pool: pool, psp: client}
	p.reads = groupcommit.Queue[*readJob]{Flush: p.read, MaxBatch: maxReadBatch, Flushers: readFlushers}
	return step.Step{Name: Name, Events: []orderevent.Name{orderevent.Reserved}, Prepare: p.handle, Batch: p.record}
}

type paymentStep struct {
	pool *pgxpool.Pool
	psp  *psp.Client
	// reads batches the first thing each message does (read its order,
	// record its pending payment) over the concurrent messages: one
	// statement for many (payments.PendingMany).
	reads groupcommit.Queue[*readJob]
}

// The batched reads: at most maxReadBatch orders in one statement, at most
// readFlushers statements at once.
const (
	maxReadBatch = 64
	readFlushers = 2
)

// readJob is one message's read: its order, and where its answer goes.
type readJob struct {
	id   uuid.UUID
	done chan readResult
}

type readResult struct {
	due   payments.Due
	found bool
	err   error
}

// read is the reads' flush: one statement for the batch's orders. It runs
// on its own context (the messages' contexts end with their handlers, and
// a read is short), bounded by readTimeout.
func (p *paymentStep) read(batch []*readJob) {
	ctx, cancel := context.WithTimeout(context.Background(), readTimeout)
	defer cancel()
	ids := make([]uuid.UUID, len(batch))
	for i, j := range batch {
		ids[i] = j.id
	}
	due, err := payments.PendingMany(ctx, p.pool, ids, string(order.StatusReserved))
	for _, j := range batch {
		d, ok := due[j.id]
		j.done <- readResult{due: d, found: ok, err: err}
	}
}

// readTimeout bounds one batched read.
const readTimeout = 30 * time.Second

// due reads the order of a message and records its pending payment if it
// is reserved, in the step's next batched read.
func (p *paymentStep) due(ctx context.Context, id uuid.UUID) (payments.Due, error) {
	j := &readJob{id: id, done: make(chan readResult, 1)}
	p.reads.Add(j)
	select {
	case r := <-j.done:
		switch {
		case r.err != nil:
			return payments.Due{}, fmt.Errorf("read order %s: %w", id, r.err)
		case !r.found:
			return payments.Due{}, step.Permanent(fmt.Errorf("charge order %s: %w", id, orderstore.ErrNotFound))
		}
		return r.due, nil
	case <-ctx.Done():
		return payments.Due{}, fmt.Errorf("read order %s: %w", id, ctx.Err())
	}
}

var errOrderCancelled = errors.New("order was cancelled while it was being charged")

// gaveUp reports whether an order in status s will never be paid: what its
// payment holds must be given back.
func gaveUp(s order.Status) bool { return s == order.StatusCancelled || s == order.StatusRejected }

// charged is one message's intent: the provider's answer for the order's
// charge key, to record in the batch; cancelled is the batch's outcome.
type charged struct {
	ans     psp.Answer
	refusal string // the provider refused the charge for good (the key was voided)
	// cancelled is set by record when it cancelled the order (declined,
	// or refused); it is set afresh on every run of record.
	cancelled bool
}

func (p *paymentStep) handle(ctx context.Context, m step.Message, commit step.CommitIntent) error {
	id := m.Event.OrderID
	d, err := p.due(ctx, id)
	if err != nil {
		return err
	}
	amount, currency := d.Amount, d.Currency
	if s := order.Status(d.Status); s != order.StatusReserved {
		// A late or repeated message. An earlier delivery may have charged
		// before dying: if the order was given up, settle that charge.
		if gaveUp(s) {
			if _, err := payments.Settle(ctx, p.pool, p.psp, id); err != nil {
				return err
			}
		}
		_, err := commit(ctx, nil)
		return err
	}
	// The read recorded the pending payment: the charge may go out.
	ans, err := p.psp.Charge(ctx, payments.ChargeKey(id), amount, currency, id.String())
	refusal := ""
	switch {
	case err == nil:
	case psp.IsTransient(err):
		return fmt.Errorf("charge order %s: %w", id, err)
	default:
		// Refused for good. Void the key (it never charges; if the key
		// did charge after all, its answer comes back and is settled).
		refusal = "payment refused by the provider: " + refusalText(err)
		ans, err = p.psp.Void(ctx, payments.ChargeKey(id), id.String())
		if err != nil {
			if psp.IsTransient(err) {
				return fmt.Errorf("void the refused charge of order %s: %w", id, err)
			}
			return step.Permanent(fmt.Errorf("void the refused charge of order %s: %w", id, err))
		}
		if ans.Status == psp.StatusVoided {
			ans.Reason = refusal
		}
	}
	if err := failpoint.Inject(FailAfterCharge); err != nil {
		return err
	}
	c := &charged{ans: ans, refusal: refusal}
	_, err = commit(ctx, c)
	switch {
	case errors.Is(err, errOrderCancelled):
		// The compensator cancelled the order meanwhile: our charge must
		// not stay. Record it, settle it, then mark the message done.
		if err := payments.Record(ctx, p.pool, id, ans); err != nil {
			return err
		}
		if _, err := payments.Settle(ctx, p.pool, p.psp, id); err != nil {
			return err
		}
		_, err = commit(ctx, nil)
		return err
	case err == nil && c.cancelled && ans.Status == psp.StatusSucceeded:
		// Refused, yet the key had charged: the order was cancelled with
		// the refusal, so the charge goes back. If this fails, the
		// compensator's refund pass repeats it (orderpipe_refunds_due
		// counts it meanwhile): a redelivery of this message finds its
		// dedupe row, committed above, and does not run again.
		_, err = payments.Settle(ctx, p.pool, p.psp, id)
		return err
	}
	return err
}

// record is the step's transaction for a batch of charged orders, in a
// few statements whatever the batch's size: it locks the orders (in id
// order), and for each order still reserved records the provider's answer
// and moves it — succeeded: to paid; declined or refused: its stock is
// given back and it is cancelled with the reason. An order that another
// delivery (the original, a re-drive, a replay) moved on with the same
// charge is left alone: only its dedupe row is written. An order that was
// cancelled or rejected meanwhile fails the batch with errOrderCancelled,
// so that alone its message settles the charge.
func (p *paymentStep) record(ctx context.Context, tx pgx.Tx, ms []step.Message) ([]outbox.Row, error) {
	var todo []step.Message
	for _, m := range ms {
		if c, ok := m.Intent.(*charged); ok {
			c.cancelled = false // record may run twice (step.Batch); only its last run counts
			todo = append(todo, m)
		}
	}
	todo = step.FirstPerOrder(todo)
	if len(todo) == 0 {
		return nil, nil
	}
	locked, err := step.LockOrders(ctx, tx, todo)
	if err != nil {
		return nil, err
	}
	var (
		ids      []uuid.UUID
		answers  []psp.Answer
		moves    []orderstore.Move
		released []stock.Line
	)
	for _, m := range todo {
		id, c := m.Event.OrderID, m.Intent.(*charged)
		switch st := locked[id].Status; {
		case st == order.StatusReserved:
		case gaveUp(st):
			return nil, fmt.Errorf("order %s: %w", id, errOrderCancelled)
		default:
			// Another delivery got there first with the same charge: the
			// order went through. Record the dedupe row and nothing else.
			continue
		}
		ids, answers = append(ids, id), append(answers, c.ans)
		if c.ans.Status == psp.StatusSucceeded && c.refusal == "" {
			moves = append(moves, orderstore.Move{Ctx: m.Ctx, ID: id, From: order.StatusReserved, To: order.StatusPaid})
			continue
		}
		ls, err := stock.Unreserve(ctx, tx, id)
		if err != nil {
			return nil, err
		}
		released = append(released, ls...)
		reason := c.refusal
		if reason == "" || c.ans.Status == psp.StatusDeclined {
			reason = "payment declined: " + c.ans.Reason
		}
		moves = append(moves, orderstore.Move{Ctx: m.Ctx, ID: id, From: order.StatusReserved, To: order.StatusCancelled, Reason: reason})
		c.cancelled = true
	}
	if len(ids) == 0 {
		return nil, nil
	}
	if err := payments.RecordMany(ctx, tx, ids, answers); err != nil {
		return nil, err
	}
	if err := stock.Restock(ctx, tx, released); err != nil {
		return nil, err
	}
	return step.Published(orderstore.TransitionMany(ctx, tx, moves))
}

// refusalText is the provider's reason for a permanent refusal.
func refusalText(err error) string {
	var pe *psp.Error
	if !errors.As(err, &pe) {
		return err.Error()
	}
	if psp.IsVoided(err) {
		return "the charge was voided"
	}
	if pe.Msg != "" {
		return fmt.Sprintf("%s (%d)", pe.Msg, pe.HTTPStatus)
	}
	return fmt.Sprintf("HTTP %d", pe.HTTPStatus)
}

package compensator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"orderpipe/shared/order"
	"orderpipe/shared/postgres"
)

// KindHeal is the action of publishing again an open order's last event
// that the broker no longer holds.
const KindHeal Kind = "heal"

// lostEvent is an open order whose last published event the broker lost.
type lostEvent struct {
	OrderID   uuid.UUID
	ClientID  uuid.UUID
	RequestID string
	Status    order.Status
	OutboxID  int64
	MsgID     string
	Seq       int64
	Why       string
}

// streamView is what the pass read of the stream: the event sequences it
// holds and when it was created.
type streamView struct {
	first, last uint64
	created     time.Time
	deleted     uint64
	stream      jetstream.Stream
	// before: only events published before it are judged.
	before time.Time
}

func (c *Compensator) viewStream(ctx context.Context) (streamView, error) {
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	s, err := c.relay.JS.Stream(sctx, c.relay.Topology.Stream)
	if err != nil {
		return streamView{}, fmt.Errorf("%w: stream %s: %w", ErrBrokerUnavailable, c.relay.Topology.Stream, err)
	}
	info, err := s.Info(sctx)
	if err != nil {
		return streamView{}, fmt.Errorf("%w: stream %s: %w", ErrBrokerUnavailable, c.relay.Topology.Stream, err)
	}
	return streamView{first: info.State.FirstSeq, last: info.State.LastSeq, created: info.Created, deleted: uint64(info.State.NumDeleted), stream: s}, nil
}

// heal finds open orders whose last event the broker no longer holds — the
// stream was created after the event was published (deleted and made
// anew, or a broker that lost its store), or the event's sequence is
// outside what the stream holds or was deleted from it — and publishes that
// event again, at once, without waiting for the stuck deadline.
//
// The copy carries the same payload, hence the same dedupe id at the
// consumers (a step that did run ignores it), under a Nats-Msg-Id of its
// own ("<msg id>:heal<n>") so that the duplicate window does not drop it.
// It is not a re-drive attempt, and the order's stuck deadline starts
// again at the copy: an order is never unwound because the broker lost
// its events.
func (c *Compensator) heal(ctx context.Context, res *Result) error {
	if c.relay == nil || c.relay.JS == nil {
		return nil
	}
	// Batch after batch, in order id order: a wiped broker loses the
	// events of every order in flight at once, and a stream with a deleted
	// message makes every idle open order a candidate, most of whose events
	// it still holds. A batch of candidates moves the cursor on whatever it
	// healed; a pass stops at its bound and the next goes on from there.
	c.healMu.Lock()
	defer c.healMu.Unlock()
	for range c.cfg.RepublishRounds {
		read, last, err := c.healBatch(ctx, res, c.healFrom)
		if err != nil {
			return err
		}
		if read < c.cfg.BatchSize {
			c.healFrom = uuid.Nil
			return nil
		}
		c.healFrom = last
		if ctx.Err() != nil {
			return nil
		}
	}
	return nil
}

// healBatch heals the lost events of up to one batch of candidates after
// the order id from, and returns how many candidates it read and the last
// one's order id.
func (c *Compensator) healBatch(ctx context.Context, res *Result, from uuid.UUID) (int, uuid.UUID, error) {
	// Only events stamped before the view is read are judged by it: their
	// acks came before, so the stream must hold them (another
	// compensator's or relay's publish racing this pass is not "lost").
	var before time.Time
	if err := c.pool.QueryRow(ctx, `SELECT now()`).Scan(&before); err != nil {
		return 0, uuid.Nil, fmt.Errorf("heal events the broker lost: %w", err)
	}
	view, err := c.viewStream(ctx)
	if err != nil {
		return 0, uuid.Nil, err
	}
	view.before = before
	// The candidates are read and the broker asked without a lock: a
	// lookup may take seconds, and a step or another phase that needs one
	// of these orders must not wait for them. The lost ones are then
	// locked and checked again: one that moved on meanwhile (a step, or
	// another compensator's heal, published a later event) is left alone.
	lost, read, last, err := c.selectLost(ctx, c.pool, view, from)
	if err != nil {
		return 0, uuid.Nil, err
	}
	if len(lost) == 0 {
		return read, last, nil
	}
	var actions []Action
	var outboxIDs []int64
	err = pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		still, err := c.lockLost(ctx, tx, lost)
		if err != nil {
			return err
		}
		for _, l := range still {
			newID := healMsgID(l.MsgID, l.OutboxID)
			var oid int64
			if err := tx.QueryRow(ctx, `
				INSERT INTO outbox (msg_id, event, payload, headers, order_id)
				SELECT $2, event, payload, headers, order_id FROM outbox WHERE id = $1
				RETURNING id`, l.OutboxID, newID).Scan(&oid); err != nil {
				return fmt.Errorf("publish again the lost event %s of order %s: %w", l.MsgID, l.OrderID, err)
			}
			// The consumers get the event only now: the order's deadline
			// starts again (no attempt counted), so it is never unwound
			// for the loss.
			if _, err := tx.Exec(ctx, `UPDATE orders SET redriven_at = now() WHERE order_id = $1`, l.OrderID); err != nil {
				return fmt.Errorf("restart the deadline of healed order %s: %w", l.OrderID, err)
			}
			a := Action{OrderID: l.OrderID, ClientID: l.ClientID, RequestID: l.RequestID, Kind: KindHeal, From: l.Status,
				Reason: fmt.Sprintf("the broker no longer holds %s (stream sequence %d: %s); published again as %s", l.MsgID, l.Seq, l.Why, newID)}
			if err := c.record(ctx, tx, a); err != nil {
				return err
			}
			actions, outboxIDs = append(actions, a), append(outboxIDs, oid)
		}
		return nil
	})
	if err != nil {
		return 0, uuid.Nil, fmt.Errorf("heal events the broker lost: %w", err)
	}
	for _, a := range actions {
		c.taken(a, res)
	}
	if err := c.relay.Publish(ctx, outboxIDs...); err != nil {
		c.logger.Warn("publish healed events; they stay in the outbox", slog.Any("error", err))
		return read, last, err
	}
	return read, last, nil
}

// healMsgID is the Nats-Msg-Id of the copy of a lost event (the row
// outboxID, message id msgID).
func healMsgID(msgID string, outboxID int64) string {
	if i := strings.Index(msgID, ":heal"); i >= 0 {
		msgID = msgID[:i]
	}
	return fmt.Sprintf("%s:heal%d", msgID, outboxID)
}

// selectLost reads, without locking them, up to a batch of candidates
// after the order id from: open orders, idle for longer than the heal
// minimum age, whose last published event the stream may not hold. It
// returns those whose event it does not hold, how many candidates it
// read, and the last one's order id.
func (c *Compensator) selectLost(ctx context.Context, db postgres.DB, view streamView, from uuid.UUID) ([]lostEvent, int, uuid.UUID, error) {
	rows, err := db.Query(ctx, `
		SELECT o.order_id, o.client_id, o.request_id, o.status, x.id, x.msg_id, x.stream_seq,
		       x.published_at < $2 AS before_stream
		FROM orders o
		JOIN LATERAL (SELECT id, msg_id, stream_seq, published_at FROM outbox
		              WHERE order_id = o.order_id ORDER BY id DESC LIMIT 1) x ON true
		WHERE o.status IN ('processing', 'reserved', 'paid')
		  AND greatest(o.updated_at, coalesce(o.redriven_at, o.updated_at)) < now() - make_interval(secs => $1::float8)
		  AND x.published_at IS NOT NULL AND x.stream_seq IS NOT NULL AND x.published_at < $7
		  AND (x.published_at < $2 OR x.stream_seq < $3 OR x.stream_seq > $4 OR $5)
		  AND o.order_id > $8
		ORDER BY o.order_id
		LIMIT $6`,
		c.cfg.HealMinAge.Seconds(), view.created, int64(view.first), int64(view.last), view.deleted > 0, c.cfg.BatchSize, view.before, from)
	if err != nil {
		return nil, 0, uuid.Nil, fmt.Errorf("select open orders whose last event the broker lost: %w", err)
	}
	type cand struct {
		lostEvent
		beforeStream bool
	}
	cands, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (cand, error) {
		var x cand
		var status string
		err := r.Scan(&x.OrderID, &x.ClientID, &x.RequestID, &status, &x.OutboxID, &x.MsgID, &x.Seq, &x.beforeStream)
		x.Status = order.Status(status)
		return x, err
	})
	if err != nil {
		return nil, 0, uuid.Nil, fmt.Errorf("select open orders whose last event the broker lost: %w", err)
	}
	last := uuid.Nil
	if len(cands) > 0 {
		last = cands[len(cands)-1].OrderID
	}
	var out []lostEvent
	for _, x := range cands {
		switch {
		case x.beforeStream:
			x.Why = "the stream was created after it was published, at " + view.created.UTC().Format(time.RFC3339)
		case uint64(x.Seq) < view.first || uint64(x.Seq) > view.last:
			x.Why = fmt.Sprintf("the stream holds %d to %d", view.first, view.last)
		default:
			// Inside the range of a stream with deleted messages: ask.
			if c.lookupHook != nil {
				c.lookupHook(x.OrderID)
			}
			gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			m, err := view.stream.GetMsg(gctx, uint64(x.Seq))
			cancel()
			switch {
			case errors.Is(err, jetstream.ErrMsgNotFound):
				x.Why = "deleted from the stream"
			case err != nil:
				return nil, 0, uuid.Nil, fmt.Errorf("%w: read stream sequence %d: %w", ErrBrokerUnavailable, x.Seq, err)
			case m.Header.Get("Nats-Msg-Id") != x.MsgID:
				x.Why = "another message holds that sequence now"
			default:
				continue // still there
			}
		}
		out = append(out, x.lostEvent)
	}
	return out, len(cands), last, nil
}

// lockLost locks (SKIP LOCKED) the orders of lost, read before without a
// lock, and returns those still to heal: still open and idle, and whose
// last event is still the one found lost. The check reads after the lock,
// in a statement of its own, so that it sees whatever committed before
// the lock was taken (a step's next event, another compensator's copy).
func (c *Compensator) lockLost(ctx context.Context, tx pgx.Tx, lost []lostEvent) ([]lostEvent, error) {
	ids := make([]uuid.UUID, len(lost))
	for i, l := range lost {
		ids[i] = l.OrderID
	}
	rows, err := tx.Query(ctx, `
		SELECT order_id FROM orders WHERE order_id = ANY($1)
		ORDER BY order_id FOR UPDATE SKIP LOCKED`, ids)
	if err != nil {
		return nil, fmt.Errorf("lock the orders whose event the broker lost: %w", err)
	}
	locked, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return nil, fmt.Errorf("lock the orders whose event the broker lost: %w", err)
	}
	if len(locked) == 0 {
		return nil, nil
	}
	rows, err = tx.Query(ctx, `
		SELECT o.order_id, o.status, x.id
		FROM orders o
		JOIN LATERAL (SELECT id FROM outbox WHERE order_id = o.order_id ORDER BY id DESC LIMIT 1) x ON true
		WHERE o.order_id = ANY($1) AND o.status IN ('processing', 'reserved', 'paid')
		  AND greatest(o.updated_at, coalesce(o.redriven_at, o.updated_at)) < now() - make_interval(secs => $2::float8)`,
		locked, c.cfg.HealMinAge.Seconds())
	if err != nil {
		return nil, fmt.Errorf("check the orders whose event the broker lost: %w", err)
	}
	type state struct {
		status   string
		outboxID int64
	}
	current := map[uuid.UUID]state{}
	var id uuid.UUID
	var x state
	if _, err := pgx.ForEachRow(rows, []any{&id, &x.status, &x.outboxID}, func() error {
		current[id] = x
		return nil
	}); err != nil {
		return nil, fmt.Errorf("check the orders whose event the broker lost: %w", err)
	}
	var still []lostEvent
	for _, l := range lost {
		if x, ok := current[l.OrderID]; ok && x.outboxID == l.OutboxID {
			l.Status = order.Status(x.status)
			still = append(still, l)
		}
	}
	return still, nil
}

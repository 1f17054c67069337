package compensator

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"orderpipe/shared/order"
	"orderpipe/shared/orderevent"
	"orderpipe/shared/outbox"
	"orderpipe/shared/postgres"
)

// KindRenotify re-publishes the final event of an order whose webhook was
// never created: the order reached a terminal state and has a callback
// URL, but its last status change has no delivery. That happens when the
// broker lost the event after acknowledging it (a machine crash inside its
// fsync interval, see deploy/nats.conf): the order is right, only the
// client was not told. The event goes out again with a fresh message id;
// the notifier creates the one delivery (its webhook-id is (order, seq), so
// a second copy changes nothing).
const KindRenotify Kind = "renotify"

// lostNotice is a terminal order whose last change has no delivery.
type lostNotice struct {
	ID        uuid.UUID
	ClientID  uuid.UUID
	RequestID string
	Status    order.Status
	Reason    string
	Seq       int
	Attempts  int
	Age       time.Duration
}

// renotifyAfter is how long a terminal order may lack its delivery before
// the compensator re-publishes its event: the shortest stuck deadline, so
// the notifier had its whole retry horizon to create it.
func (c *Compensator) renotifyAfter() time.Duration {
	return min(c.cfg.StuckAfter(order.StatusProcessing), c.cfg.StuckAfter(order.StatusReserved), c.cfg.StuckAfter(order.StatusPaid))
}

// renotifyAttempts bounds the re-notifications of one change: the re-drive
// budget, and at least one. A copy of a final event costs the client
// nothing (one delivery per change), and no re-drive (unwinding at the
// first deadline) must not mean no webhook.
func (c *Compensator) renotifyAttempts() int {
	return max(c.cfg.Attempts(), 1)
}

// selectLostNotices finds up to limit terminal orders, idle for longer than
// renotifyAfter and younger than the dedupe retention, whose last change
// has no webhook delivery, and that were re-notified fewer than
// renotifyAttempts times, the last time longer than renotifyAfter ago: like a
// re-drive, a re-notification gives the notifier the deadline to create
// the delivery before the next one, so that a notifier slowed by a broker
// fault does not see every attempt spent within a few passes. With lock,
// the order rows are claimed (SKIP LOCKED).
func (c *Compensator) selectLostNotices(ctx context.Context, q postgres.DB, limit int, lock bool) ([]lostNotice, error) {
	forUpdate := ""
	if lock {
		forUpdate = "FOR UPDATE OF o SKIP LOCKED"
	}
	rows, err := q.Query(ctx, `
		SELECT o.order_id, o.client_id, o.request_id, o.status, coalesce(o.reason, ''), e.seq, n.attempts,
			extract(epoch FROM now() - o.updated_at)::float8
		FROM orders o
		JOIN LATERAL (SELECT seq FROM order_events WHERE order_id = o.order_id ORDER BY seq DESC LIMIT 1) e ON true
		JOIN LATERAL (SELECT count(*)::int AS attempts, max(a.created_at) AS last_at FROM compensator_actions a
			WHERE a.order_id = o.order_id AND a.action = 'renotify') n ON true
		WHERE o.status IN ('confirmed', 'rejected', 'cancelled') AND o.callback_url IS NOT NULL
			AND o.updated_at < now() - make_interval(secs => $1::float8)
			AND o.updated_at > now() - make_interval(secs => $2::float8)
			AND n.attempts < $3
			AND (n.last_at IS NULL OR n.last_at < now() - make_interval(secs => $1::float8))
			AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.order_id = o.order_id AND d.seq = e.seq)
		ORDER BY o.updated_at
		LIMIT $4 `+forUpdate,
		c.renotifyAfter().Seconds(), c.cfg.DedupeRetention.Seconds(), c.renotifyAttempts(), limit)
	if err != nil {
		return nil, fmt.Errorf("select terminal orders without a webhook: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (lostNotice, error) {
		var n lostNotice
		var status string
		var age float64
		err := r.Scan(&n.ID, &n.ClientID, &n.RequestID, &status, &n.Reason, &n.Seq, &n.Attempts, &age)
		n.Status, n.Age = order.Status(status), time.Duration(age*float64(time.Second))
		return n, err
	})
}

func (n lostNotice) action(dryRun bool) Action {
	return Action{OrderID: n.ID, ClientID: n.ClientID, RequestID: n.RequestID, Kind: KindRenotify, From: n.Status, Attempt: n.Attempts + 1, DryRun: dryRun,
		Reason: fmt.Sprintf("%s for %s and change %d has no webhook delivery; event published again (%d)",
			n.Status, n.Age.Round(time.Second), n.Seq, n.Attempts+1)}
}

// renotify re-publishes the final event of every lost notice, one batch.
func (c *Compensator) renotify(ctx context.Context, res *Result) error {
	var actions []Action
	var outboxIDs []int64
	err := pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		lost, err := c.selectLostNotices(ctx, tx, c.cfg.BatchSize, true)
		if err != nil {
			return err
		}
		for _, n := range lost {
			a := n.action(false)
			id, err := outbox.Enqueue(ctx, tx, orderevent.Event{
				Version: orderevent.Version, Name: orderevent.ForStatus(n.Status), OrderID: n.ID, ClientID: n.ClientID,
				RequestID: n.RequestID, Status: n.Status, Reason: n.Reason, OccurredAt: time.Now().UTC(), Redrive: a.Attempt,
			})
			if err != nil {
				return err
			}
			if err := c.record(ctx, tx, a); err != nil {
				return err
			}
			actions, outboxIDs = append(actions, a), append(outboxIDs, id)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("re-notify terminal orders: %w", err)
	}
	for _, a := range actions {
		c.taken(a, res)
	}
	if err := c.relay.Publish(ctx, outboxIDs...); err != nil {
		c.logger.Warn("publish re-notified events; they stay in the outbox", slog.Any("error", err))
	}
	return nil
}

// wouldRenotify lists the lost notices a pass would re-publish (dry run).
func (c *Compensator) wouldRenotify(ctx context.Context, tx pgx.Tx, res *Result) error {
	lost, err := c.selectLostNotices(ctx, tx, c.cfg.BatchSize, false)
	if err != nil {
		return err
	}
	for _, n := range lost {
		a := n.action(true)
		res.add(a)
		c.logAction(a)
	}
	return nil
}

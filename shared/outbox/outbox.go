// Package outbox is orderpipe's transactional outbox. A status change and
// the event that announces it are written in one PostgreSQL transaction
// (Enqueue); the relay then publishes pending events to JetStream with their
// deterministic Nats-Msg-Id and stamps them published. A process that dies
// between the commit and the publish leaves the row pending, and the next
// relay pass (in any replica) publishes it, so no committed change is ever
// left unannounced. A row published twice (relay died after the publish,
// before the stamp) is dropped by the broker's duplicate window or by the
// consumer's dedupe row.
package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"orderpipe/shared/failpoint"
	"orderpipe/shared/metrics"
	"orderpipe/shared/orderevent"
	"orderpipe/shared/tracing"
)

// Failpoint names in this package.
const (
	// FailAfterPublish fires after an event was published and before its
	// row was stamped.
	FailAfterPublish = "outbox.after-publish"
)

// Execer is what Enqueue needs: a pgx.Tx (or a pool, outside a
// transaction, which defeats the point; use a transaction).
type Execer interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Enqueue writes e to the outbox in the caller's transaction and returns
// its row id.
func Enqueue(ctx context.Context, tx Execer, e orderevent.Event) (int64, error) {
	payload, err := orderevent.Encode(e)
	if err != nil {
		return 0, fmt.Errorf("encode %s event of order %s: %w", e.Name, e.OrderID, err)
	}
	h := e.Headers()
	tracing.Inject(ctx, h) // the change's trace continues in every handler
	headers, err := json.Marshal(h)
	if err != nil {
		return 0, err
	}
	var id int64
	err = tx.QueryRow(ctx,
		`INSERT INTO outbox (msg_id, event, payload, headers, order_id) VALUES ($1, $2, $3, $4, $5) RETURNING id`,
		e.MsgID(), string(e.Name), payload, headers, e.OrderID).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("enqueue %s event of order %s: %w", e.Name, e.OrderID, err)
	}
	return id, nil
}

// Relay publishes pending outbox rows.
type Relay struct {
	Pool     *pgxpool.Pool
	JS       jetstream.JetStream
	Topology orderevent.Topology
	Logger   *slog.Logger
	// Interval between passes over pending rows; default 1s.
	Interval time.Duration
	// MinAge leaves rows younger than this to the inline publish of the
	// process that wrote them; default 2s.
	MinAge time.Duration
	// Batch is the most rows one pass publishes; default 500.
	Batch int
	// PublishTimeout bounds one publish; default 5s.
	PublishTimeout time.Duration
}

func (r *Relay) defaults() {
	if r.Interval <= 0 {
		r.Interval = time.Second
	}
	if r.MinAge < 0 {
		r.MinAge = 0
	} else if r.MinAge == 0 {
		r.MinAge = 2 * time.Second
	}
	if r.Batch <= 0 {
		r.Batch = 500
	}
	if r.PublishTimeout <= 0 {
		r.PublishTimeout = 5 * time.Second
	}
	if r.Logger == nil {
		r.Logger = slog.Default()
	}
}

// Run publishes pending rows every Interval until ctx ends.
func (r *Relay) Run(ctx context.Context) error {
	r.defaults()
	t := time.NewTicker(r.Interval)
	defer t.Stop()
	for {
		if n, err := r.PublishPending(ctx, r.MinAge); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			r.Logger.Warn("outbox relay pass", slog.Any("error", err), slog.Int("published", n))
		} else if n > 0 {
			r.Logger.Info("outbox relay published pending events", slog.Int("published", n))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

type row struct {
	id      int64
	msgID   string
	event   string
	payload []byte
	headers map[string]string
}

// PublishPending publishes up to Batch pending rows older than minAge, in
// id order, and returns how many it published. Rows locked by another relay
// are skipped.
func (r *Relay) PublishPending(ctx context.Context, minAge time.Duration) (int, error) {
	r.defaults()
	return r.publishWhere(ctx, "relay", `published_at IS NULL AND created_at <= now() - make_interval(secs => $1) ORDER BY id LIMIT $2`, minAge.Seconds(), r.Batch)
}

// Publish publishes the given rows now if they are still pending (the
// inline path right after the commit that wrote them).
func (r *Relay) Publish(ctx context.Context, ids ...int64) error {
	if len(ids) == 0 {
		return nil
	}
	r.defaults()
	_, err := r.publishWhere(ctx, "inline", `published_at IS NULL AND id = ANY($1) ORDER BY id`, ids)
	return err
}

func (r *Relay) publishWhere(ctx context.Context, path, where string, args ...any) (int, error) {
	published := 0
	var pubErr error
	err := pgx.BeginFunc(ctx, r.Pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT id, msg_id, event, payload, headers FROM outbox WHERE `+where+` FOR UPDATE SKIP LOCKED`, args...)
		if err != nil {
			return fmt.Errorf("select pending outbox rows: %w", err)
		}
		var batch []row
		for rows.Next() {
			var x row
			if err := rows.Scan(&x.id, &x.msgID, &x.event, &x.payload, &x.headers); err != nil {
				rows.Close()
				return err
			}
			batch = append(batch, x)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		var done, seqs []int64
		for _, x := range batch {
			seq, err := r.publish(ctx, x)
			if err != nil {
				pubErr = err
				break
			}
			done, seqs = append(done, x.id), append(seqs, int64(seq))
		}
		if len(done) > 0 {
			if err := failpoint.Inject(FailAfterPublish); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, stampSQL, done, seqs); err != nil {
				return fmt.Errorf("stamp published outbox rows: %w", err)
			}
		}
		published = len(done)
		return nil // keep the stamps of what went out even if a later publish failed
	})
	if err != nil {
		return 0, err
	}
	metrics.OutboxPublished.WithLabelValues(path).Add(float64(published))
	return published, pubErr
}

// stampSQL marks rows ($1) published with the stream sequence ($2) of
// their publish ack, which lets the compensator tell later whether the
// broker still holds the event.
const stampSQL = `
	UPDATE outbox o SET published_at = now(), stream_seq = v.seq
	FROM unnest($1::bigint[], $2::bigint[]) AS v(id, seq) WHERE o.id = v.id`

// publish publishes one row and returns its stream sequence.
func (r *Relay) publish(ctx context.Context, x row) (uint64, error) {
	msg := &nats.Msg{Subject: r.Topology.Subject(orderevent.Name(x.event)), Data: x.payload, Header: nats.Header{}}
	for k, v := range x.headers {
		msg.Header.Set(k, v)
	}
	msg.Header.Set(orderevent.HeaderMsgID, x.msgID)
	pctx, cancel := context.WithTimeout(ctx, r.PublishTimeout)
	defer cancel()
	ack, err := r.JS.PublishMsg(pctx, msg, jetstream.WithMsgID(x.msgID))
	if err != nil {
		return 0, fmt.Errorf("publish %s (%s): %w", x.msgID, msg.Subject, err)
	}
	return ack.Sequence, nil
}

// Pending returns how many rows wait to be published.
func Pending(ctx context.Context, pool *pgxpool.Pool) (int, error) {
	var n int
	err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE published_at IS NULL`).Scan(&n)
	return n, err
}

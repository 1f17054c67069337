package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"orderpipe/shared/orderevent"
)

// schema is this subscriber's own: it shares no table with orderpipe. The
// processed-messages table is what makes the effect happen once per event
// (its key is the event's identity, eventKey, not the copy's message id);
// shipments is the effect. shipments has deliberately no unique
// key on order_id: many real effects (a ledger line, an e-mail, a counter)
// have no natural key, so the dedupe row is what stands between a
// redelivery and a second effect. (If yours has one, add it as well.)
const schema = `
CREATE TABLE IF NOT EXISTS subscriber_processed_messages (
	event_key    text PRIMARY KEY,
	processed_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS shipments (
	id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	order_id     uuid NOT NULL,
	client_id    uuid NOT NULL,
	request_id   text NOT NULL,
	msg_id       text NOT NULL,
	confirmed_at timestamptz NOT NULL,
	created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS shipments_order_id ON shipments (order_id);
`

// schemaLock serializes the CREATE ... IF NOT EXISTS of replicas that start
// together (two concurrent ones can otherwise fail on a catalog unique key).
const schemaLock = 0x5375_6253 // any constant of this program's own

// handleTimeout bounds the work on one message. Keep it well under AckWait:
// a message still in hand when AckWait runs out is delivered again (to this
// or another replica), and then it is the dedupe row that decides.
const handleTimeout = 10 * time.Second

// afterCommit, when set, runs after a message's transaction committed and
// before its ack. Tests only: the crash test parks the process there and
// kills it with -9.
var afterCommit func(msgID string)

// serve runs the subscriber until ctx ends.
func serve(ctx context.Context, cfg config, logger *slog.Logger) error {
	pool, err := pgxpool.New(ctx, cfg.databaseURL)
	if err != nil {
		return fmt.Errorf("open database: %w", err)
	}
	defer pool.Close()
	if err := createSchema(ctx, pool); err != nil {
		return err
	}

	// The broker may be down at start or go away later: the connection
	// keeps trying, and the fetch loop below waits for it.
	nc, err := nats.Connect(cfg.natsURL,
		nats.Name("subscriber-"+cfg.durable),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(500*time.Millisecond),
		nats.RetryOnFailedConnect(true),
	)
	if err != nil {
		return fmt.Errorf("connect to NATS: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("open JetStream: %w", err)
	}
	s := &subscriber{pool: pool, js: js, cfg: cfg, logger: logger}
	s.loop(ctx)
	return nil
}

// createSchema creates the subscriber's tables if they are missing.
func createSchema(ctx context.Context, pool *pgxpool.Pool) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("create schema: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(schemaLock)); err != nil {
		return fmt.Errorf("create schema: %w", err)
	}
	if _, err := tx.Exec(ctx, schema); err != nil {
		return fmt.Errorf("create schema: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("create schema: %w", err)
	}
	return nil
}

type subscriber struct {
	pool   *pgxpool.Pool
	js     jetstream.JetStream
	cfg    config
	logger *slog.Logger
}

// consumerConfig is the subscriber's durable consumer: its own name (all
// replicas share it and split the messages), only confirmed events,
// explicit acks, a bounded number of deliveries.
func (s *subscriber) consumerConfig() jetstream.ConsumerConfig {
	topo := orderevent.Topology{Stream: s.cfg.stream, Prefix: s.cfg.prefix}
	return jetstream.ConsumerConfig{
		Durable:       s.cfg.durable,
		Description:   "example subscriber: one shipment per confirmed order",
		FilterSubject: topo.Subject(orderevent.Confirmed),
		// From the start of the stream: events published before this
		// subscriber's first run are not lost, and replaying them is
		// safe because of the dedupe table.
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       s.cfg.ackWait,
		MaxDeliver:    s.cfg.maxDeliver,
	}
}

// loop fetches batches and handles their messages one by one until ctx
// ends. The consumer is created (or updated) at start and again after any
// fetch error: the broker may have restarted, or someone deleted it.
func (s *subscriber) loop(ctx context.Context) {
	var cons jetstream.Consumer
	for ctx.Err() == nil {
		if cons == nil {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			c, err := s.js.CreateOrUpdateConsumer(cctx, s.cfg.stream, s.consumerConfig())
			cancel()
			if err != nil {
				if ctx.Err() == nil {
					s.logger.Warn("durable consumer not ready; retrying", slog.String("stream", s.cfg.stream), slog.Any("error", err))
				}
				pause(ctx, time.Second)
				continue
			}
			cons = c
			s.logger.Info("durable consumer ready", slog.String("stream", s.cfg.stream), slog.String("filter", s.consumerConfig().FilterSubject))
		}
		batch, err := cons.Fetch(s.cfg.batch, jetstream.FetchMaxWait(s.cfg.fetchWait))
		if err == nil {
			for m := range batch.Messages() {
				if ctx.Err() != nil {
					// Shutting down: hand the rest of the batch back now
					// rather than after AckWait.
					_ = m.Nak()
					continue
				}
				s.handle(m)
			}
			err = batch.Error()
		}
		if err != nil && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			s.logger.Warn("fetch", slog.Any("error", err))
			cons = nil
			pause(ctx, 500*time.Millisecond)
		}
	}
}

func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// handle settles one message. The order of the steps is the point:
//
//  1. decode; a message that can never be processed is terminated (not
//     retried until MaxDeliver, not acked as if it had been applied);
//  2. in ONE transaction: claim the event's key (eventKey) in the
//     processed-messages table, then apply the effect; a claimed key means
//     a duplicate, and nothing else is written;
//  3. ack only after the commit. A crash between 2 and 3 redelivers the
//     message, and step 2 finds its row. A failure in 2 commits nothing
//     and naks, so the message comes back later.
//
// It does not take the shutdown context: a message in hand is finished
// (within handleTimeout) rather than cut off between commit and ack.
func (s *subscriber) handle(m jetstream.Msg) {
	ctx, cancel := context.WithTimeout(context.Background(), handleTimeout)
	defer cancel()
	msgID := m.Headers().Get(orderevent.HeaderMsgID)
	log := s.logger.With(slog.String("subject", m.Subject()), slog.String("msg_id", msgID))

	ev, err := decode(msgID, m.Data())
	if err != nil {
		log.Warn("malformed message terminated", slog.Any("error", err))
		if err := m.TermWithReason(err.Error()); err != nil {
			log.Warn("term", slog.Any("error", err))
		}
		return
	}

	applied, err := s.apply(ctx, eventKey(ev), msgID, ev)
	if err != nil {
		delivered := uint64(1)
		if md, merr := m.Metadata(); merr == nil {
			delivered = md.NumDelivered
		}
		if delivered >= uint64(s.cfg.maxDeliver) {
			log.Error("giving up on a message: its last delivery failed", slog.Uint64("delivered", delivered), slog.Any("error", err))
		} else {
			log.Warn("not applied; will be redelivered", slog.Uint64("delivered", delivered), slog.Any("error", err))
		}
		_ = m.NakWithDelay(min(time.Duration(delivered)*time.Second, 30*time.Second))
		return
	}
	if afterCommit != nil {
		afterCommit(msgID)
	}
	// DoubleAck waits for the broker to confirm the ack. If it is lost, the
	// message comes back and is acked as a duplicate: no harm done.
	if err := m.DoubleAck(ctx); err != nil {
		log.Warn("ack after commit", slog.Any("error", err))
		return
	}
	if applied {
		log.Info("shipment recorded", slog.String("order_id", ev.OrderID.String()))
	} else {
		log.Info("duplicate acked without effect", slog.String("order_id", ev.OrderID.String()))
	}
}

// decode checks everything that makes a message unprocessable for good.
func decode(msgID string, data []byte) (orderevent.Event, error) {
	if msgID == "" {
		return orderevent.Event{}, fmt.Errorf("%w: no %s header (nothing to dedupe on)", orderevent.ErrMalformed, orderevent.HeaderMsgID)
	}
	ev, err := orderevent.Decode(data)
	if err != nil {
		return orderevent.Event{}, err
	}
	if ev.Name != orderevent.Confirmed {
		return orderevent.Event{}, fmt.Errorf("%w: event %q on the confirmed subject", orderevent.ErrMalformed, ev.Name)
	}
	return ev, nil
}

// eventKey is what the effect is about: the order's confirmation,
// `<order_id>:confirmed`. Every copy of that change carries it: a broker
// redelivery, a republish under the same Nats-Msg-Id, and the copies
// orderpipe publishes under ids of their own (a re-notify of a final event
// the broker lost, `…:r<n>` with redrive n in the payload; a heal,
// `…:heal<n>`; an operator's dead-letter replay, `…:dlq<id>.<n>`).
// Deduplicating on the Nats-Msg-Id would ship again for those.
func eventKey(ev orderevent.Event) string {
	return ev.OrderID.String() + ":" + string(ev.Name)
}

// apply records the effect of a message and its event's key in one
// transaction and reports whether it did (false: the key was already
// processed).
//
// The key is claimed first. A second delivery of the same message running
// at the same time (AckWait ran out on a slow replica) blocks on that
// INSERT until the first transaction ends, then sees the row and does
// nothing; if the first one rolled back, the second one claims it.
func (s *subscriber) apply(ctx context.Context, key, msgID string, ev orderevent.Event) (bool, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	tag, err := tx.Exec(ctx, `INSERT INTO subscriber_processed_messages (event_key) VALUES ($1) ON CONFLICT (event_key) DO NOTHING`, key)
	if err != nil {
		return false, fmt.Errorf("claim event key: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return false, nil // a duplicate: the rollback writes nothing
	}
	if _, err := tx.Exec(ctx, `INSERT INTO shipments (order_id, client_id, request_id, msg_id, confirmed_at) VALUES ($1, $2, $3, $4, $5)`,
		ev.OrderID, ev.ClientID, ev.RequestID, msgID, ev.OccurredAt); err != nil {
		return false, fmt.Errorf("record shipment: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		// Committed or not, we cannot tell: nak, and the redelivery's
		// claim finds out.
		return false, fmt.Errorf("commit: %w", err)
	}
	return true, nil
}

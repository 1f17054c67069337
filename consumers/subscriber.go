package consumers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go/jetstream"

	"orderpipe/shared/orderevent"
	"orderpipe/shared/tracing"
)

// Metadata keys that the subscriber sets on every Watermill message besides
// the NATS headers.
const (
	metaSubject   = "_subject"
	metaDelivered = "_delivered"
	metaStreamSeq = "_stream_seq"
)

// subscriber is a Watermill message.Subscriber over ONE durable JetStream
// pull consumer of nats.go's jetstream package.
//
// It replaces watermill-nats v2.1.3's pkg/jetstream subscriber, which we
// read and could not configure into what the pipeline needs:
//   - its Close drains the *nats.Conn it was given, which in our processes
//     is shared with the outbox relay and the health checks;
//   - it has no in-progress acks: a message whose handler runs longer than
//     AckWait (a slow payment call) is redelivered to another replica
//     while still being handled; we send InProgress every AckWait/3;
//   - a payload it cannot unmarshal dereferences a nil message (panic);
//   - when its own ack timer fires it drops the message without a nak, and
//     its Nak delay does not follow a per-delivery schedule;
//   - it names consumers "watermill__<group>__<topic>" and may delete them
//     on close; ours are durable, named after the step, never deleted.
//
// Each Watermill message is acked on JetStream only after the router's
// handler acked it (that is after the step's commit), with DoubleAck so a
// lost ack shows up as an error (and a redelivery, which the dedupe row
// absorbs). A nack becomes NakWithDelay(redelivery schedule[delivered]).
// Workers messages are handled concurrently.
type subscriber struct {
	js      jetstream.JetStream
	stream  string
	cc      jetstream.ConsumerConfig
	cfg     Config
	logger  *slog.Logger
	closing chan struct{}
	once    sync.Once
	wg      sync.WaitGroup
}

func newSubscriber(js jetstream.JetStream, stream string, cc jetstream.ConsumerConfig, cfg Config, logger *slog.Logger) *subscriber {
	return &subscriber{js: js, stream: stream, cc: cc, cfg: cfg, logger: logger, closing: make(chan struct{})}
}

// consumerConfig is the durable consumer of a step: explicit acks, a
// bounded number of deliveries, ack-timeout redeliveries spaced by BackOff
// (its first value is the AckWait), all events of the stream that match.
func consumerConfig(name string, subjects []string, cfg Config) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:        name,
		Description:    "orderpipe step " + name,
		FilterSubjects: subjects,
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        cfg.AckWait,
		BackOff:        cfg.ackBackOff(),
		MaxDeliver:     cfg.MaxDeliver,
		MaxAckPending:  cfg.MaxAckPending,
		ReplayPolicy:   jetstream.ReplayInstantPolicy,
	}
}

// Subscribe creates or updates the durable consumer and starts the workers.
// topic is only a label: the consumer's subjects come from its config. The
// channel is closed when ctx ends or the subscriber is closed, after the
// in-flight messages were acked or nacked.
func (s *subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	cons, err := s.js.CreateOrUpdateConsumer(ctx, s.stream, s.cc)
	if err != nil {
		return nil, fmt.Errorf("provision durable consumer %s on %s: %w", s.cc.Durable, s.stream, err)
	}
	out := make(chan *message.Message)
	fetchCtx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-s.closing:
		case <-fetchCtx.Done():
		}
		cancel()
	}()
	var workers sync.WaitGroup
	jobs := make(chan jetstream.Msg)
	for range s.cfg.Workers {
		workers.Add(1)
		go func() {
			defer workers.Done()
			for m := range jobs {
				s.handle(m, out)
			}
		}()
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(out)
		defer workers.Wait()
		defer close(jobs)
		s.fetch(fetchCtx, cons, jobs)
	}()
	return out, nil
}

// fetch pulls messages into jobs until ctx ends, re-creating the iterator
// (and the consumer, if the broker lost it) after errors.
func (s *subscriber) fetch(ctx context.Context, cons jetstream.Consumer, jobs chan<- jetstream.Msg) {
	pause := func(d time.Duration) bool {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			return true
		case <-ctx.Done():
			return false
		}
	}
	for ctx.Err() == nil {
		it, err := cons.Messages(jetstream.PullMaxMessages(s.cfg.Workers), jetstream.PullExpiry(5*time.Second))
		if err != nil {
			s.logger.Warn("open JetStream pull subscription", slog.String("consumer", s.cc.Durable), slog.Any("error", err))
			if !pause(time.Second) {
				return
			}
			if c, err := s.js.CreateOrUpdateConsumer(ctx, s.stream, s.cc); err == nil {
				cons = c
			}
			continue
		}
		for {
			m, err := it.Next(jetstream.NextContext(ctx))
			if err != nil {
				it.Stop()
				if ctx.Err() != nil {
					return
				}
				s.logger.Warn("JetStream pull", slog.String("consumer", s.cc.Durable), slog.Any("error", err))
				if !pause(500 * time.Millisecond) {
					return
				}
				if errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrConsumerNotFound) {
					if c, err := s.js.CreateOrUpdateConsumer(ctx, s.stream, s.cc); err == nil {
						cons = c
					}
				}
				break
			}
			select {
			case jobs <- m:
			case <-ctx.Done():
				// Not handed to a worker: let the broker redeliver it now.
				_ = m.Nak()
				it.Stop()
				return
			}
		}
	}
}

// handle passes one message to the router and settles it on JetStream when
// the router acks or nacks it.
func (s *subscriber) handle(m jetstream.Msg, out chan<- *message.Message) {
	md, err := m.Metadata()
	if err != nil {
		s.logger.Error("JetStream message without metadata", slog.Any("error", err))
		_ = m.Term()
		return
	}
	uuid := m.Headers().Get(orderevent.HeaderMsgID)
	if uuid == "" {
		uuid = "seq:" + strconv.FormatUint(md.Sequence.Stream, 10)
	}
	wm := message.NewMessage(uuid, m.Data())
	carrier := map[string]string{}
	for k, v := range m.Headers() {
		if len(v) > 0 {
			wm.Metadata.Set(k, v[0])
			carrier[k] = v[0]
		}
	}
	wm.Metadata.Set(metaSubject, m.Subject())
	wm.Metadata.Set(metaDelivered, strconv.FormatUint(md.NumDelivered, 10))
	wm.Metadata.Set(metaStreamSeq, strconv.FormatUint(md.Sequence.Stream, 10))

	// In-flight work is not cut short by a shutdown: it gets MaxProcessing,
	// and the router's close timeout bounds the drain.
	ctx, cancel := context.WithTimeout(tracing.Extract(context.Background(), carrier), s.cfg.MaxProcessing)
	defer cancel()
	wm.SetContext(ctx)

	select {
	case out <- wm:
	case <-s.closing:
		_ = m.Nak()
		return
	}
	progress := time.NewTicker(max(s.cfg.AckWait/3, 10*time.Millisecond))
	defer progress.Stop()
	for {
		select {
		case <-wm.Acked():
			actx, acancel := context.WithTimeout(context.Background(), 5*time.Second)
			err := m.DoubleAck(actx)
			acancel()
			if err != nil {
				// The commit is done; a redelivery finds the dedupe row.
				s.logger.Warn("ack after commit", slog.String("consumer", s.cc.Durable), slog.String("msg_id", uuid), slog.Any("error", err))
			}
			return
		case <-wm.Nacked():
			delay := s.cfg.redeliveryDelay(int(md.NumDelivered))
			if err := m.NakWithDelay(delay); err != nil {
				s.logger.Warn("nak", slog.String("consumer", s.cc.Durable), slog.String("msg_id", uuid), slog.Any("error", err))
			}
			return
		case <-progress.C:
			// Still working: keep the broker from redelivering it elsewhere.
			if err := m.InProgress(); err != nil {
				s.logger.Debug("in-progress ack", slog.String("msg_id", uuid), slog.Any("error", err))
			}
		}
	}
}

// Close stops fetching and waits (up to the drain timeout) until every
// in-flight message was settled. It does not touch the NATS connection.
func (s *subscriber) Close() error {
	s.once.Do(func() { close(s.closing) })
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-time.After(s.cfg.DrainTimeout):
		return fmt.Errorf("consumer %s: in-flight messages not settled within %s", s.cc.Durable, s.cfg.DrainTimeout)
	}
}

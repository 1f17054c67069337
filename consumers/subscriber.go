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
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"orderpipe/shared/app"
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
// Workers messages are handled concurrently, and no more are fetched than
// there are free workers.
type subscriber struct {
	js      jetstream.JetStream
	stream  string
	cc      jetstream.ConsumerConfig
	cfg     Config
	logger  *slog.Logger
	closing chan struct{}
	once    sync.Once
	wg      sync.WaitGroup
	// ensure provisions the stream again when it is missing.
	ensure func(ctx context.Context) error
}

func newSubscriber(js jetstream.JetStream, stream string, cc jetstream.ConsumerConfig, cfg Config, logger *slog.Logger, ensure func(context.Context) error) *subscriber {
	return &subscriber{js: js, stream: stream, cc: cc, cfg: cfg, logger: logger, closing: make(chan struct{}), ensure: ensure}
}

// consumerConfig is the durable consumer of a step: explicit acks,
// ack-timeout redeliveries spaced by BackOff (its first value is the
// AckWait), all events of the stream that match. The broker does not bound
// the deliveries (MaxDeliver -1): it would drop a message at its last one,
// whatever became of it, and a dead letter that could not be stored then
// (PostgreSQL down) would be lost. The pipeline bounds them (poison): past
// cfg.MaxDeliver a delivery runs no step, it only stores the dead letter,
// and the message is acked once that is done.
func consumerConfig(name string, subjects []string, cfg Config) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:        name,
		Description:    "orderpipe step " + name,
		FilterSubjects: subjects,
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        cfg.AckWait,
		BackOff:        cfg.AckBackOff(),
		MaxDeliver:     -1,
		MaxAckPending:  cfg.MaxAckPending,
		ReplayPolicy:   jetstream.ReplayInstantPolicy,
	}
}

// Subscribe creates or updates the durable consumer and starts fetching.
// topic is only a label: the consumer's subjects come from its config. A
// broker that is down, or a stream that is missing, does not fail it: the
// fetch loop provisions the stream and the consumer when it can. The
// channel is closed when ctx ends or the subscriber is closed, after the
// in-flight messages were acked or nacked.
func (s *subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	cons, err := s.provision(pctx)
	cancel()
	if err != nil {
		s.logger.Warn("durable consumer not provisioned yet; retrying in the background", slog.String("consumer", s.cc.Durable), slog.Any("error", err))
	}
	out := make(chan *message.Message)
	fetchCtx, stop := context.WithCancel(ctx)
	go func() {
		select {
		case <-s.closing:
		case <-fetchCtx.Done():
		}
		stop()
	}()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(out)
		s.fetch(fetchCtx, cons, out)
	}()
	return out, nil
}

// provision creates or updates the durable consumer, and the stream first
// when it is missing (deleted, or a broker that lost its store).
func (s *subscriber) provision(ctx context.Context) (jetstream.Consumer, error) {
	cons, err := s.js.CreateOrUpdateConsumer(ctx, s.stream, s.cc)
	if errors.Is(err, jetstream.ErrStreamNotFound) && s.ensure != nil {
		if err := s.ensure(ctx); err != nil {
			return nil, fmt.Errorf("provision stream %s: %w", s.stream, err)
		}
		s.logger.Warn("the stream was missing; provisioned it again", slog.String("stream", s.stream))
		cons, err = s.js.CreateOrUpdateConsumer(ctx, s.stream, s.cc)
	}
	if err != nil {
		return nil, fmt.Errorf("provision durable consumer %s on %s: %w", s.cc.Durable, s.stream, err)
	}
	return cons, nil
}

// fetch pulls messages until ctx ends, never more than there are free
// workers: a fetched message goes straight to a worker, which keeps it alive
// with in-progress acks, so no message waits in a buffer while its AckWait
// runs out (and burns a delivery attempt). After an error it provisions the
// consumer (and the stream) again.
func (s *subscriber) fetch(ctx context.Context, cons jetstream.Consumer, out chan<- *message.Message) {
	free := make(chan struct{}, s.cfg.Workers)
	for range s.cfg.Workers {
		free <- struct{}{}
	}
	var workers sync.WaitGroup
	defer workers.Wait()
	for ctx.Err() == nil {
		if cons == nil {
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			c, err := s.provision(pctx)
			cancel()
			if err != nil {
				s.logger.Debug("provision durable consumer", slog.String("consumer", s.cc.Durable), slog.Any("error", err))
				if !app.Sleep(ctx, time.Second) {
					return
				}
				continue
			}
			cons = c
		}
		// Wait for one free worker, then take every free one.
		select {
		case <-free:
		case <-ctx.Done():
			return
		}
		n := 1
		for len(free) > 0 {
			<-free
			n++
		}
		batch, err := cons.Fetch(n, jetstream.FetchMaxWait(time.Second))
		got := 0
		if err == nil {
			for m := range batch.Messages() {
				got++
				workers.Add(1)
				go func() {
					defer workers.Done()
					defer func() { free <- struct{}{} }()
					s.handle(m, out)
				}()
			}
			err = batch.Error()
		}
		for range n - got {
			free <- struct{}{}
		}
		if err != nil && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			s.logger.Warn("JetStream fetch", slog.String("consumer", s.cc.Durable), slog.Any("error", err))
			cons = nil // provision it again: it, or its stream, may be gone
			if !app.Sleep(ctx, 500*time.Millisecond) {
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
			delay := s.cfg.Delay(int(md.NumDelivered))
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

// Close stops fetching and waits up to the drain timeout for the
// in-flight messages to be acked or nacked (watermill's router calls it).
// It does not touch the NATS connection.
func (s *subscriber) Close() error {
	return s.closeBy(time.Now().Add(s.cfg.DrainTimeout))
}

// stop stops fetching; in-flight messages go on.
func (s *subscriber) stop() { s.once.Do(func() { close(s.closing) }) }

// closeBy stops fetching and waits until deadline for the in-flight
// messages to be acked or nacked.
func (s *subscriber) closeBy(deadline time.Time) error {
	s.stop()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-done:
		return nil
	case <-t.C:
		select {
		case <-done: // settled as the deadline came
			return nil
		default:
		}
		return fmt.Errorf("consumer %s: in-flight messages not settled within the drain timeout (%s)", s.cc.Durable, s.cfg.DrainTimeout)
	}
}

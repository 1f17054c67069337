package consumers

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"orderpipe/consumers/step"
	"orderpipe/shared/app"
	"orderpipe/shared/orderevent"
	"orderpipe/shared/outbox"
)

// WithoutDedupe returns c with the dedupe pre-check and the
// processed_messages row turned off: the same handlers without their
// dedupe, for BenchmarkStep only. A test build is the only way to it.
func WithoutDedupe(c Config) Config {
	c.noDedupe = true
	return c
}

// Committer is one step's group commit, reachable by the tests.
type Committer struct{ c *committer }

// NewCommitter returns the group commit of a step named name on env, as
// the router builds it for each step.
func NewCommitter(env *app.Env, name string) *Committer {
	p := &Pipeline{env: env, cfg: Default(), relay: &outbox.Relay{Pool: env.Pool, JS: env.JS, Topology: env.Topology, Logger: env.Logger}}
	return &Committer{newCommitter(p, name, nil)}
}

// Commit is a handler's Commit through the step's queue.
func (c *Committer) Commit(ctx context.Context, msgID string, apply step.Apply) (fresh, committed bool, err error) {
	r := c.c.commit(ctx, step.Message{ID: msgID}, apply)
	return r.fresh, r.committed, r.err
}

// Queued is how many commits wait for the next batch.
func (c *Committer) Queued() int { return c.c.q.Len() }

// PutDeadLetter stores the dead letter of a message with the given id and
// stream sequence, as a step's last delivery does, and says whether it was
// new.
func PutDeadLetter(ctx context.Context, env *app.Env, consumer, msgID string, streamSeq uint64, payload []byte) (int64, bool, error) {
	msg := message.NewMessage(msgID, payload)
	msg.Metadata.Set(metaSubject, env.Topology.Subject(orderevent.Accepted))
	msg.Metadata.Set(metaStreamSeq, strconv.FormatUint(streamSeq, 10))
	return putDeadLetter(ctx, env.Pool, consumer, msg, "test", 2)
}

// Deliver hands the step named name one message with payload, as its
// delivered-th delivery, through the poison middleware and the step's
// handler (the router's chain without retries): nil means the message is
// acked.
func Deliver(p *Pipeline, name string, payload []byte, delivered int) error {
	for _, st := range p.steps {
		if st.Name != name {
			continue
		}
		msg := message.NewMessage("deliver-test", payload)
		msg.Metadata.Set(metaDelivered, strconv.Itoa(delivered))
		msg.Metadata.Set(metaStreamSeq, "1")
		msg.SetContext(context.Background())
		h := p.handler(st)
		_, err := p.poison(func(m *message.Message) ([]*message.Message, error) { return nil, h(m) })(msg)
		return err
	}
	return errors.New("no step " + name)
}

// WaitSettled waits up to timeout until every in-flight message of p's
// consumers was acked or nacked (after Run returned, a handler that
// outlived the drain may still hold one).
func WaitSettled(p *Pipeline, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for _, s := range p.subs {
		if err := s.closeBy(deadline); err != nil {
			return err
		}
	}
	return nil
}

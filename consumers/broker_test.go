package consumers_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"orderpipe/consumers/pipetest"
	"orderpipe/consumers/step"
	"orderpipe/shared/orderevent"
	"orderpipe/shared/outbox"
	"orderpipe/shared/tooling/pspserver"
	"orderpipe/shared/tooling/testenv"
)

// TestStreamDeletedAtRuntime: the ORDERS stream is deleted while the
// pipeline runs. The relay provisions it again when a publish finds it
// missing, the subscribers provision their durable consumers again, and
// new orders go through — no process is restarted (before, the stream came
// back only when some process started).
func TestStreamDeletedAtRuntime(t *testing.T) {
	t.Parallel()
	e := pipetest.New(t, pspserver.Options{})
	stock(t, e)
	pipetest.Start(t, e.App, pipetest.Config(), e.Steps(5*time.Second)...)
	e.CreateOrder(t, "3.00", lines...)
	e.WaitTerminal(t, 30*time.Second)
	if err := e.App.JS.DeleteStream(t.Context(), e.App.Topology.Stream); err != nil {
		t.Fatal(err)
	}
	for range 10 {
		e.InsertOrder(t, "3.00", lines...) // published by the relay, which finds the stream gone
	}
	e.WaitTerminal(t, 60*time.Second)
	e.CheckInvariants(t)
}

// TestBusyWorkersDoNotBurnDeliveries: with every worker busy for several
// AckWaits, the next message is not fetched meanwhile, so its first
// handling is its first delivery (before, the subscriber prefetched it
// without in-progress acks, and the broker redelivered it, counting an
// attempt, while it waited in the buffer).
func TestBusyWorkersDoNotBurnDeliveries(t *testing.T) {
	t.Parallel()
	e := pipetest.New(t, pspserver.Options{})
	cfg := pipetest.Config()
	cfg.Workers = 1
	cfg.AckWait = 300 * time.Millisecond
	var first atomic.Bool
	var secondDelivered atomic.Int64
	slow := step.Step{Name: "slow", Events: []orderevent.Name{orderevent.Accepted}, Handle: func(ctx context.Context, m step.Message, commit step.Commit) error {
		if first.CompareAndSwap(false, true) {
			// Hold the only worker for five AckWaits: the scenario, not a
			// wait for something.
			t := time.NewTimer(5 * cfg.AckWait)
			defer t.Stop()
			select {
			case <-t.C:
			case <-ctx.Done():
			}
		} else {
			secondDelivered.Store(int64(m.Delivered))
		}
		_, err := commit(ctx, func(context.Context, pgx.Tx) ([]outbox.Row, error) { return nil, nil })
		return err
	}}
	pipetest.Start(t, e.App, cfg, slow)
	e.CreateOrder(t, "3.00", lines...)
	e.CreateOrder(t, "3.00", lines...)
	testenv.WaitFor(t, 30*time.Second, "both messages handled", func() bool { return secondDelivered.Load() != 0 })
	if d := secondDelivered.Load(); d != 1 {
		t.Fatalf("the message that waited for a worker was handled at its delivery %d, want 1", d)
	}
	c, err := e.App.JS.Consumer(t.Context(), e.App.Topology.Stream, "slow")
	if err != nil {
		t.Fatal(err)
	}
	ci, err := c.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if ci.Delivered.Consumer != 2 {
		t.Fatalf("%d deliveries of 2 messages, want 2: a message was redelivered while it waited for a worker", ci.Delivered.Consumer)
	}
}

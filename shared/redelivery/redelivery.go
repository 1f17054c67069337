// Package redelivery is the consumers' redelivery policy — how long
// JetStream waits for an ack, how often it delivers one message, how long
// it waits between deliveries — and the horizon it gives: how long the
// consumers may keep working on one message. The consumers run by it, and
// the compensator reads its horizon (an order whose message may still be
// redelivered is not stuck), so it lives here, shared, and both read the
// same variables.
package redelivery

import (
	"errors"
	"fmt"
	"time"

	"orderpipe/shared/config"
)

// The variables of the policy (read by `orderpipe consumers` and by the
// compensator, which must be given the consumers' values).
var (
	EnvAckWait    = config.DurationSetting("ORDERPIPE_CONSUMER_ACK_WAIT", "JetStream AckWait of the step consumers; in-progress acks go out every third of it", 30*time.Second)
	EnvMaxDeliver = config.IntSetting("ORDERPIPE_CONSUMER_MAX_DELIVER", "deliveries of one message on which a step runs; a failing last one is dead-lettered", 8, 2)
)

// Policy is how one message is redelivered.
type Policy struct {
	// AckWait is how long JetStream waits for an ack before redelivering
	// (first delivery; later ones wait longer, see AckBackOff). A live
	// handler sends in-progress acks every third of it.
	AckWait time.Duration
	// MaxDeliver bounds the deliveries of one message; the last failing
	// one dead-letters it.
	MaxDeliver int
	// Redelivery is the delay of the n-th redelivery after a handler
	// failed (the last value repeats).
	Redelivery []time.Duration
	// MaxProcessing bounds one handler run.
	MaxProcessing time.Duration
}

// Default is the production policy.
func Default() Policy {
	return Policy{
		AckWait:       EnvAckWait.Default,
		MaxDeliver:    EnvMaxDeliver.Default,
		Redelivery:    []time.Duration{time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second, 30 * time.Second, time.Minute, 2 * time.Minute},
		MaxProcessing: 2 * time.Minute,
	}
}

// FromEnv is Default with the variables applied.
func FromEnv() (Policy, error) {
	p := Default()
	if err := errors.Join(EnvAckWait.Into(&p.AckWait), EnvMaxDeliver.Into(&p.MaxDeliver)); err != nil {
		return Policy{}, err
	}
	return p, errors.Join(p.Check()...)
}

// Check returns what does not make sense in p.
func (p Policy) Check() []error {
	var errs []error
	if p.AckWait < 100*time.Millisecond {
		errs = append(errs, fmt.Errorf("ack wait %s is shorter than 100ms", p.AckWait))
	}
	if p.MaxDeliver < 2 {
		errs = append(errs, fmt.Errorf("max deliver %d: want at least 2", p.MaxDeliver))
	}
	if len(p.Redelivery) == 0 {
		errs = append(errs, errors.New("redelivery schedule is empty"))
	}
	for _, d := range p.Redelivery {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("redelivery delay %s is not positive", d))
		}
	}
	if p.MaxProcessing <= 0 {
		errs = append(errs, errors.New("max processing must be positive"))
	}
	return errs
}

// Delay is the nak delay after the delivered-th delivery failed.
func (p Policy) Delay(delivered int) time.Duration {
	i := max(delivered-1, 0)
	if i >= len(p.Redelivery) {
		i = len(p.Redelivery) - 1
	}
	return p.Redelivery[i]
}

// AckBackOff is the consumer's BackOff: the ack wait of each delivery, so
// that a message whose handler keeps dying (a crash, not an error) is
// redelivered at growing intervals. Its first value is AckWait; it is
// shorter than MaxDeliver, as JetStream requires.
func (p Policy) AckBackOff() []time.Duration {
	n := min(p.MaxDeliver-1, 5)
	out := make([]time.Duration, 0, n)
	d := p.AckWait
	for range n {
		out = append(out, d)
		d = min(d*2, 10*p.AckWait)
	}
	return out
}

// Horizon is the longest that the consumers may keep working on one
// message before they dead-letter it: every delivery may run for up to
// MaxProcessing, and between two deliveries JetStream waits the longer of
// the nak delay (a handler error: Delay) and the ack wait of that delivery
// (a handler that died: AckBackOff, its last value repeating). An order is
// not stuck while a message about it may still be redelivered, so the
// compensator's stuck deadlines must be longer than this.
func (p Policy) Horizon() time.Duration {
	h := time.Duration(p.MaxDeliver) * p.MaxProcessing
	backoff := p.AckBackOff()
	for d := 1; d < p.MaxDeliver; d++ {
		ack := p.AckWait
		if len(backoff) > 0 {
			ack = backoff[min(d-1, len(backoff)-1)]
		}
		nak := time.Duration(0)
		if len(p.Redelivery) > 0 {
			nak = p.Delay(d)
		}
		h += max(nak, ack)
	}
	return h
}

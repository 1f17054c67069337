package consumers

import (
	"errors"
	"fmt"
	"time"

	"orderpipe/shared/config"
)

// Environment variables of `orderpipe consumers`.
var (
	EnvAckWait    = config.Register("ORDERPIPE_CONSUMER_ACK_WAIT", "JetStream AckWait of the step consumers; in-progress acks go out every third of it", "30s")
	EnvMaxDeliver = config.Register("ORDERPIPE_CONSUMER_MAX_DELIVER", "deliveries of one message before it is dead-lettered", "8")
	EnvWorkers    = config.Register("ORDERPIPE_CONSUMER_WORKERS", "messages each step handles at once in one process", "8")
)

// Config is the router's behaviour on failures. The defaults (Default) are
// documented in the README's "Pipeline" section.
type Config struct {
	// AckWait is how long JetStream waits for an ack before redelivering
	// (first delivery; later ones wait longer, see BackOff in
	// consumerConfig). A live handler sends in-progress acks every third
	// of it.
	AckWait time.Duration
	// MaxDeliver bounds the deliveries of one message; the last failing
	// one dead-letters it.
	MaxDeliver int
	// Redelivery is the delay of the n-th redelivery after a handler
	// failed (the last value repeats).
	Redelivery []time.Duration
	// Retries are in-process retries of a transient failure before the
	// message is nacked; RetryInterval the first pause between them
	// (doubling, at most RetryMaxInterval).
	Retries          int
	RetryInterval    time.Duration
	RetryMaxInterval time.Duration
	// Workers is how many messages each step handles at once.
	Workers int
	// MaxAckPending bounds unacked messages per consumer across replicas.
	MaxAckPending int
	// MaxProcessing bounds one handler run.
	MaxProcessing time.Duration
	// DrainTimeout bounds the wait for in-flight messages on shutdown.
	DrainTimeout time.Duration
}

// Default returns the production settings.
func Default() Config {
	return Config{
		AckWait:          30 * time.Second,
		MaxDeliver:       8,
		Redelivery:       []time.Duration{time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second, 30 * time.Second, time.Minute, 2 * time.Minute},
		Retries:          2,
		RetryInterval:    100 * time.Millisecond,
		RetryMaxInterval: time.Second,
		Workers:          8,
		MaxAckPending:    1000,
		MaxProcessing:    2 * time.Minute,
		DrainTimeout:     20 * time.Second,
	}
}

// ConfigFromEnv returns Default with the environment's overrides; drain is
// the process's shutdown timeout.
func ConfigFromEnv(drain time.Duration) (Config, error) {
	c := Default()
	var errs []error
	var err error
	if c.AckWait, err = config.Duration(EnvAckWait, c.AckWait); err != nil {
		errs = append(errs, err)
	}
	if c.MaxDeliver, err = config.Int(EnvMaxDeliver, c.MaxDeliver, 2); err != nil {
		errs = append(errs, err)
	}
	if c.Workers, err = config.Int(EnvWorkers, c.Workers, 1); err != nil {
		errs = append(errs, err)
	}
	if drain > 0 {
		c.DrainTimeout = drain
	}
	if err := errors.Join(errs...); err != nil {
		return Config{}, err
	}
	return c, c.Validate()
}

// Validate checks that the settings make sense together.
func (c Config) Validate() error {
	var errs []error
	if c.AckWait < 100*time.Millisecond {
		errs = append(errs, fmt.Errorf("ack wait %s is shorter than 100ms", c.AckWait))
	}
	if c.MaxDeliver < 2 {
		errs = append(errs, fmt.Errorf("max deliver %d: want at least 2", c.MaxDeliver))
	}
	if len(c.Redelivery) == 0 {
		errs = append(errs, errors.New("redelivery schedule is empty"))
	}
	for _, d := range c.Redelivery {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("redelivery delay %s is not positive", d))
		}
	}
	if c.Retries < 0 || c.RetryInterval <= 0 || c.RetryMaxInterval < c.RetryInterval {
		errs = append(errs, fmt.Errorf("retries %d every %s..%s do not make sense", c.Retries, c.RetryInterval, c.RetryMaxInterval))
	}
	if c.Workers < 1 || c.MaxAckPending < c.Workers {
		errs = append(errs, fmt.Errorf("workers %d / max ack pending %d: want 1 <= workers <= max ack pending", c.Workers, c.MaxAckPending))
	}
	if c.MaxProcessing <= 0 || c.DrainTimeout <= 0 {
		errs = append(errs, errors.New("max processing and drain timeout must be positive"))
	}
	return errors.Join(errs...)
}

// redeliveryDelay is the nak delay after the delivered-th delivery failed.
func (c Config) redeliveryDelay(delivered int) time.Duration {
	i := max(delivered-1, 0)
	if i >= len(c.Redelivery) {
		i = len(c.Redelivery) - 1
	}
	return c.Redelivery[i]
}

// ackBackOff is the consumer's BackOff: the ack wait of each delivery, so
// that a message whose handler keeps dying (a crash, not an error) is
// redelivered at growing intervals. Its first value is AckWait; it is
// shorter than MaxDeliver, as JetStream requires.
func (c Config) ackBackOff() []time.Duration {
	n := min(c.MaxDeliver-1, 5)
	out := make([]time.Duration, 0, n)
	d := c.AckWait
	for range n {
		out = append(out, d)
		d = min(d*2, 10*c.AckWait)
	}
	return out
}

// RetryHorizon is the longest that the consumers may keep working on one
// message before they dead-letter it: every delivery may run for up to
// MaxProcessing, and between two deliveries JetStream waits the longer of
// the nak delay (a handler error: redeliveryDelay) and the ack wait of that
// delivery (a handler that died: ackBackOff, its last value repeating). An
// order is not stuck while a message about it may still be redelivered, so
// the compensator's stuck deadlines must be longer than this.
func (c Config) RetryHorizon() time.Duration {
	h := time.Duration(c.MaxDeliver) * c.MaxProcessing
	backoff := c.ackBackOff()
	for d := 1; d < c.MaxDeliver; d++ {
		ack := c.AckWait
		if len(backoff) > 0 {
			ack = backoff[min(d-1, len(backoff)-1)]
		}
		nak := time.Duration(0)
		if len(c.Redelivery) > 0 {
			nak = c.redeliveryDelay(d)
		}
		h += max(nak, ack)
	}
	return h
}

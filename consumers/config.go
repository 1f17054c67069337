package consumers

import (
	"errors"
	"fmt"
	"time"

	"orderpipe/shared/config"
	"orderpipe/shared/psp"
	"orderpipe/shared/redelivery"
)

// Environment variables of `orderpipe consumers`.
// EnvWorkers is the consumers' own variable; the redelivery policy's are in
// shared/redelivery.
var EnvWorkers = config.IntSetting("ORDERPIPE_CONSUMER_WORKERS", "messages each step handles at once in one process", 64, 1)

// Config is the router's configuration.
type Config struct {
	// Policy is how a message is redelivered (AckWait, MaxDeliver,
	// Redelivery, MaxProcessing).
	redelivery.Policy
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
	// DrainTimeout bounds the wait for in-flight messages on shutdown.
	DrainTimeout time.Duration

	// noDedupe skips the dedupe pre-check and the processed_messages row:
	// the cost of dedupe, measured by BenchmarkStep. Set only by the
	// tests (export_test.go); no configuration reaches it.
	noDedupe bool
}

// Default returns the production settings.
func Default() Config {
	return Config{
		Policy:           redelivery.Default(),
		Retries:          2,
		RetryInterval:    100 * time.Millisecond,
		RetryMaxInterval: time.Second,
		Workers:          EnvWorkers.Default,
		MaxAckPending:    1000,
		DrainTimeout:     20 * time.Second,
	}
}

// ConfigFromEnv returns Default with the environment's overrides; drain is
// the process's shutdown timeout. It checks ORDERPIPE_PSP_TIMEOUT too,
// which the payment step's client reads when Steps builds it, so that
// every setting of the process is checked before it connects.
func ConfigFromEnv(drain time.Duration) (Config, error) {
	c := Default()
	var err error
	c.Policy, err = redelivery.FromEnv()
	_, perr := psp.EnvTimeout.Get()
	err = errors.Join(err, EnvWorkers.Into(&c.Workers), perr)
	if drain > 0 {
		c.DrainTimeout = drain
	}
	if err != nil {
		return Config{}, err
	}
	return c, c.Validate()
}

// Validate checks that the settings make sense together.
func (c Config) Validate() error {
	errs := c.Check()
	if c.Retries < 0 || c.RetryInterval <= 0 || c.RetryMaxInterval < c.RetryInterval {
		errs = append(errs, fmt.Errorf("retries %d every %s..%s do not make sense", c.Retries, c.RetryInterval, c.RetryMaxInterval))
	}
	if c.Workers < 1 || c.MaxAckPending < c.Workers {
		errs = append(errs, fmt.Errorf("workers %d / max ack pending %d: want 1 <= workers <= max ack pending", c.Workers, c.MaxAckPending))
	}
	if c.DrainTimeout <= 0 {
		errs = append(errs, errors.New("drain timeout must be positive"))
	}
	return errors.Join(errs...)
}

package compensator

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/google/uuid"

	"orderpipe/shared/config"
	"orderpipe/shared/idemtoken"
	"orderpipe/shared/natsjs"
	"orderpipe/shared/order"
)

// Defaults of Config. The stuck deadlines are well past the consumers'
// redelivery horizon (a consumer still retrying an order is not stuck), and
// the dedupe retention outlives the duplicate window and the longest time an
// order can stay open before the compensator gives up on it.
const (
	DefaultStuckProcessing = 45 * time.Minute
	DefaultStuckReserved   = 45 * time.Minute
	DefaultStuckPaid       = 45 * time.Minute
	DefaultMaxAttempts     = 3
	DefaultInterval        = 30 * time.Second
	DefaultBatchSize       = 100
	DefaultDedupeRetention = 72 * time.Hour
	DefaultOutboxMinAge    = 30 * time.Second
	// DefaultOutboxRetention is how long a published event of a finished
	// order stays in the outbox (for orders inspect and the chaos
	// checker's duplicates) before the sweep deletes it.
	DefaultOutboxRetention = 72 * time.Hour
	// DefaultHealMinAge is how long an open order must have been idle
	// before its lost event is published again. Heal acts only on evidence
	// that the stream no longer holds the event, so it need not wait for
	// the outbox minimum age; the short wait lets a step that fetched the
	// event just before the loss commit first.
	DefaultHealMinAge      = 5 * time.Second
	DefaultSweepBatchSize  = 5000
	DefaultRepublishRounds = 100
	// DefaultConsumerHorizon is used when the caller does not say how long
	// the consumers may keep redelivering one message; it is
	// the RetryHorizon of the consumers' defaults, rounded up.
	DefaultConsumerHorizon = 40 * time.Minute
)

// Config is the compensator's configuration. The zero value of a field
// means its default; Validate reports what does not fit.
type Config struct {
	// StuckProcessing, StuckReserved and StuckPaid are how long an order
	// may stay in that state (since it entered it, or since its last
	// re-drive) before it counts as stuck.
	StuckProcessing time.Duration
	StuckReserved   time.Duration
	StuckPaid       time.Duration
	// MaxAttempts is how many times an order is re-driven in one state
	// before it is unwound. 0 means the default; use NoRedrive to unwind
	// at the first deadline.
	MaxAttempts int
	// Interval between passes of the daemon.
	Interval time.Duration
	// BatchSize is how many stuck orders one transaction claims.
	BatchSize int
	// SweepBatchSize is how many expired dedupe rows one DELETE removes.
	SweepBatchSize int
	// RepublishRounds bounds the relay batches of stale outbox rows one
	// pass publishes.
	RepublishRounds int
	// DedupeRetention is how long processed_messages rows are kept.
	DedupeRetention time.Duration
	// OutboxMinAge: outbox rows pending for longer are published again by
	// each pass.
	OutboxMinAge time.Duration
	// OutboxRetention is how long a published outbox row of an order that
	// is no longer open is kept before the sweep deletes it.
	OutboxRetention time.Duration
	// TokenRetention is how long an idempotency token that expired unused
	// is kept (answering "expired", counted as expired) before the sweep
	// deletes it.
	TokenRetention time.Duration
	// HealMinAge: an open order idle for longer whose last event the
	// stream no longer holds is healed (its event published again).
	HealMinAge time.Duration
	// ConsumerHorizon is how long the consumers may keep redelivering one
	// message (AckWait × MaxDeliver, or the sum of their backoff).
	ConsumerHorizon time.Duration
	// DuplicateWindow is the broker's duplicate window.
	DuplicateWindow time.Duration
	// Actor names this process in compensator_actions (host/pid/instance).
	Actor string
	// DryRun makes a pass read only: it reports what it would do.
	DryRun bool
	// Once: the compensator makes single passes (`--once`, `--dry-run`),
	// so the rule that the daemon's interval fits the deadlines does not
	// apply.
	Once bool
	// Force skips the check that the windows fit together (the deadlines
	// against the consumers' horizon, the dedupe retention against the
	// duplicate window). It is for an operator who knows that no consumer
	// is still retrying; every action a forced compensator takes is
	// recorded as forced in compensator_actions.
	Force bool
}

// NoRedrive as MaxAttempts unwinds a stuck order without re-driving it.
const NoRedrive = -1

// defaults holds the value that a zero field of Config stands for (the
// Actor aside: each process names itself, see DefaultActor).
var defaults = Config{
	StuckProcessing: DefaultStuckProcessing,
	StuckReserved:   DefaultStuckReserved,
	StuckPaid:       DefaultStuckPaid,
	MaxAttempts:     DefaultMaxAttempts,
	Interval:        DefaultInterval,
	BatchSize:       DefaultBatchSize,
	SweepBatchSize:  DefaultSweepBatchSize,
	RepublishRounds: DefaultRepublishRounds,
	DedupeRetention: DefaultDedupeRetention,
	OutboxMinAge:    DefaultOutboxMinAge,
	OutboxRetention: DefaultOutboxRetention,
	TokenRetention:  idemtoken.DefaultRetention,
	HealMinAge:      DefaultHealMinAge,
	ConsumerHorizon: DefaultConsumerHorizon,
	DuplicateWindow: natsjs.DuplicateWindow,
}

// withDefaults fills in zero fields.
func (c Config) withDefaults() Config {
	config.FillZero(&c, defaults)
	if c.Actor == "" {
		c.Actor = DefaultActor()
	}
	return c
}

// DefaultActor names this process: host/pid/random instance id.
func DefaultActor() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	return fmt.Sprintf("%s/%d/%s", host, os.Getpid(), uuid.NewString()[:8])
}

// Attempts is the number of re-drives per state before an unwind (MaxAttempts
// with NoRedrive read as 0).
func (c Config) Attempts() int {
	if c.MaxAttempts == NoRedrive {
		return 0
	}
	return c.MaxAttempts
}

// StuckAfter returns the deadline of an open status (0 for the others).
func (c Config) StuckAfter(s order.Status) time.Duration {
	switch s {
	case order.StatusProcessing:
		return c.StuckProcessing
	case order.StatusReserved:
		return c.StuckReserved
	case order.StatusPaid:
		return c.StuckPaid
	}
	return 0
}

// openStatuses are the states the compensator watches, in pipeline order.
var openStatuses = []order.Status{order.StatusProcessing, order.StatusReserved, order.StatusPaid}

// OpenHorizon is the longest an order can stay open before the compensator
// unwinds it: in each state, a deadline per re-drive plus the last one, plus
// one interval of lateness per deadline.
func (c Config) OpenHorizon() time.Duration {
	var h time.Duration
	for _, s := range openStatuses {
		h += time.Duration(c.Attempts()+1) * (c.StuckAfter(s) + c.Interval)
	}
	return h
}

// Validate fills in the defaults and checks that the values, and the
// windows they form with the broker's and the consumers', fit together.
func (c Config) Validate() (Config, error) {
	c = c.withDefaults()
	var errs []error
	for _, s := range openStatuses {
		if d := c.StuckAfter(s); d <= 0 {
			errs = append(errs, fmt.Errorf("stuck deadline of %s must be positive, got %s", s, d))
		} else if d <= c.ConsumerHorizon && !c.Force {
			errs = append(errs, fmt.Errorf("stuck deadline of %s (%s) must be longer than the consumers' redelivery horizon (%s): the compensator would re-drive orders that the consumers are still retrying", s, d, c.ConsumerHorizon))
		}
	}
	if c.MaxAttempts != NoRedrive && (c.MaxAttempts < 0 || c.MaxAttempts > 100) {
		errs = append(errs, fmt.Errorf("max attempts must be between 0 and 100, got %d", c.MaxAttempts))
	}
	minStuck := min(c.StuckProcessing, c.StuckReserved, c.StuckPaid)
	if c.Interval <= 0 {
		errs = append(errs, fmt.Errorf("interval must be positive, got %s", c.Interval))
	} else if minStuck > 0 && c.Interval > minStuck && !c.Once && !c.DryRun && !c.Force {
		errs = append(errs, fmt.Errorf("interval (%s) must not be longer than the shortest stuck deadline (%s)", c.Interval, minStuck))
	}
	if c.BatchSize < 1 || c.BatchSize > 10000 {
		errs = append(errs, fmt.Errorf("batch size must be between 1 and 10000, got %d", c.BatchSize))
	}
	if c.SweepBatchSize < 1 || c.RepublishRounds < 1 {
		errs = append(errs, fmt.Errorf("sweep batch size and republish rounds must be positive, got %d and %d", c.SweepBatchSize, c.RepublishRounds))
	}
	if c.OutboxMinAge <= 0 {
		errs = append(errs, fmt.Errorf("outbox minimum age must be positive, got %s", c.OutboxMinAge))
	} else if minStuck > 0 && c.OutboxMinAge >= minStuck && !c.Force {
		errs = append(errs, fmt.Errorf("outbox minimum age (%s) must be shorter than the shortest stuck deadline (%s): a pending event is published again before its order is re-driven", c.OutboxMinAge, minStuck))
	}
	if c.HealMinAge <= 0 {
		errs = append(errs, fmt.Errorf("heal minimum age must be positive, got %s", c.HealMinAge))
	}
	if c.ConsumerHorizon < 0 {
		errs = append(errs, fmt.Errorf("consumers' redelivery horizon must not be negative, got %s", c.ConsumerHorizon))
	}
	if c.DuplicateWindow <= 0 {
		errs = append(errs, fmt.Errorf("duplicate window must be positive, got %s", c.DuplicateWindow))
	}
	// A message may be redelivered up to ConsumerHorizon after it was
	// first handled, and republished with the same id (broker dedupe
	// forgets it after the duplicate window) while its order is open; its
	// dedupe row must still be there then.
	if need := max(c.DuplicateWindow, c.OpenHorizon()) + c.ConsumerHorizon; c.DedupeRetention < need && !c.Force {
		errs = append(errs, fmt.Errorf("dedupe retention (%s) must be at least %s: the longer of the duplicate window (%s) and the longest an order stays open before it is unwound (%s), plus the consumers' redelivery horizon (%s); a message redelivered or republished later would run its step again",
			c.DedupeRetention, need, c.DuplicateWindow, c.OpenHorizon(), c.ConsumerHorizon))
	}
	if len(c.Actor) > 200 {
		errs = append(errs, errors.New("actor must be at most 200 characters"))
	}
	if err := errors.Join(errs...); err != nil {
		return c, fmt.Errorf("compensator configuration does not fit: %w", err)
	}
	return c, nil
}

package compensator

import (
	"fmt"
	"time"

	"orderpipe/consumers"
)

// RedeliveryHorizon is the longest that the consumers may keep working on
// one message before they dead-letter it: every delivery may run for up to
// MaxProcessing, and between two deliveries JetStream waits the longer of
// the nak delay (a handler error, cfg.Redelivery) and the ack wait of that
// delivery (a handler that died: AckWait doubling up to 10×AckWait, over at
// most 5 steps, the last one repeating — the consumers' BackOff). An order
// is not stuck while a message about it may still be redelivered, so every
// stuck deadline must be longer than this.
func RedeliveryHorizon(cfg consumers.Config) time.Duration {
	h := time.Duration(cfg.MaxDeliver) * cfg.MaxProcessing
	backoff := cfg.AckWait
	steps := 0
	for d := 1; d < cfg.MaxDeliver; d++ {
		nak := time.Duration(0)
		if len(cfg.Redelivery) > 0 {
			nak = cfg.Redelivery[min(d-1, len(cfg.Redelivery)-1)]
		}
		h += max(nak, backoff)
		if steps < 4 {
			backoff = min(backoff*2, 10*cfg.AckWait)
			steps++
		}
	}
	return h
}

// ConsumerHorizon is RedeliveryHorizon of the consumers' configuration as
// this process's environment sets it (ORDERPIPE_CONSUMER_ACK_WAIT,
// ORDERPIPE_CONSUMER_MAX_DELIVER; the same variables as `orderpipe
// consumers` must be given to the compensator).
func ConsumerHorizon() (time.Duration, error) {
	cfg, err := consumers.ConfigFromEnv(0)
	if err != nil {
		return 0, fmt.Errorf("consumers' configuration: %w", err)
	}
	return RedeliveryHorizon(cfg), nil
}

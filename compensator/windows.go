package compensator

import (
	"fmt"
	"time"

	"orderpipe/consumers"
)

// ConsumerHorizon is the consumers' RetryHorizon with their configuration as
// this process's environment sets it (ORDERPIPE_CONSUMER_ACK_WAIT,
// ORDERPIPE_CONSUMER_MAX_DELIVER; the same variables as `orderpipe
// consumers` must be given to the compensator).
func ConsumerHorizon() (time.Duration, error) {
	cfg, err := consumers.ConfigFromEnv(0)
	if err != nil {
		return 0, fmt.Errorf("consumers' configuration: %w", err)
	}
	return cfg.RetryHorizon(), nil
}

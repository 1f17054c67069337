package compensator

import (
	"fmt"
	"time"

	"orderpipe/shared/redelivery"
)

// ConsumerHorizon is the consumers' redelivery horizon with their policy as
// this process's environment sets it (ORDERPIPE_CONSUMER_ACK_WAIT,
// ORDERPIPE_CONSUMER_MAX_DELIVER; the same variables as `orderpipe
// consumers` must be given to the compensator).
func ConsumerHorizon() (time.Duration, error) {
	p, err := redelivery.FromEnv()
	if err != nil {
		return 0, fmt.Errorf("consumers' redelivery policy: %w", err)
	}
	return p.Horizon(), nil
}

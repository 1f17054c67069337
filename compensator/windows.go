package compensator

import (
	"errors"
	"fmt"
	"time"

	"orderpipe/shared/psp"
	"orderpipe/shared/redelivery"
)

// SettingsFromEnv reads what the compensator takes from the environment
// when it starts, so that a bad value stops it before it connects: the
// consumers' redelivery horizon (ConsumerHorizon), which it returns, and
// the payment provider's timeout (ORDERPIPE_PSP_TIMEOUT), which it checks
// for the client built later.
func SettingsFromEnv() (horizon time.Duration, err error) {
	horizon, err = ConsumerHorizon()
	_, perr := psp.EnvTimeout.Get()
	return horizon, errors.Join(err, perr)
}

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

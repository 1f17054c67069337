package psp

import (
	"time"

	"orderpipe/shared/config"
)

// EnvTimeout is the per-attempt timeout of calls to the provider.
var EnvTimeout = config.DurationSetting("ORDERPIPE_PSP_TIMEOUT", "per-attempt timeout of calls to the payment provider (a timeout is retried with the same Idempotency-Key)", 10*time.Second)

// ClientFromEnv returns a client of cfg.PSPURL with ORDERPIPE_PSP_TIMEOUT.
func ClientFromEnv(cfg config.Config) (*Client, error) {
	if err := cfg.Require(config.EnvPSPURL); err != nil {
		return nil, err
	}
	timeout, err := EnvTimeout.Get()
	if err != nil {
		return nil, err
	}
	return NewClient(cfg.PSPURL, timeout), nil
}

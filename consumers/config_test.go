package consumers_test

import (
	"testing"
	"time"

	"orderpipe/consumers"
	"orderpipe/shared/redelivery"
)

// TestConfigFromEnv is not parallel: it sets environment variables.
func TestConfigFromEnv(t *testing.T) {
	c, err := consumers.ConfigFromEnv(5 * time.Second)
	if err != nil || c.AckWait != 30*time.Second || c.MaxDeliver != 8 || c.DrainTimeout != 5*time.Second {
		t.Fatalf("defaults: %+v, %v", c, err)
	}
	t.Setenv(redelivery.EnvAckWait.Name, "1s")
	t.Setenv(redelivery.EnvMaxDeliver.Name, "3")
	t.Setenv(consumers.EnvWorkers.Name, "2")
	if c, err := consumers.ConfigFromEnv(0); err != nil || c.AckWait != time.Second || c.MaxDeliver != 3 || c.Workers != 2 {
		t.Fatalf("overrides: %+v, %v", c, err)
	}
	for name, bad := range map[string][]string{
		redelivery.EnvAckWait.Name:    {"soon", "-1s", "0", "10ms"},
		redelivery.EnvMaxDeliver.Name: {"1", "many", "-8"},
		consumers.EnvWorkers.Name:     {"0", "x", "5000"},
	} {
		for _, v := range bad {
			t.Run(name+"="+v, func(t *testing.T) {
				t.Setenv(name, v)
				if _, err := consumers.ConfigFromEnv(0); err == nil {
					t.Errorf("%s=%q accepted", name, v)
				}
			})
		}
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	for name, mutate := range map[string]func(*consumers.Config){
		"empty redelivery":  func(c *consumers.Config) { c.Redelivery = nil },
		"negative delay":    func(c *consumers.Config) { c.Redelivery = []time.Duration{-time.Second} },
		"no workers":        func(c *consumers.Config) { c.Workers = 0 },
		"retry intervals":   func(c *consumers.Config) { c.RetryMaxInterval = c.RetryInterval / 2 },
		"no max processing": func(c *consumers.Config) { c.MaxProcessing = 0 },
		"one delivery":      func(c *consumers.Config) { c.MaxDeliver = 1 },
	} {
		c := consumers.Default()
		mutate(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if err := consumers.Default().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
}

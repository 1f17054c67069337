package compensator_test

import (
	"testing"
	"time"

	"orderpipe/compensator"
	"orderpipe/shared/redelivery"
)

func TestDefaultsFitTheConsumersDefaults(t *testing.T) {
	t.Parallel()
	h := redelivery.Default().Horizon()
	// 8 deliveries of up to 2m, then waits of max(nak, ack backoff):
	// 30s, 1m, 2m, 4m, 5m, 5m, 5m.
	if want := 16*time.Minute + 22*time.Minute + 30*time.Second; h != want {
		t.Fatalf("horizon %s, want %s", h, want)
	}
	if h > compensator.DefaultConsumerHorizon {
		t.Fatalf("DefaultConsumerHorizon %s is shorter than the consumers' default horizon %s", compensator.DefaultConsumerHorizon, h)
	}
	cfg, err := compensator.Config{ConsumerHorizon: h}.Validate()
	if err != nil {
		t.Fatalf("the defaults do not fit the consumers' defaults: %v", err)
	}
	if cfg.StuckPaid <= h {
		t.Fatal("deadline inside the horizon")
	}
	c := redelivery.Default()
	c.MaxDeliver = 20
	c.AckWait = time.Minute
	if _, err := (compensator.Config{ConsumerHorizon: c.Horizon()}).Validate(); err == nil {
		t.Fatal("a longer consumer horizon should not fit the default deadlines")
	}
}

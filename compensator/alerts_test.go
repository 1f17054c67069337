package compensator_test

import (
	"os"
	"regexp"
	"strconv"
	"testing"
	"time"

	"orderpipe/compensator"
)

// TestAlertThresholdsFollowTheDefaults keeps the alert rules that are
// about the compensator's timing in step with its defaults: an open order
// is an alert only once it is older than the longest the compensator lets
// an order stay open (the rule fired at 1h, while an order may be open for
// hours before it is unwound by design), and "no completed pass" waits
// for many passes of the default interval.
func TestAlertThresholdsFollowTheDefaults(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../deploy/prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	threshold := func(re string) time.Duration {
		t.Helper()
		m := regexp.MustCompile(re).FindSubmatch(b)
		if m == nil {
			t.Fatalf("alerts.yml has no %s", re)
		}
		n, err := strconv.Atoi(string(m[1]))
		if err != nil {
			t.Fatal(err)
		}
		return time.Duration(n) * time.Second
	}
	cfg, err := compensator.Config{}.Validate()
	if err != nil {
		t.Fatal(err)
	}
	if got, horizon := threshold(`max\(orderpipe_oldest_open_order_age_seconds\) > (\d+)`), cfg.OpenHorizon(); got < horizon || got > horizon+2*time.Hour {
		t.Errorf("OrderpipeOldestOpenOrderOld fires at %s; the compensator's defaults keep an order open up to %s", got, horizon)
	}
	if got := threshold(`time\(\) - max\(orderpipe_compensator_last_success_timestamp_seconds\) > (\d+)`); got < 10*cfg.Interval {
		t.Errorf("OrderpipeCompensatorNotRunning fires after %s without a completed pass, fewer than 10 passes of %s", got, cfg.Interval)
	}
}

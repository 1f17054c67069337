package metrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestNamesFollowPrometheusStyle(t *testing.T) {
	names := Names()
	if len(names) < len(Collectors()) {
		t.Fatalf("names: %v", names)
	}
	for n := range names {
		if !strings.HasPrefix(n, "orderpipe_") {
			t.Errorf("%s lacks the orderpipe_ prefix", n)
		}
	}
	if !names["orderpipe_intake_requests_total"] || !names["orderpipe_handler_duration_seconds_bucket"] {
		t.Fatalf("missing expected names: %v", names)
	}
}

// TestCompensatorGaugesAreExportedOnceSet: a value that only the
// compensator measures is absent from the /metrics of a process that never
// set it (a producer, the consumers, a compensator before its first pass).
// Every process registers every collector; a plain gauge was exported at
// 0 by all of them, which hid a dead compensator from max() and fired any
// "== 0" rule on the producers' series.
func TestCompensatorGaugesAreExportedOnceSet(t *testing.T) {
	exported := func() map[string]float64 {
		reg := prometheus.NewPedanticRegistry()
		reg.MustRegister(Collectors()...)
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]float64{}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				out[mf.GetName()] = m.GetGauge().GetValue()
			}
		}
		return out
	}
	lazy := []string{"orderpipe_oldest_open_order_age_seconds", "orderpipe_compensator_broker_up",
		"orderpipe_compensator_last_success_timestamp_seconds", "orderpipe_refunds_due",
		"orderpipe_oldest_refund_due_age_seconds", "orderpipe_outbox_oldest_pending_age_seconds"}
	got := exported()
	for _, name := range lazy {
		if !Names()[name] {
			t.Errorf("%s is not among the names", name)
		}
		if v, ok := got[name]; ok {
			t.Errorf("%s exported (%v) by a process that never set it", name, v)
		}
	}
	CompensatorBrokerUp.Set(0)
	t.Cleanup(CompensatorBrokerUp.vec.Reset) // unset again: the test can run twice in a process (-count)
	if v, ok := exported()["orderpipe_compensator_broker_up"]; !ok || v != 0 {
		t.Errorf("orderpipe_compensator_broker_up once set to 0: %v (exported %v)", v, ok)
	}
}

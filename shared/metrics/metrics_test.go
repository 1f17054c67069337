package metrics

import (
	"strings"
	"testing"
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

package metrics

import (
	"encoding/json"
	"os"
	"regexp"
	"testing"
)

var metricRef = regexp.MustCompile(`\borderpipe_[a-z0-9_]+`)

// TestDeployReferencesOnlyExportedMetrics keeps the alert rules and the
// dashboard in step with the code: every orderpipe_* name they use must be
// one this package exports.
func TestDeployReferencesOnlyExportedMetrics(t *testing.T) {
	names := Names()
	for _, path := range []string{"../../deploy/prometheus/alerts.yml", "../../deploy/grafana/orderpipe.json"} {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		refs := metricRef.FindAllString(string(b), -1)
		if len(refs) == 0 {
			t.Errorf("%s references no orderpipe metric", path)
		}
		for _, r := range refs {
			if !names[r] {
				t.Errorf("%s references %s, which the code does not export", path, r)
			}
		}
	}
	var dash struct {
		Panels []struct {
			Targets []struct{ Expr string } `json:"targets"`
		} `json:"panels"`
	}
	b, _ := os.ReadFile("../../deploy/grafana/orderpipe.json")
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("dashboard is not JSON: %v", err)
	}
	if len(dash.Panels) == 0 {
		t.Fatal("dashboard has no panels")
	}
}

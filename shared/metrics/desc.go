package metrics

import (
	"regexp"

	"github.com/prometheus/client_golang/prometheus"
)

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

// descName extracts the metric name from a Desc (client_golang keeps it
// unexported; its String form is stable: Desc{fqName: "...", ...}).
func descName(d *prometheus.Desc) string {
	if m := fqName.FindStringSubmatch(d.String()); m != nil {
		return m[1]
	}
	return ""
}

package producer_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"orderpipe/producer"
)

// TestIntakeRefusesUndeliverableCallbacks sends, with private callbacks
// off, every callback URL that delivery refuses: the intake answers 400
// with the field named, and stores nothing. (Before one rule served both,
// the intake accepted CGNAT, TEST-NET, NAT64, 6to4, zoned and WHATWG
// numeric hosts with 202, and delivery then failed for hours.)
func TestIntakeRefusesUndeliverableCallbacks(t *testing.T) {
	t.Parallel()
	h := setup(t, producer.Options{})
	for i, u := range []string{
		"https://100.64.0.1/h",        // CGNAT
		"https://192.0.2.1/h",         // TEST-NET-1
		"https://198.51.100.1/h",      // TEST-NET-2
		"https://203.0.113.1/h",       // TEST-NET-3
		"https://198.18.0.1/h",        // benchmarking
		"https://240.0.0.1/h",         // reserved
		"https://0.1.2.3/h",           // this network
		"https://[64:ff9b::7f00:1]/h", // NAT64
		"https://[2002:7f00:1::]/h",   // 6to4
		"https://[2001:db8::1]/h",     // documentation
		"https://[fe80::1%25eth0]/h",  // link-local with a zone
		"https://0x7f000001/h",        // WHATWG numeric hosts
		"https://2130706433/h",
		"https://017700000001/h",
		"https://127.1/h",
		"https://shop.1/h",
		"https://127.0.0.1/h", // refused before too
		"https://localhost/h",
	} {
		rid := "cb-" + string(rune('a'+i))
		body := strings.TrimSuffix(orderBody(rid), "}") + `,"callback_url":` + quote(u) + `}`
		r := h.post(body)
		if r.status != http.StatusBadRequest || r.code(t) != 201 {
			t.Errorf("%s: got %d code %d, want 400 code 201: %s", u, r.status, r.code(t), r.body)
			continue
		}
		if !strings.Contains(string(r.body), "callback_url") {
			t.Errorf("%s: the problem does not name callback_url: %s", u, r.body)
		}
	}
	h.wantCount(0, `SELECT count(*) FROM orders`)
	// A public literal and a name still pass.
	for i, u := range []string{"https://8.8.8.8/h", "https://shop.example/h?token=x"} {
		body := strings.TrimSuffix(orderBody("cb-ok-"+string(rune('a'+i))), "}") + `,"callback_url":` + quote(u) + `}`
		if r := h.post(body); r.status != http.StatusAccepted {
			t.Errorf("%s: %d %s", u, r.status, r.body)
		}
	}
}

func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

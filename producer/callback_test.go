package producer_test

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"orderpipe/producer"
	"orderpipe/shared/tooling/testenv"
)

// TestIntakeRefusesUndeliverableCallbacks sends, with private callbacks
// off, every callback URL that delivery refuses: the intake answers 400
// with the field named, and stores nothing. (Before one rule served both,
// the intake accepted CGNAT, TEST-NET, NAT64, 6to4, zoned and WHATWG
// numeric hosts with 202, and delivery then failed for hours.)
func TestIntakeRefusesUndeliverableCallbacks(t *testing.T) {
	t.Parallel()
	h := setup(t, producer.Options{})
	for i, u := range testenv.RefusedCallbackURLs() {
		rid := "cb-" + strconv.Itoa(i)
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

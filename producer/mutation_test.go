package producer_test

import (
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"

	"orderpipe/producer"
)

// Hundreds of mangled bodies against the real intake: none gets a 5xx (a
// client mistake is never the server's error), and only 202s write rows.
func TestMangledBodiesNeverGet5xx(t *testing.T) {
	t.Parallel()
	h := setup(t, roomy)
	seeds := []string{
		orderBody("m"),
		`{"request_id":"m2","user_id":9223372036854775807,"items":[{"sku":"a.b_c-d","quantity":10000}],"amount":99999999999999.99,"currency":"JPY","callback_url":"https://x.example/h?q=1"}`,
		`{"request_id":"m3","user_id":1,"items":[{"sku":"A","quantity":1},{"sku":"B","quantity":2}],"amount":"0.01","currency":"KWD"}`,
	}
	pieces := []string{`"`, `\u0000`, `\\`, `{`, `}`, `[`, `]`, `,`, `:`, `null`, `-`, `1e400`, `0.001`, `9223372036854775808`,
		"\x00", "\xff", `"request_id"`, `"amount"`, `"items"`, `ü`, ` `, `""`, `true`, `[]`, `{}`, `http://`, `%00`, `\ud800`}
	rng := rand.New(rand.NewPCG(1, 2))
	created := 0
	for i := range 400 {
		b := []byte(seeds[rng.IntN(len(seeds))])
		for range 1 + rng.IntN(3) {
			pos := rng.IntN(len(b) + 1)
			switch rng.IntN(3) {
			case 0: // insert a piece
				p := pieces[rng.IntN(len(pieces))]
				b = append(b[:pos:pos], append([]byte(p), b[pos:]...)...)
			case 1: // delete a run
				end := min(len(b), pos+1+rng.IntN(8))
				b = append(b[:pos:pos], b[end:]...)
			case 2: // flip a byte
				if pos < len(b) {
					b[pos] ^= byte(1 + rng.IntN(255))
				}
			}
		}
		body := string(b)
		headers := []string{}
		if rng.IntN(4) == 0 {
			headers = append(headers, producer.HeaderIdempotencyKey, []string{"k", "m", "a b", "", strings.Repeat("k", 65), "m2"}[rng.IntN(6)])
		}
		r := h.post(body, headers...)
		if r.status >= 500 {
			t.Fatalf("mutation %d got %d: %s\nbody: %q", i, r.status, r.body, body)
		}
		switch r.status {
		case http.StatusAccepted:
			created++
		case http.StatusOK, http.StatusBadRequest, http.StatusUnprocessableEntity:
		default:
			t.Fatalf("mutation %d got %d: %s\nbody: %q", i, r.status, r.body, body)
		}
	}
	h.wantCount(created, `SELECT count(*) FROM orders`)
	t.Logf("%d of 400 mangled bodies were still valid orders", created)
}

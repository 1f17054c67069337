package outbox

import (
	"encoding/json"
	"maps"
	"math/rand/v2"
	"testing"
)

// headersJSON writes what json.Marshal writes for the same map: the same
// object for plain values, and json.Marshal's own bytes for any other.
func TestHeadersJSONIsJSONMarshal(t *testing.T) {
	cases := []map[string]string{
		{},
		{"Nats-Msg-Id": "0198f2c4-5a00-7c6e-88b6-cddb3ed2336a:order.accepted", "traceparent": "00-01020300000000000000000000000000-0405000000000000-01"},
		{"a": `quote"d`}, {"a": `back\slash`}, {"a": "<b>&amp;"}, {"a": "tab\there"}, {"a": "ünï"}, {"a": "\x7f"}, {`k"ey`: "v"}, {"a": ""}, {"": "v"},
	}
	rng := rand.New(rand.NewPCG(3, 4))
	const alphabet = "Az09-:._ \"\\<>&\t\x01\x7fé"
	for range 500 {
		m := map[string]string{}
		for range rng.IntN(5) {
			k, v := make([]byte, rng.IntN(6)), make([]byte, rng.IntN(12))
			for i := range k {
				k[i] = alphabet[rng.IntN(len(alphabet))]
			}
			for i := range v {
				v[i] = alphabet[rng.IntN(len(alphabet))]
			}
			m[string(k)] = string(v)
		}
		cases = append(cases, m)
	}
	for _, m := range cases {
		got, err := headersJSON(m)
		if err != nil {
			t.Fatalf("%q: %v", m, err)
		}
		want, _ := json.Marshal(m)
		var back map[string]string
		if !json.Valid(got) || json.Unmarshal(got, &back) != nil || !maps.Equal(back, m) && string(got) != string(want) {
			t.Fatalf("%q: headersJSON %s, json.Marshal %s", m, got, want)
		}
	}
}

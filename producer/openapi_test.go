package producer_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"orderpipe/producer"
	"orderpipe/producer/problem"
)

type opKey struct{ method, path string }

func documented(t *testing.T) map[opKey][]int {
	t.Helper()
	var doc struct {
		OpenAPI string `json:"openapi"`
		Paths   map[string]map[string]struct {
			Responses map[string]any `json:"responses"`
			// Extra marks an operation added through Options.Extra.
			Extra bool `json:"x-orderpipe-extra"`
		} `json:"paths"`
	}
	if err := json.Unmarshal(producer.OpenAPI(), &doc); err != nil {
		t.Fatalf("openapi.json: %v", err)
	}
	if !strings.HasPrefix(doc.OpenAPI, "3.1") {
		t.Fatalf("openapi %q, want 3.1.x", doc.OpenAPI)
	}
	out := map[opKey][]int{}
	for path, ops := range doc.Paths {
		for method, op := range ops {
			if method == "parameters" || op.Extra {
				continue // routes added through Options.Extra are tested where they are written
			}
			var st []int
			for code := range op.Responses {
				n, err := strconv.Atoi(code)
				if err != nil {
					t.Fatalf("%s %s: response %q is not a status", method, path, code)
				}
				st = append(st, n)
			}
			sort.Ints(st)
			out[opKey{strings.ToUpper(method), path}] = st
		}
	}
	return out
}

// The document and the router list the same operations with the same
// statuses, and a tour of real requests produces exactly those statuses.
func TestOpenAPIAgreesWithTheRouter(t *testing.T) {
	t.Parallel()
	doc := documented(t)
	routed := map[opKey][]int{}
	for _, r := range producer.Routes() {
		st := append([]int(nil), r.Statuses...)
		sort.Ints(st)
		routed[opKey{r.Method, r.Pattern}] = st
	}
	for k, st := range doc {
		if got, ok := routed[k]; !ok {
			t.Errorf("documented %s %s is not routed", k.method, k.path)
		} else if !slices.Equal(got, st) {
			t.Errorf("%s %s: documented statuses %v, router %v", k.method, k.path, st, got)
		}
	}
	for k := range routed {
		if _, ok := doc[k]; !ok {
			t.Errorf("routed %s %s is not documented", k.method, k.path)
		}
	}

	// The tour.
	seen := map[opKey]map[int]bool{}
	see := func(k opKey, r response) {
		if seen[k] == nil {
			seen[k] = map[int]bool{}
		}
		seen[k][r.status] = true
	}
	post, byRID, byID, spec := opKey{"POST", "/v1/orders"}, opKey{"GET", "/v1/orders"}, opKey{"GET", "/v1/orders/{order_id}"}, opKey{"GET", "/openapi.json"}
	tok := opKey{"POST", "/v1/idempotency-tokens"}

	h := setup(t, producer.Options{})
	r := h.post(orderBody("tour"))
	see(post, r)
	id := r.json(t)["order_id"].(string)
	see(post, h.post(orderBody("tour")))
	see(post, h.post(`{}`))
	see(post, h.post(`{"pad":"`+strings.Repeat("x", producer.MaxBodyBytes)+`"}`))
	see(post, h.post(orderBody("tour"), "Content-Type", "text/plain"))
	see(post, h.post(strings.Replace(orderBody("tour"), "39.98", "1.00", 1)))
	see(byRID, h.do("GET", "/v1/orders?request_id=tour", ""))
	see(byRID, h.do("GET", "/v1/orders", ""))
	see(byRID, h.do("GET", "/v1/orders?request_id=none", ""))
	see(byID, h.do("GET", "/v1/orders/"+id, ""))
	see(byID, h.do("GET", "/v1/orders/"+uuid.NewString(), ""))
	see(spec, h.do("GET", "/openapi.json", "", "Authorization", "-"))
	issued := h.do("POST", "/v1/idempotency-tokens", "")
	see(tok, issued)
	see(tok, h.do("POST", "/v1/idempotency-tokens", `{"ttl":60}`))
	see(tok, h.do("POST", "/v1/idempotency-tokens", `{"pad":"`+strings.Repeat("x", producer.MaxBodyBytes)+`"}`))
	see(tok, h.do("POST", "/v1/idempotency-tokens", `{}`, "Content-Type", "text/plain"))
	see(tok, h.do("POST", "/v1/idempotency-tokens", "", "Authorization", "-"))
	held := issued.json(t)["token"].(string)
	if _, err := h.pool.Exec(t.Context(), `UPDATE idempotency_tokens SET state = 'processing', claimed_until = now() + interval '1 hour' WHERE token = $1`, held); err != nil {
		t.Fatal(err)
	}
	see(post, h.post(orderBody(held)))
	guarded := map[opKey]func(hh *harness) response{
		post:  func(hh *harness) response { return hh.post(orderBody("tour-g")) },
		byRID: func(hh *harness) response { return hh.do("GET", "/v1/orders?request_id=tour", "") },
		byID:  func(hh *harness) response { return hh.do("GET", "/v1/orders/"+id, "") },
		tok:   func(hh *harness) response { return hh.do("POST", "/v1/idempotency-tokens", "") },
	}
	see(post, h.post(orderBody("tour"), "Authorization", "-"))
	see(byRID, h.do("GET", "/v1/orders?request_id=tour", "", "Authorization", "-"))
	see(byID, h.do("GET", "/v1/orders/"+id, "", "Authorization", "-"))
	limited := setup(t, producer.Options{RateLimit: 0.001, RateBurst: 1})
	limited.do("GET", "/v1/orders/"+id, "") // takes the only token
	late := setup(t, producer.Options{Timeout: time.Nanosecond})
	broken := setup(t, producer.Options{})
	if _, err := broken.pool.Exec(t.Context(), `DROP TABLE order_events, orders, idempotency_tokens CASCADE`); err != nil {
		t.Fatal(err)
	}
	for k, send := range guarded {
		for _, want := range []struct {
			hh     *harness
			status int
		}{{limited, 429}, {late, 503}, {broken, 500}} {
			r := send(want.hh)
			if r.status != want.status {
				t.Errorf("%s %s: got %d, want %d: %s", k.method, k.path, r.status, want.status, r.body)
			}
			if e, _ := problem.Lookup(problem.Code(r.code(t))); e.Status != r.status {
				t.Errorf("%s %s: status %d with code %d", k.method, k.path, r.status, r.code(t))
			}
			see(k, r)
		}
	}
	for k, st := range doc {
		var got []int
		for s := range seen[k] {
			got = append(got, s)
		}
		sort.Ints(got)
		if !slices.Equal(got, st) {
			t.Errorf("%s %s: the tour produced %v, the document lists %v", k.method, k.path, got, st)
		}
	}
}

// Every code of the problem table is described in the document.
func TestOpenAPIListsEveryCode(t *testing.T) {
	t.Parallel()
	doc := string(producer.OpenAPI())
	for _, e := range problem.Table() {
		if !strings.Contains(doc, fmt.Sprintf("%d %s", e.Code, strings.ReplaceAll(e.Slug, "-", " "))) &&
			!strings.Contains(doc, fmt.Sprintf("code %d", e.Code)) {
			t.Errorf("code %d (%s) is not in openapi.json", e.Code, e.Slug)
		}
	}
}

package stock_test

import (
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"

	"orderpipe/shared/order"
	"orderpipe/shared/stock"
)

// TestValidSKUIsTheOrdersRule checks that `inventory set` accepts exactly
// the SKUs an order can name (order.SKUPattern): stock set for any other
// SKU could never be reserved.
func TestValidSKUIsTheOrdersRule(t *testing.T) {
	t.Parallel()
	rule := regexp.MustCompile(order.SKUPattern)
	cases := []string{"", "SKU-1", "a.b_c-d", "SKU:1", "SKU 1", "SKU/1", "ü", strings.Repeat("S", 64), strings.Repeat("S", 65)}
	const alphabet = "Az09._-: /\x00é"
	rng := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		b := make([]byte, rng.IntN(70))
		for i := range b {
			b[i] = alphabet[rng.IntN(len(alphabet))]
		}
		cases = append(cases, string(b))
	}
	for _, sku := range cases {
		if got, want := stock.ValidSKU(sku) == nil, rule.MatchString(sku); got != want {
			t.Errorf("ValidSKU(%q) accepts: %v, the order's rule: %v", sku, got, want)
		}
	}
}

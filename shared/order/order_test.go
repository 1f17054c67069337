package order

import (
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestValidateRequestID(t *testing.T) {
	t.Parallel()
	good := []string{"a", "ORD20261202143022a3f9c1", "x.y_z:1-2", strings.Repeat("a", 64)}
	bad := []string{"", " ", "a b", strings.Repeat("a", 65), "ü", "a/b", "a\n"}
	for _, s := range good {
		if err := ValidateRequestID(s); err != nil {
			t.Errorf("ValidateRequestID(%q) = %v, want nil", s, err)
		}
	}
	for _, s := range bad {
		if err := ValidateRequestID(s); err == nil {
			t.Errorf("ValidateRequestID(%q) = nil, want error", s)
		}
	}
}

func TestGeneratedIDsFollowTheRule(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 2, 14, 30, 22, 123e6, time.UTC)
	rid := NewRequestID(now)
	if err := ValidateRequestID(rid); err != nil || !strings.HasPrefix(rid, "ORD20261202143022") || len(rid) != 33 {
		t.Fatalf("NewRequestID = %q (%v)", rid, err)
	}
	no := NewOrderNo(now)
	if !strings.HasPrefix(no, "ORD20261202143022123") || len(no) != 28 {
		t.Fatalf("NewOrderNo = %q", no)
	}
	if NewOrderNo(now) == no {
		t.Fatal("two order numbers in the same millisecond are equal")
	}
}

func TestTransitions(t *testing.T) {
	t.Parallel()
	for _, s := range Statuses() {
		if !s.Valid() {
			t.Errorf("%s not valid", s)
		}
		if s.Terminal() && len(transitions[s]) > 0 {
			t.Errorf("terminal %s has transitions", s)
		}
	}
	if err := CheckTransition(StatusConfirmed, StatusProcessing); err == nil {
		t.Error("confirmed → processing allowed")
	}
	if err := CheckTransition(StatusPaid, StatusReserved); err == nil {
		t.Error("paid → reserved allowed (backwards)")
	}
	if err := CheckTransition(StatusProcessing, StatusReserved); err != nil {
		t.Error(err)
	}
	if Status("shipped").Valid() {
		t.Error("unknown status valid")
	}
}

// The rules' regular expressions, the oracles of the validators' loops.
var requestIDRe, skuRe = regexp.MustCompile(RequestIDPattern), regexp.MustCompile(SKUPattern)

// FuzzKeyChars checks the loop that validates request_ids and SKUs against
// the regular expressions that document them (RequestIDPattern,
// SKUPattern), which the OpenAPI document and the MCP schema publish.
func FuzzKeyChars(f *testing.F) {
	for _, s := range []string{"", "a", "ORD20261202143022a3f9c1", "x.y_z:1-2", "SKU-1", "a b", "ü", "a\n", "a:b",
		strings.Repeat("a", 64), strings.Repeat("a", 65), strings.Repeat("a", 63) + "é"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := ValidateRequestID(s) == nil, requestIDRe.MatchString(s); got != want {
			t.Errorf("request_id %q: valid=%t, %s says %t", s, got, RequestIDPattern, want)
		}
		if got, want := keyChars(s, MaxSKULen, 0), skuRe.MatchString(s); got != want {
			t.Errorf("sku %q: valid=%t, %s says %t", s, got, SKUPattern, want)
		}
	})
}

// TestAmountPatternHoldsEveryAmount: every string ParseAmount accepts has
// the published form (AmountPattern), so a schema that checks the form
// refuses no amount the intake takes; the value rules stay ParseAmount's.
func TestAmountPatternHoldsEveryAmount(t *testing.T) {
	re := regexp.MustCompile(AmountPattern)
	cases := []string{"1", "1.5", "1.50", "1.500", "0039.98", "00.01", "99999999999999.99", "1.234", "0", "-1", "1e2", ".5", "5.", " 1"}
	rng := rand.New(rand.NewPCG(1, 2))
	const alphabet = "0123456789.-e+ "
	for range 20000 {
		b := make([]byte, 1+rng.IntN(10))
		for i := range b {
			b[i] = alphabet[rng.IntN(len(alphabet))]
		}
		cases = append(cases, string(b))
	}
	accepted := 0
	for _, s := range cases {
		if _, err := ParseAmount(s); err == nil {
			accepted++
			if !re.MatchString(s) {
				t.Errorf("ParseAmount accepts %q, which %s refuses", s, AmountPattern)
			}
		}
	}
	if accepted < 100 {
		t.Fatalf("only %d amounts accepted: the cases test nothing", accepted)
	}
}

// TestNewRequestIDsDoNotCollide: a client that lets NewRequestID name its
// orders gets a distinct request_id for each, also for many orders within
// one second: a collision makes the second order a 422 (another payload)
// or a replay of the first (the same payload), and that order is lost.
// Six hex digits (24 bits) collided about n²/2^25 times per second: for
// 100,000 ids in one second, hundreds of times.
func TestNewRequestIDsDoNotCollide(t *testing.T) {
	now := time.Date(2026, 12, 2, 14, 30, 22, 0, time.UTC)
	seen := make(map[string]bool, 100000)
	for range 100000 {
		id := NewRequestID(now)
		if err := ValidateRequestID(id); err != nil {
			t.Fatalf("%q: %v", id, err)
		}
		if seen[id] {
			t.Fatalf("request_id %q generated twice in one second (of %d)", id, len(seen))
		}
		seen[id] = true
	}
}

package idemtoken_test

import (
	"strings"
	"testing"
	"time"

	"orderpipe/shared/idemtoken"
)

// EnvTTL takes a duration from 1s to 24h; anything else names the
// variable and the value. Not parallel: it sets the environment.
func TestEnvTTL(t *testing.T) {
	for v, want := range map[string]time.Duration{"": idemtoken.DefaultTTL, "1s": time.Second, " 90s ": 90 * time.Second, "24h": idemtoken.MaxTTL} {
		t.Setenv(idemtoken.EnvTTL.Name, v)
		if got, err := idemtoken.EnvTTL.Get(); err != nil || got != want {
			t.Errorf("%s=%q: %s, %v; want %s", idemtoken.EnvTTL.Name, v, got, err, want)
		}
	}
	for _, v := range []string{"1ms", "0.5s", "999ms", "25h", "24h0m1s", "soon", "-1s", "0", "15"} {
		t.Setenv(idemtoken.EnvTTL.Name, v)
		got, err := idemtoken.EnvTTL.Get()
		if err == nil || !strings.Contains(err.Error(), idemtoken.EnvTTL.Name) || !strings.Contains(err.Error(), `"`+v+`"`) || !strings.Contains(err.Error(), "between 1s and 24h") {
			t.Errorf("%s=%q: %s, %v; want an error naming the variable, the value and the bounds", idemtoken.EnvTTL.Name, v, got, err)
		}
	}
}

package webhook_test

import (
	"strings"
	"testing"
	"time"

	"orderpipe/consumers/webhook"
)

// SettingsFromEnv reads the delivery worker's three variables, names every
// malformed one with its value, and refuses more sends per client than in
// all; left unset, the per-client bound follows a lower concurrency. Not
// parallel: it sets the environment.
func TestSettingsFromEnv(t *testing.T) {
	conc, per, timeout := webhook.EnvConcurrency.Name, webhook.EnvPerClient.Name, webhook.EnvTimeout.Name
	for _, c := range []struct {
		env  map[string]string
		want webhook.Settings
	}{
		{nil, webhook.Settings{Concurrency: 32, PerClient: 4, Timeout: 10 * time.Second}},
		{map[string]string{conc: "8", per: "8", timeout: "250ms"}, webhook.Settings{Concurrency: 8, PerClient: 8, Timeout: 250 * time.Millisecond}},
		{map[string]string{conc: "2"}, webhook.Settings{Concurrency: 2, PerClient: 2, Timeout: 10 * time.Second}},
		{map[string]string{conc: "1", per: " "}, webhook.Settings{Concurrency: 1, PerClient: 1, Timeout: 10 * time.Second}},
	} {
		for _, n := range []string{conc, per, timeout} {
			t.Setenv(n, c.env[n])
		}
		if got, err := webhook.SettingsFromEnv(); err != nil || got != c.want {
			t.Errorf("%v: %+v, %v; want %+v", c.env, got, err, c.want)
		}
	}
	for _, c := range []struct {
		env  map[string]string
		want []string // each in the error
	}{
		{map[string]string{conc: "0"}, []string{conc, `"0"`}},
		{map[string]string{conc: "-3"}, []string{conc, `"-3"`}},
		{map[string]string{conc: "many"}, []string{conc, `"many"`}},
		{map[string]string{per: "0"}, []string{per, `"0"`}},
		{map[string]string{per: "1.5"}, []string{per, `"1.5"`}},
		{map[string]string{timeout: "soon"}, []string{timeout, `"soon"`}},
		{map[string]string{timeout: "0"}, []string{timeout, `"0"`}},
		{map[string]string{timeout: "-1s"}, []string{timeout, `"-1s"`}},
		{map[string]string{timeout: "10"}, []string{timeout, `"10"`}},
		{map[string]string{conc: "x", per: "y", timeout: "z"}, []string{conc, per, timeout}}, // every one at once
		{map[string]string{conc: "4", per: "8"}, []string{per, "8", conc, "4"}},
		{map[string]string{per: "33"}, []string{per, "33", conc, "32"}},
	} {
		for _, n := range []string{conc, per, timeout} {
			t.Setenv(n, c.env[n])
		}
		_, err := webhook.SettingsFromEnv()
		for _, w := range c.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%v: err %v, want one that says %s", c.env, err, w)
			}
		}
	}
}

package config

import (
	"strings"
	"testing"
)

func lookup(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestDefaults(t *testing.T) {
	t.Parallel()
	c, err := fromLookup(lookup(nil))
	if err != nil {
		t.Fatal(err)
	}
	if c.HTTPAddr != ":8080" || c.DataDir != ".data" || c.StreamReplicas != 1 || c.AllowPrivateCallbacks {
		t.Fatalf("defaults: %+v", c)
	}
}

func TestMalformed(t *testing.T) {
	t.Parallel()
	cases := map[string]string{
		EnvAllowPrivateCallbacks: "maybe",
		EnvStreamReplicas:        "2",
		EnvShutdownTimeout:       "-1s",
		EnvLogFormat:             "xml",
		EnvLogLevel:              "loud",
	}
	for k, v := range cases {
		_, err := fromLookup(lookup(map[string]string{k: v}))
		if err == nil || !strings.Contains(err.Error(), k) {
			t.Errorf("%s=%q: err = %v, want one naming the variable", k, v, err)
		}
	}
}

func TestRequire(t *testing.T) {
	t.Parallel()
	err := Config{}.Require(EnvDatabaseURL, EnvNATSURL)
	if err == nil || !strings.Contains(err.Error(), "DATABASE_URL, NATS_URL") {
		t.Fatalf("Require: %v", err)
	}
	if err := (Config{DatabaseURL: "x", NATSURL: "y"}).Require(EnvDatabaseURL, EnvNATSURL); err != nil {
		t.Fatal(err)
	}
}

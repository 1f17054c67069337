package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"orderpipe/shared/cli"
	"orderpipe/shared/config"
	"orderpipe/shared/tenant"
	"orderpipe/shared/tooling/testenv"
)

// runClients runs the command the way main does, on a config that names
// dbURL.
func runClients(t *testing.T, dbURL string, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	err := testenv.RunCommand(t.Context(), clientsCommand(), config.Config{DatabaseURL: dbURL}, &out, nil, args...)
	return out.String(), err
}

func TestClientsCreate(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	for _, args := range [][]string{{"create", "--name", "shop one"}, {"--name=shop two", "create"}} {
		out, err := runClients(t, db.URL, args...)
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		if strings.Count(out, "\n") != 1 {
			t.Fatalf("want one JSON line, got %q", out)
		}
		var c map[string]string
		dec := json.NewDecoder(strings.NewReader(out))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&c); err != nil || len(c) != 3 || c["client_id"] == "" || c["webhook_secret"] == "" {
			t.Fatalf("output %q: %v", out, err)
		}
		got, err := tenant.Authenticate(t.Context(), db.Pool, c["api_key"])
		if err != nil || got.ID.String() != c["client_id"] {
			t.Fatalf("printed key does not authenticate: %v", err)
		}
	}
}

// A client's own rate limit: set at creation, changed later, cleared back
// to the default; an unknown client id is an error, not a silent no-op.
func TestClientsRateLimit(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	out, err := runClients(t, db.URL, "create", "--name", "busy shop", "--rate-limit", "2500", "--burst", "5000")
	if err != nil {
		t.Fatal(err)
	}
	var creds tenant.Credentials
	if err := json.Unmarshal([]byte(out), &creds); err != nil {
		t.Fatal(err)
	}
	c, err := tenant.Authenticate(t.Context(), db.Pool, creds.APIKey)
	if err != nil || c.Limits != (tenant.Limits{Rate: 2500, Burst: 5000}) {
		t.Fatalf("created with %+v (%v)", c.Limits, err)
	}
	out, err = runClients(t, db.URL, "set-rate-limit", "--id", creds.ClientID.String(), "--rate-limit", "0.5")
	if err != nil || !strings.Contains(out, `"rate_limit":0.5`) || strings.Contains(out, "rate_burst") {
		t.Fatalf("set-rate-limit: %q %v", out, err)
	}
	if c, err := tenant.Get(t.Context(), db.Pool, creds.ClientID); err != nil || c.Limits != (tenant.Limits{Rate: 0.5}) {
		t.Fatalf("after set-rate-limit: %+v %v", c.Limits, err)
	}
	if _, err := runClients(t, db.URL, "set-rate-limit", "--id", "0190b0b0-0000-7000-8000-000000000001", "--rate-limit", "5"); !errors.Is(err, tenant.ErrNoClient) {
		t.Fatalf("unknown client: %v", err)
	}
}

func TestClientsMalformedCommandLines(t *testing.T) {
	t.Parallel()
	cases := [][]string{
		{},
		{"delete", "--name", "x"},
		{"create"},
		{"create", "--name", ""},
		{"create", "--name", "   "},
		{"create", "--name", strings.Repeat("n", 201)},
		{"create", "--name", "a\tb"},
		{"create", "--name", "x", "extra"},
		{"create", "--nome", "x"},
		{"create", "--name"},
		{"--bogus", "create"},
		{"create", "--name", "x", "--rate-limit", "-1"},
		{"create", "--name", "x", "--rate-limit", "fast"},
		{"create", "--name", "x", "--rate-limit", "NaN"},
		{"create", "--name", "x", "--rate-limit", "1e9"},
		{"create", "--name", "x", "--burst", "-5"},
		{"create", "--name", "x", "--burst", "1.5"},
		{"create", "--name", "x", "--id", "0190b0b0-0000-7000-8000-000000000001"},
		{"set-rate-limit"},
		{"set-rate-limit", "--id", "42"},
		{"set-rate-limit", "--id", "0190b0b0-0000-7000-8000-000000000001", "--name", "x"},
		{"set-rate-limit", "--id", "0190b0b0-0000-7000-8000-000000000001", "--rate-limit", "-3"},
	}
	testenv.WantUsageErrors(t, clientsCommand(), config.Config{DatabaseURL: "postgres://unused.invalid/x"}, cases...)
	// A good command line without DATABASE_URL is an environment error,
	// not a usage error.
	if _, err := runClients(t, "", "create", "--name", "x"); err == nil || errors.As(err, new(cli.UsageError)) {
		t.Errorf("missing DATABASE_URL: %v", err)
	}
}

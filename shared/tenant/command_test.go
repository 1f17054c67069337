package tenant_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"strings"
	"testing"

	"orderpipe/shared/cli"
	"orderpipe/shared/config"
	"orderpipe/shared/tenant"
	"orderpipe/shared/testenv"
)

// runClients parses args the way main does and runs the command.
func runClients(t *testing.T, dbURL string, args ...string) (string, error) {
	t.Helper()
	cmd := tenant.Command()
	fs := flag.NewFlagSet("orderpipe clients", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	cmd.Setup(fs)
	if err := fs.Parse(args); err != nil {
		return "", cli.Usagef("%v", err)
	}
	var out bytes.Buffer
	err := cmd.Run(context.Background(), cli.Invocation{Args: fs.Args(), Flags: fs, Stdout: &out, Stderr: io.Discard,
		Config: config.Config{DatabaseURL: dbURL}})
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
		got, err := tenant.Authenticate(context.Background(), db.Pool, c["api_key"])
		if err != nil || got.ID.String() != c["client_id"] {
			t.Fatalf("printed key does not authenticate: %v", err)
		}
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
	}
	for _, args := range cases {
		_, err := runClients(t, "postgres://unused.invalid/x", args...)
		var ue cli.UsageError
		if !errors.As(err, &ue) {
			t.Errorf("%q: want a usage error, got %v", args, err)
		}
	}
	// A good command line without DATABASE_URL is an environment error,
	// not a usage error.
	if _, err := runClients(t, "", "create", "--name", "x"); err == nil || errors.As(err, new(cli.UsageError)) {
		t.Errorf("missing DATABASE_URL: %v", err)
	}
}

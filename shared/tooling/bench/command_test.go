package bench

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"orderpipe/shared/cli"
	"orderpipe/shared/config"
	"orderpipe/shared/tooling/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// invoke runs `orderpipe bench args…` the way main does (the flags before
// the action are parsed first), with cmd, Command() when nil.
func invoke(t *testing.T, cmd *cli.Command, cfg config.Config, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	if cmd == nil {
		c := Command()
		cmd = &c
	}
	var out, errOut bytes.Buffer
	err = testenv.RunCommand(t.Context(), *cmd, cfg, &out, &errOut, args...)
	return out.String(), errOut.String(), err
}

// settingsOf parses args into the Settings that bench would run with.
func settingsOf(t *testing.T, cfg config.Config, args ...string) (Settings, error) {
	t.Helper()
	var got Settings
	cmd := command(func(_ context.Context, s Settings, _, _ io.Writer) error { got = s; return nil })
	_, _, err := invoke(t, &cmd, cfg, args...)
	return got, err
}

// offlineConfig points at no stack: no dev.env, no database.
func offlineConfig(t *testing.T) config.Config {
	return config.Config{DataDir: t.TempDir(), HTTPAddr: ":8080"}
}

// TestFlagsThatDoNotApplyAreRefused: a flag the action does not read is a
// usage error, not silently ignored: `compare --rate 500` divided an
// open-loop intake, capped at 500/s, by a saturated baseline, and printed
// that as the ratio.
func TestFlagsThatDoNotApplyAreRefused(t *testing.T) {
	t.Setenv(config.EnvDatabaseURL, "")
	t.Setenv("ORDERPIPE_API_KEY", "")
	good := []string{"--api-key", "k", "--database-url", "postgres://u@127.0.0.1:1/db", "--url", "http://127.0.0.1:1"}
	for _, tc := range [][]string{
		{"compare", "--rate", "500"},
		{"baseline", "--rate", "500"},
		{"replay", "--timeout", "1s"},
		{"replay", "--duration", "5s"},
		{"replay", "--concurrency", "8"},
		{"intake", "--users", "5"},
		{"e2e", "--requests", "5"},
		{"baseline", "--rounds", "2"},
		{"e2e", "--settle=false"},
		{"intake", "--drain", "1m"},
		{"compare", "--burst=false"},
		{"baseline", "--timeout", "1s"},
	} {
		args := append(append([]string{tc[0]}, good...), tc[1:]...)
		_, _, err := invoke(t, nil, offlineConfig(t), args...)
		var ue cli.UsageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), strings.SplitN(tc[1], "=", 2)[0]) || !strings.Contains(err.Error(), "does not apply") {
			t.Errorf("bench %s: want a usage error saying %s does not apply, got %v", strings.Join(args, " "), tc[1], err)
		}
	}
	// The flags each action reads are accepted.
	for _, args := range [][]string{
		{"intake", "--rate", "20", "--timeout", "5s", "--duration", "2s", "--concurrency", "4"},
		{"e2e", "--rate", "20", "--drain", "1m"},
		{"replay", "--users", "5", "--requests", "3", "--burst=false", "--cold"},
		{"compare", "--rounds", "2", "--settle=false", "--duration", "2s", "--timeout", "5s"},
		{"baseline", "--duration", "2s", "--concurrency", "4"},
	} {
		if _, err := settingsOf(t, offlineConfig(t), append(args, good...)...); err != nil {
			t.Errorf("bench %s: %v", strings.Join(args, " "), err)
		}
	}
}

// Every malformed command line is refused as a usage error that names the
// flag, for every action, before anything is sent anywhere.
func TestMalformedCommandLines(t *testing.T) {
	t.Setenv(config.EnvDatabaseURL, "")
	t.Setenv("ORDERPIPE_API_KEY", "")
	good := []string{"--api-key", "k", "--database-url", "postgres://u@127.0.0.1:1/db", "--url", "http://127.0.0.1:1"}
	for _, action := range Subcommands {
		for _, tc := range []struct {
			args []string
			want string
		}{
			{[]string{"--concurrency", "-1"}, "--concurrency"},
			{[]string{"--concurrency", "0"}, "--concurrency"},
			{[]string{"--concurrency", "20000"}, "--concurrency"},
			{[]string{"--concurrency", "many"}, "invalid value"},
			{[]string{"--rate", "-5"}, "--rate"},
			{[]string{"--rate", "2000000"}, "--rate"},
			{[]string{"--rate", "fast"}, "invalid value"},
			{[]string{"--duration", "0s"}, "--duration"},
			{[]string{"--duration", "-3s"}, "--duration"},
			{[]string{"--duration", "15"}, "invalid value"},
			{[]string{"--users", "0"}, "--users"},
			{[]string{"--requests", "-2"}, "--requests"},
			{[]string{"--users", "100000", "--requests", "100"}, "--users"},
			{[]string{"--rounds", "0"}, "--rounds"},
			{[]string{"--burst=maybe"}, "invalid"},
			{[]string{"--burst", "maybe"}, "unexpected arguments"},
			{[]string{"--cold=2"}, "invalid"},
			{[]string{"--timeout", "0s"}, "--timeout"},
			{[]string{"--drain", "-1m"}, "--drain"},
			{[]string{"--url", "not a url"}, "--url"},
			{[]string{"--url", "ftp://127.0.0.1:21"}, "--url"},
			{[]string{"--url", "http://"}, "--url"},
			{[]string{"--url", "http://127.0.0.1:8080/v1/orders"}, "--url"},
			{[]string{"--url", "http://[::1"}, "--url"},
			{[]string{"--database-url", "postgres://u@127.0.0.1:notaport/db"}, "--database-url"},
			{[]string{"--env-file", filepath.Join(t.TempDir(), "missing.env")}, "--env-file"},
			{[]string{"--no-such-flag"}, "not defined"},
			{[]string{"extra"}, "unexpected arguments"},
		} {
			args := append(append([]string{action}, good...), tc.args...)
			_, _, err := invoke(t, nil, offlineConfig(t), args...)
			var ue cli.UsageError
			if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("bench %s: want a usage error naming %q, got %v", strings.Join(args, " "), tc.want, err)
			}
		}
	}
	for _, args := range [][]string{nil, {"frobnicate"}, {"Intake"}, {""}, {"--concurrency", "4"}} {
		_, _, err := invoke(t, nil, offlineConfig(t), args...)
		var ue cli.UsageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), "intake, replay, e2e, baseline, compare") {
			t.Errorf("bench %q: want a usage error listing the actions, got %v", args, err)
		}
	}
}

// What each action needs, it asks for by name when neither a flag, dev.env
// nor the environment gives it.
func TestMissingTarget(t *testing.T) {
	t.Setenv(config.EnvDatabaseURL, "")
	t.Setenv("ORDERPIPE_API_KEY", "")
	for action, want := range map[string]string{
		"intake": "API key", "replay": "API key", "e2e": "API key", "compare": "API key", "baseline": "needs the database",
	} {
		_, _, err := invoke(t, nil, offlineConfig(t), action)
		var ue cli.UsageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), want) {
			t.Errorf("bench %s without a stack: want a usage error saying %q, got %v", action, want, err)
		}
	}
	_, _, err := invoke(t, nil, offlineConfig(t), "e2e", "--api-key", "k")
	if err == nil || !strings.Contains(err.Error(), "needs the database") {
		t.Errorf("bench e2e without a database: %v", err)
	}
}

// dev.env fills in what the flags leave out; a flag wins over it.
func TestSettingsFromDevEnv(t *testing.T) {
	cfg := offlineConfig(t)
	env := "DATABASE_URL=postgres://u@127.0.0.1:5/db\nNATS_URL=nats://127.0.0.1:4222\nHTTP_ADDR=:9091\nORDERPIPE_API_KEY=devkey\n"
	if err := os.WriteFile(filepath.Join(cfg.DataDir, "dev.env"), []byte(env), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := settingsOf(t, cfg, "compare", "--concurrency", "8")
	if err != nil {
		t.Fatal(err)
	}
	if s.URL != "http://localhost:9091" || s.APIKey != "devkey" || s.DatabaseURL != "postgres://u@127.0.0.1:5/db" || s.Concurrency != 8 || s.Rounds != 4 || !strings.HasPrefix(s.Out, "bench-results") {
		t.Fatalf("settings from dev.env: %+v", s)
	}
	if s, err = settingsOf(t, cfg, "intake", "--url", "http://127.0.0.1:7000", "--api-key", "other"); err != nil || s.URL != "http://127.0.0.1:7000" || s.APIKey != "other" {
		t.Fatalf("flags over dev.env: %+v, %v", s, err)
	}
	// The flags may also come before the action.
	if s, err = settingsOf(t, cfg, "--users", "5", "replay", "--requests", "3"); err != nil || s.Users != 5 || s.Requests != 3 || !s.Burst || s.Cold {
		t.Fatalf("flags around the action: %+v, %v", s, err)
	}
	if s, err = settingsOf(t, cfg, "replay", "--burst=false", "--cold"); err != nil || s.Burst || !s.Cold {
		t.Fatalf("replay --burst=false --cold: %+v, %v", s, err)
	}
	// A malformed dev.env is reported, not half-read.
	if err := os.WriteFile(filepath.Join(cfg.DataDir, "dev.env"), []byte("HTTP_ADDR :9091\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := settingsOf(t, cfg, "intake"); err == nil || !strings.Contains(err.Error(), "KEY=value") {
		t.Fatalf("malformed dev.env: %v", err)
	}
}

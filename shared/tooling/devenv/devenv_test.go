package devenv

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"orderpipe/shared/config"
	"orderpipe/shared/postgres"
	"orderpipe/shared/tenant"
	"orderpipe/shared/tooling/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func devConfig(t *testing.T, dir string) config.Config {
	t.Helper()
	cfg, err := config.FromEnv()
	if err != nil {
		t.Fatal(err)
	}
	// The managed servers, whatever the test process's environment says.
	cfg.DatabaseURL, cfg.NATSURL, cfg.PSPURL = "", "", ""
	cfg.DataDir = dir
	cfg.HTTPAddr = "127.0.0.1:0"
	cfg.ShutdownTimeout = 5 * time.Second
	return cfg
}

func startStack(t *testing.T, cfg config.Config, seeders ...Seeder) (*Stack, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	t0 := time.Now()
	s, err := Start(ctx, cfg, testenv.Logger(t), seeders...)
	if err != nil {
		t.Fatalf("start dev stack: %v", err)
	}
	took := time.Since(t0)
	t.Cleanup(s.Stop)
	return s, took
}

// processGone reports whether neither the process nor its group (every
// postgres backend) is left.
func processGone(pid int) bool {
	return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) && errors.Is(syscall.Kill(-pid, 0), syscall.ESRCH)
}

func readEnvFile(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("dev.env: %v", err)
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), "=")
		if !ok {
			t.Fatalf("dev.env line without '=': %q", sc.Text())
		}
		out[k] = v
	}
	return out
}

func TestStartStopStartKeepsData(t *testing.T) {
	dir := testenv.PostgresDataDir(t)
	cfg := devConfig(t, dir)
	var seeded atomic.Int32
	seed := func(ctx context.Context, pool *pgxpool.Pool) error {
		seeded.Add(1)
		_, err := pool.Exec(ctx, "CREATE TABLE IF NOT EXISTS devenv_seeded (note text PRIMARY KEY); INSERT INTO devenv_seeded VALUES ('seeded') ON CONFLICT DO NOTHING")
		return err
	}

	// The first start runs no part that seeds (`dev producer`); the second
	// does (`dev`), and must seed although the data dir is known by then.
	s, firstTook := startStack(t, cfg)
	pgPid := s.pg.Pid()
	if pgPid <= 0 || processGone(pgPid) {
		t.Fatalf("managed PostgreSQL is not running (pid %d)", pgPid)
	}
	if s.nats == nil {
		t.Fatal("embedded NATS not started")
	}
	if _, err := os.Stat(filepath.Join(dir, "pg", "PG_VERSION")); err != nil {
		t.Fatalf("PostgreSQL data not in $ORDERPIPE_DATA_DIR/pg: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "nats")); err != nil {
		t.Fatalf("JetStream data not in $ORDERPIPE_DATA_DIR/nats: %v", err)
	}

	env := readEnvFile(t, filepath.Join(dir, "dev.env"))
	for _, k := range []string{"DATABASE_URL", "NATS_URL", "HTTP_ADDR", "ORDERPIPE_API_KEY", "ORDERPIPE_WEBHOOK_SECRET"} {
		if env[k] == "" {
			t.Fatalf("dev.env lacks %s:\n%v", k, env)
		}
	}
	if env["DATABASE_URL"] != s.Config.DatabaseURL || env["NATS_URL"] != s.Config.NATSURL || env["ORDERPIPE_API_KEY"] != s.Credentials.APIKey {
		t.Fatalf("dev.env does not match the stack: %v vs %+v", env, s.Config)
	}
	if fi, err := os.Stat(filepath.Join(dir, "dev.env")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("dev.env holds an API key and must be 0600: %v %v", fi.Mode(), err)
	}

	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	pool, err := postgres.Open(ctx, env["DATABASE_URL"])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tenant.Authenticate(ctx, pool, env["ORDERPIPE_API_KEY"]); err != nil {
		t.Fatalf("dev API key does not authenticate: %v", err)
	}
	// dev's PostgreSQL is durable, and creates WAL segments without
	// filling them with zeros first (devPGArgs).
	for setting, want := range map[string]string{"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on", "wal_init_zero": "off"} {
		var got string
		if err := pool.QueryRow(ctx, "SELECT current_setting($1)", setting).Scan(&got); err != nil || got != want {
			t.Errorf("dev's PostgreSQL runs with %s = %q (%v), want %q", setting, got, err, want)
		}
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE devenv_kept (v text); INSERT INTO devenv_kept VALUES ('before stop')"); err != nil {
		t.Fatal(err)
	}
	pool.Close()
	creds := s.Credentials

	s.Stop()
	testenv.WaitFor(t, 10*time.Second, "the managed PostgreSQL to be gone", func() bool { return processGone(pgPid) })
	if _, err := os.Stat(filepath.Join(dir, "pg", "postmaster.pid")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("postmaster.pid left after a clean stop: %v", err)
	}
	s.Stop() // twice is harmless

	s2, secondTook := startStack(t, cfg, seed)
	t.Logf("first start %s (initdb), second start %s", firstTook, secondTook)
	if secondTook > 20*time.Second {
		t.Fatalf("a second start on the same data dir took %s", secondTook)
	}
	if s2.Credentials != creds {
		t.Fatalf("dev client changed across restarts: %+v → %+v", creds, s2.Credentials)
	}
	if seeded.Load() != 1 {
		t.Fatalf("seeder ran %d times on a start with a part that seeds, want 1", seeded.Load())
	}
	pool, err = postgres.Open(ctx, s2.Config.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := tenant.Authenticate(ctx, pool, creds.APIKey); err != nil {
		t.Fatalf("the first start's API key no longer authenticates: %v", err)
	}
	var v string
	if err := pool.QueryRow(ctx, "SELECT v FROM devenv_kept").Scan(&v); err != nil || v != "before stop" {
		t.Fatalf("row written before stop: %q, %v", v, err)
	}
	var clients int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM api_clients WHERE name = 'dev'").Scan(&clients); err != nil || clients != 1 {
		t.Fatalf("dev clients: %d (%v), want exactly 1", clients, err)
	}
	pool.Close()
	pid2 := s2.pg.Pid()
	s2.Stop()
	if !processGone(pid2) {
		t.Fatalf("postgres %d still running after Stop", pid2)
	}
}

func TestRunWithoutPartsStopsOnCancel(t *testing.T) {
	dir := testenv.PostgresDataDir(t)
	cfg := devConfig(t, dir)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var out testenv.Buffer
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg, testenv.Logger(t), nil, &out) }()

	var pgPid int
	testenv.WaitFor(t, 2*time.Minute, "dev to report it is up", func() bool {
		select {
		case err := <-done:
			t.Fatalf("Run returned before it was cancelled: %v\n%s", err, out.String())
		default:
		}
		return strings.Contains(out.String(), "orderpipe dev is up")
	})
	text := out.String()
	for _, want := range []string{"dev.env", "DATABASE_URL=", "ORDERPIPE_API_KEY=", "curl ", "/v1/orders", "Authorization: Bearer "} {
		if !strings.Contains(text, want) {
			t.Fatalf("dev's greeting lacks %q:\n%s", want, text)
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, "pg", "postmaster.pid"))
	if err != nil {
		t.Fatalf("no postmaster.pid while dev runs: %v", err)
	}
	pgPid = atoiFirstLine(t, b)

	cancel()
	if err := testenv.Receive(t, done, time.Minute, "Run to return after its context ended"); err != nil {
		t.Fatalf("Run after cancel: %v", err)
	}
	if !processGone(pgPid) {
		t.Fatalf("postgres %d still running after dev returned", pgPid)
	}
	if _, err := os.Stat(filepath.Join(dir, "pg", "postmaster.pid")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("postmaster.pid left after dev returned: %v", err)
	}
}

func TestRunWithCancelledContextLeavesNothing(t *testing.T) {
	dir := testenv.PostgresDataDir(t)
	cfg := devConfig(t, dir)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg, testenv.Logger(t), []Part{}, &bytes.Buffer{}) }()
	select {
	case err := <-done:
		if err == nil {
			return // nothing was started, nothing to stop
		}
		if !errors.Is(err, context.Canceled) && !strings.Contains(err.Error(), "context canceled") {
			t.Logf("Run with a cancelled context: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Run with a cancelled context did not return")
	}
	if b, err := os.ReadFile(filepath.Join(dir, "pg", "postmaster.pid")); err == nil {
		pid := atoiFirstLine(t, b)
		if !processGone(pid) {
			t.Fatalf("postgres %d left running by a cancelled dev", pid)
		}
	}
}

func TestEnvTextAndBaseURL(t *testing.T) {
	t.Parallel()
	s := &Stack{Config: config.Config{DatabaseURL: "postgres://db", NATSURL: "nats://n", HTTPAddr: ":8080"},
		Credentials: tenant.Credentials{APIKey: "key", WebhookSecret: "whsec_x"}}
	want := "DATABASE_URL=postgres://db\nNATS_URL=nats://n\nHTTP_ADDR=:8080\nORDERPIPE_API_KEY=key\nORDERPIPE_WEBHOOK_SECRET=whsec_x\n"
	if got := s.EnvText(); got != want {
		t.Fatalf("EnvText:\n%s\nwant:\n%s", got, want)
	}
	s.Config.PSPURL = "http://psp"
	if got := s.EnvText(); !strings.HasSuffix(got, "PSP_URL=http://psp\n") {
		t.Fatalf("EnvText with PSP_URL:\n%s", got)
	}
	for addr, want := range map[string]string{
		":8080":          "http://localhost:8080",
		"0.0.0.0:9000":   "http://localhost:9000",
		"[::]:9000":      "http://localhost:9000",
		"127.0.0.1:8081": "http://127.0.0.1:8081",
		"localhost":      "http://localhost",
	} {
		s.Config.HTTPAddr = addr
		if got := s.BaseURL(); got != want {
			t.Errorf("BaseURL(%q) = %q, want %q", addr, got, want)
		}
	}
	curl := CurlExample("http://localhost:8080", "k123")
	for _, want := range []string{"http://localhost:8080/v1/orders", "Bearer k123", `"request_id"`, `"amount":"39.98"`} {
		if !strings.Contains(curl, want) {
			t.Errorf("curl example lacks %q:\n%s", want, curl)
		}
	}
}

func atoiFirstLine(t *testing.T, b []byte) int {
	t.Helper()
	line, _, _ := strings.Cut(string(b), "\n")
	var pid int
	for _, c := range strings.TrimSpace(line) {
		if c < '0' || c > '9' {
			t.Fatalf("postmaster.pid's first line is not a pid: %q", line)
		}
		pid = pid*10 + int(c-'0')
	}
	return pid
}

// TestSelectKeepsDevsOrder: dev starts the parts named in its own order
// (a part may depend on one before it), all of them when none is named.
func TestSelectKeepsDevsOrder(t *testing.T) {
	parts := []Part{{Name: "a"}, {Name: "b"}, {Name: "c"}}
	names := func(ps []Part) string {
		var n []string
		for _, p := range ps {
			n = append(n, p.Name)
		}
		return strings.Join(n, ",")
	}
	for _, tc := range []struct {
		args []string
		want string
	}{{nil, "a,b,c"}, {[]string{"c", "a"}, "a,c"}, {[]string{"b"}, "b"}} {
		got, err := Select(parts, tc.args)
		if err != nil || names(got) != tc.want {
			t.Errorf("Select(%v) = %s, %v; want %s", tc.args, names(got), err, tc.want)
		}
	}
	if _, err := Select(parts, []string{"d"}); err == nil || !strings.Contains(err.Error(), "a, b, c") {
		t.Errorf("Select(d): %v; want an error listing the parts", err)
	}
	if _, err := Select(parts, []string{"a", "a"}); err == nil {
		t.Error("Select(a, a): want an error")
	}
}

package localpg_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"orderpipe/shared/tooling/localpg"
	"orderpipe/shared/tooling/procstat"
	"orderpipe/shared/tooling/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func start(t *testing.T, opts localpg.Options) *localpg.Server {
	t.Helper()
	s, err := localpg.Start(testenv.Context(t, 2*time.Minute), opts)
	if err != nil {
		t.Fatalf("start PostgreSQL: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Errorf("stop PostgreSQL: %v", err)
		}
	})
	return s
}

// serverProcesses returns the postmaster pid and the pids of its children.
// PostgreSQL's children each start a session of their own (setsid), so the
// postmaster's process group holds the postmaster alone: waiting for the
// group to be gone does not wait for the backends, which keep the shared
// memory attached until they notice the postmaster died.
func serverProcesses(pid int) []int {
	procs := []int{pid}
	for child, st := range procstat.All() {
		if st.PPid == pid {
			procs = append(procs, child)
		}
	}
	return procs
}

// allGone reports whether none of procs is left (a zombie, which has let go
// of its memory, counts as gone).
func allGone(procs []int) bool {
	for _, p := range procs {
		if st, ok := procstat.Read(p); ok && st.State != "Z" {
			return false
		}
	}
	return true
}

// connect opens a connection to url, failing the test if it cannot; ctx
// bounds the connection's use to 30 seconds. The caller closes it.
func connect(t *testing.T, url string) (context.Context, *pgx.Conn) {
	t.Helper()
	ctx := testenv.Context(t, 30*time.Second)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect to %s: %v", url, err)
	}
	return ctx, conn
}

func query(t *testing.T, url, sql string, args ...any) {
	t.Helper()
	ctx, conn := connect(t, url)
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func TestStartFailureShowsServerLog(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	s, err := localpg.Start(ctx, localpg.Options{DataDir: testenv.PostgresDataDir(t), ExtraArgs: []string{"-c", "shared_buffers=bogus"}})
	if err == nil {
		_ = s.Stop()
		t.Fatal("PostgreSQL started with shared_buffers=bogus")
	}
	msg := err.Error()
	// The reason is only in the server's own log: the error must carry it.
	if !strings.Contains(msg, "server log") || !strings.Contains(msg, `"shared_buffers"`) || !strings.Contains(msg, "bogus") {
		t.Fatalf("start error does not show the server log's reason:\n%s", msg)
	}
}

func TestStalePidFileOfKilledServerDoesNotBlockStart(t *testing.T) {
	t.Parallel()
	dir := testenv.PostgresDataDir(t)
	// Durable, as `dev` runs it: a committed row survives the crash.
	first := start(t, localpg.Options{DataDir: dir, Durable: true})
	query(t, first.URL("postgres"), "CREATE TABLE survivor (v int); INSERT INTO survivor VALUES (7)")
	pid := first.Pid()
	if pid <= 0 {
		t.Fatalf("Pid() = %d on a running server", pid)
	}
	procs := serverProcesses(pid)
	if len(procs) < 2 {
		t.Fatalf("the running server has no child process: %v", procs)
	}

	// A crash: the postmaster dies without removing postmaster.pid.
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill postmaster %d: %v", pid, err)
	}
	testenv.WaitExited(t, first.Done(), 30*time.Second, "the postmaster killed with SIGKILL")
	// Its backends notice the postmaster's death and exit by themselves;
	// until they have, PostgreSQL refuses to start on their shared memory.
	testenv.WaitFor(t, 30*time.Second, "the killed server's backends to exit", func() bool { return allGone(procs) })
	if _, err := os.Stat(filepath.Join(dir, "postmaster.pid")); err != nil {
		t.Fatalf("expected the killed server's postmaster.pid to be left behind: %v", err)
	}

	second := start(t, localpg.Options{DataDir: dir, Durable: true})
	if second.Pid() == pid {
		t.Fatalf("second server reports the killed server's pid %d", pid)
	}
	ctx, conn := connect(t, second.URL("postgres"))
	defer conn.Close(ctx)
	var v int
	if err := conn.QueryRow(ctx, "SELECT v FROM survivor").Scan(&v); err != nil || v != 7 {
		t.Fatalf("data written before the crash: v=%d err=%v", v, err)
	}
}

func TestStopEndsEveryServerProcess(t *testing.T) {
	t.Parallel()
	s := start(t, localpg.Options{DataDir: testenv.PostgresDataDir(t)})
	pid := s.Pid()
	query(t, s.URL("postgres"), "SELECT 1")
	procs := serverProcesses(pid)
	if len(procs) < 2 || allGone(procs) {
		t.Fatalf("server processes %v while the server runs, want the postmaster and its children", procs)
	}
	if err := s.Stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if !allGone(procs) {
		t.Fatalf("processes of the server %v remain after Stop", procs)
	}
	if err := s.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
}

func TestRestartKeepsPortAndData(t *testing.T) {
	t.Parallel()
	s := start(t, localpg.Options{DataDir: testenv.PostgresDataDir(t)})
	port := s.Port()
	query(t, s.URL("postgres"), "CREATE TABLE kept (v int); INSERT INTO kept VALUES (1)")
	if err := s.Restart(testenv.Context(t, 2*time.Minute)); err != nil {
		t.Fatalf("restart: %v", err)
	}
	if s.Port() != port {
		t.Fatalf("port changed across restart: %d → %d", port, s.Port())
	}
	query(t, s.URL("postgres"), "INSERT INTO kept SELECT v + 1 FROM kept")
}

func TestBinDirFromEnvironment(t *testing.T) {
	t.Setenv("PG_BIN_DIR", "/nonexistent/bin")
	d, err := localpg.BinDir()
	if err != nil || d != "/nonexistent/bin" {
		t.Fatalf("BinDir() = %q, %v; want PG_BIN_DIR", d, err)
	}
}

package bench

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"orderpipe/shared/config"
	"orderpipe/shared/tooling/devenv"
	"orderpipe/shared/tooling/testenv"
)

// TestStatements: the statements' differences between two readings, the
// most expensive first and at most topStatements of them, per ok answer;
// a statement that did not run is left out, one whose counters went down
// (evicted, or the statistics reset) counts its second reading whole; the
// text is on one line and cut. Without statistics in either reading,
// nothing is reported.
func TestStatements(t *testing.T) {
	t.Parallel()
	long := "SELECT " + strings.Repeat("x, ", 100) + "y FROM t"
	s0 := map[int64]stmtReading{
		1: {calls: 10, rows: 10, execMS: 5, query: "SELECT 1"},
		3: {calls: 50, rows: 50, execMS: 40, query: "UPDATE t SET a = $1"},
		4: {calls: 7, rows: 7, execMS: 3, query: "SELECT 4"},
	}
	s1 := map[int64]stmtReading{
		1: {calls: 110, rows: 110, execMS: 105, query: "SELECT 1"},
		2: {calls: 5, rows: 0, execMS: 500, query: "INSERT  INTO\n\tt (a)\n VALUES ($1)"},
		3: {calls: 3, rows: 3, execMS: 1.5, query: "UPDATE t SET a = $1"},
		4: {calls: 7, rows: 7, execMS: 3, query: "SELECT 4"},
		5: {calls: 1, rows: 1, execMS: 200, query: long},
	}
	for i := int64(10); i < 20; i++ {
		s1[i] = stmtReading{calls: 1, rows: 1, execMS: 0.01 * float64(i), query: fmt.Sprintf("SELECT %d", i)}
	}
	a := activity(dbReading{stmts: s0}, dbReading{stmts: s1}, 100)
	want := 100 + 500 + 1.5 + 200 + 0.01*(10+11+12+13+14+15+16+17+18+19)
	if d := a.ExecMS - want; d > 1e-9 || d < -1e-9 || a.ExecUSPerOK != a.ExecMS*10 {
		t.Fatalf("exec %v ms (%v µs per ok), want %v ms", a.ExecMS, a.ExecUSPerOK, want)
	}
	if len(a.Statements) != topStatements {
		t.Fatalf("%d statements, want the top %d: %+v", len(a.Statements), topStatements, a.Statements)
	}
	first := a.Statements[0]
	if first.Query != "INSERT INTO t (a) VALUES ($1)" || first.Calls != 5 || first.ExecMS != 500 ||
		first.PerOK["exec_us"] != 5000 || first.PerOK["calls"] != 0.05 || first.PerOK["rows"] != 0 {
		t.Fatalf("first statement %+v", first)
	}
	if s := a.Statements[1]; len([]rune(s.Query)) != maxQueryText || !strings.HasSuffix(s.Query, "…") || s.ExecMS != 200 {
		t.Fatalf("second statement: %d characters, %v ms: %q", len([]rune(s.Query)), s.ExecMS, s.Query)
	}
	if s := a.Statements[2]; s.Query != "SELECT 1" || s.Calls != 100 || s.ExecMS != 100 || s.Rows != 100 {
		t.Fatalf("third statement %+v", s)
	}
	if s := a.Statements[3]; s.Query != "UPDATE t SET a = $1" || s.Calls != 3 || s.ExecMS != 1.5 {
		t.Fatalf("a statement whose counters went down: %+v", s)
	}
	for _, s := range a.Statements {
		if s.Query == "SELECT 4" {
			t.Fatalf("a statement that did not run is reported: %+v", s)
		}
	}
	lines := a.StatementLines()
	if len(lines) != topStatements+1 || !strings.Contains(lines[0], "µs per ok") || !strings.Contains(lines[1], "INSERT INTO t") || !strings.Contains(lines[1], "5000 µs") {
		t.Fatalf("summary lines:\n%s", strings.Join(lines, "\n"))
	}
	for _, r := range [][2]dbReading{{{}, {stmts: s1}}, {{stmts: s0}, {}}} {
		if a := activity(r[0], r[1], 100); a.Statements != nil || a.ExecMS != 0 || a.StatementLines() != nil {
			t.Fatalf("statistics in one reading only: %+v", a)
		}
	}
}

// TestStatementsOfDevsPostgres: with ORDERPIPE_DEV_PG_STATEMENTS on, dev's
// PostgreSQL keeps per-statement statistics and a run reports its
// statements (the baseline's INSERT costs the most); started again
// without the setting, on the same data, it keeps none and the run
// reports none.
func TestStatementsOfDevsPostgres(t *testing.T) {
	cfg, err := config.FromEnv()
	if err != nil {
		t.Fatal(err)
	}
	cfg.DatabaseURL, cfg.NATSURL, cfg.PSPURL = "", "", ""
	cfg.DataDir, cfg.HTTPAddr = testenv.PostgresDataDir(t), "127.0.0.1:0"
	for _, on := range []bool{true, false} {
		cfg.DevPGStatements = on
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
		s, err := devenv.Start(ctx, cfg, testenv.Logger(t))
		cancel()
		if err != nil {
			t.Fatalf("start dev with %s=%v: %v", config.EnvDevPGStatements, on, err)
		}
		out := filepath.Join(t.TempDir(), "baseline")
		stdout, stderr, err := invoke(t, nil, offlineConfig(t), "baseline", "--database-url", s.Config.DatabaseURL, "--out", out, "--duration", "1s", "--concurrency", "2")
		s.Stop()
		if err != nil {
			t.Fatalf("bench baseline: %v\n%s\n%s", err, stdout, stderr)
		}
		db := readResult(t, out).Runs[0].DB
		if db == nil {
			t.Fatalf("%s=%v: no database activity\n%s", config.EnvDevPGStatements, on, stdout)
		}
		if !on {
			if db.Rollbacks != 0 {
				t.Fatalf("%s off: %d rollbacks in a baseline run, which rolls nothing back\n%s", config.EnvDevPGStatements, db.Rollbacks, stdout)
			}
			if db.Statements != nil || strings.Contains(stdout, "statements:") {
				t.Fatalf("%s off: statements reported: %+v\n%s", config.EnvDevPGStatements, db.Statements, stdout)
			}
			continue
		}
		if len(db.Statements) == 0 || !strings.HasPrefix(db.Statements[0].Query, `INSERT INTO "bench_`) || db.Statements[0].PerOK["calls"] < 0.9 ||
			db.ExecUSPerOK <= 0 || !strings.Contains(stdout, "statements: PostgreSQL executed for") {
			t.Fatalf("%s on: want the baseline's INSERT first, about one call per insert:\n%+v\n%s", config.EnvDevPGStatements, db.Statements, stdout)
		}
	}
}

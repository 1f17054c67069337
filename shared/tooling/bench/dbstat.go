package bench

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// DBActivity is what the stack's database did during a run, from
// PostgreSQL's own counters (pg_stat_database): transactions and rows
// written, in all and per 2xx answer. A plain INSERT costs one commit
// and one row; an order through the intake and the pipeline costs what
// PerOK says. PostgreSQL's backends publish their counters about once a
// second, so a reading may miss the last second's activity: compare runs
// of the same length, of ten seconds or more.
type DBActivity struct {
	Commits   int64 `json:"commits"`
	Rollbacks int64 `json:"rollbacks"`
	Inserted  int64 `json:"rows_inserted"`
	Updated   int64 `json:"rows_updated"`
	Deleted   int64 `json:"rows_deleted"`
	// PerOK is each count above per 2xx answer of the run.
	PerOK map[string]float64 `json:"per_ok,omitempty"`
	// ExecMS is PostgreSQL's execution time of every statement of the
	// database during the run, and Statements the topStatements that took
	// most of it, when the database keeps per-statement statistics (the
	// pg_stat_statements extension: `dev` with ORDERPIPE_DEV_PG_STATEMENTS
	// on). Execution only: parsing, the protocol, the commits' WAL
	// flushes and the background processes are PostgreSQL's time too.
	ExecMS      float64     `json:"statements_exec_ms,omitempty"`
	ExecUSPerOK float64     `json:"statements_exec_us_per_ok,omitempty"`
	Statements  []Statement `json:"statements,omitempty"`
}

// Statement is one statement's share of a run, from pg_stat_statements.
type Statement struct {
	// Query is the statement's normalized text, its whitespace collapsed,
	// cut at maxQueryText characters.
	Query  string  `json:"query"`
	Calls  int64   `json:"calls"`
	ExecMS float64 `json:"exec_ms"`
	Rows   int64   `json:"rows"`
	// PerOK is calls, exec_us and rows per 2xx answer of the run.
	PerOK map[string]float64 `json:"per_ok,omitempty"`
}

// topStatements is how many statements a run reports; maxQueryText
// bounds the text of each.
const (
	topStatements = 8
	maxQueryText  = 160
)

type dbReading struct {
	commits, rollbacks, inserted, updated, deleted int64
	// stmts are the database's statements by query id; nil when the
	// database keeps no per-statement statistics.
	stmts map[int64]stmtReading
}

type stmtReading struct {
	calls, rows int64
	execMS      float64
	query       string
}

// readDB reads the counters of the pool's database; ok is false without
// a pool or when the query fails (the run is then reported without them).
func readDB(pool *pgxpool.Pool) (r dbReading, ok bool) {
	if pool == nil {
		return r, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := pool.QueryRow(ctx, `SELECT xact_commit, xact_rollback, tup_inserted, tup_updated, tup_deleted
		FROM pg_stat_database WHERE datname = current_database()`).Scan(&r.commits, &r.rollbacks, &r.inserted, &r.updated, &r.deleted)
	if err != nil {
		return r, false
	}
	r.stmts = readStatements(ctx, pool)
	return r, true
}

// readStatements reads pg_stat_statements for the pool's database (a
// statement run at the top level and inside a function counts once), or
// returns nil when the extension is not there or not loaded. It asks
// first, rather than reading the view and failing: a failed statement is
// a rollback in the database's counters, which the run reports.
func readStatements(ctx context.Context, pool *pgxpool.Pool) map[int64]stmtReading {
	var kept bool
	if err := pool.QueryRow(ctx, `
		SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_stat_statements')
		   AND 'pg_stat_statements' = ANY (string_to_array(replace(current_setting('shared_preload_libraries'), ' ', ''), ','))`).Scan(&kept); err != nil || !kept {
		return nil
	}
	rows, err := pool.Query(ctx, `
		SELECT queryid, sum(calls)::bigint, sum(rows)::bigint, sum(total_exec_time), min(query)
		FROM pg_stat_statements
		WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND queryid IS NOT NULL
		GROUP BY queryid`)
	if err != nil {
		return nil
	}
	defer rows.Close()
	out := map[int64]stmtReading{}
	for rows.Next() {
		var id int64
		var st stmtReading
		if err := rows.Scan(&id, &st.calls, &st.rows, &st.execMS, &st.query); err != nil {
			return nil
		}
		out[id] = st
	}
	if rows.Err() != nil {
		return nil
	}
	return out
}

// activity is what happened between two readings, per ok answers.
func activity(r0, r1 dbReading, ok int64) *DBActivity {
	a := &DBActivity{Commits: r1.commits - r0.commits, Rollbacks: r1.rollbacks - r0.rollbacks,
		Inserted: r1.inserted - r0.inserted, Updated: r1.updated - r0.updated, Deleted: r1.deleted - r0.deleted}
	if ok > 0 {
		n := float64(ok)
		a.PerOK = map[string]float64{"commits": float64(a.Commits) / n, "rows_inserted": float64(a.Inserted) / n,
			"rows_updated": float64(a.Updated) / n, "rows_deleted": float64(a.Deleted) / n}
	}
	if r0.stmts != nil && r1.stmts != nil {
		a.ExecMS, a.Statements = statements(r0.stmts, r1.stmts, ok)
		if ok > 0 {
			a.ExecUSPerOK = a.ExecMS * 1000 / float64(ok)
		}
	}
	return a
}

// statements returns the execution time of every statement between two
// readings and the topStatements that took most of it. A statement whose
// counters went down was evicted or reset meanwhile: its second reading
// is all it did.
func statements(s0, s1 map[int64]stmtReading, ok int64) (float64, []Statement) {
	var all float64
	var out []Statement
	for id, b := range s1 {
		d := b
		if a, seen := s0[id]; seen && a.calls <= b.calls {
			d.calls, d.rows, d.execMS = b.calls-a.calls, b.rows-a.rows, b.execMS-a.execMS
		}
		if d.calls <= 0 {
			continue
		}
		all += d.execMS
		st := Statement{Query: queryText(d.query), Calls: d.calls, ExecMS: d.execMS, Rows: d.rows}
		if ok > 0 {
			n := float64(ok)
			st.PerOK = map[string]float64{"calls": float64(d.calls) / n, "exec_us": d.execMS * 1000 / n, "rows": float64(d.rows) / n}
		}
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].ExecMS != out[j].ExecMS {
			return out[i].ExecMS > out[j].ExecMS
		}
		return out[i].Query < out[j].Query
	})
	if len(out) > topStatements {
		out = out[:topStatements]
	}
	return all, out
}

// queryText is a statement's text on one line, cut at maxQueryText.
func queryText(q string) string {
	q = strings.Join(strings.Fields(q), " ")
	if r := []rune(q); len(r) > maxQueryText {
		q = string(r[:maxQueryText-1]) + "…"
	}
	return q
}

// String is the summary line.
func (a *DBActivity) String() string {
	s := fmt.Sprintf("database: %d commits, %d rollbacks, rows %d inserted, %d updated, %d deleted",
		a.Commits, a.Rollbacks, a.Inserted, a.Updated, a.Deleted)
	if a.PerOK != nil {
		s += fmt.Sprintf("; per ok: %.2f commits, rows %.2f inserted, %.2f updated, %.2f deleted",
			a.PerOK["commits"], a.PerOK["rows_inserted"], a.PerOK["rows_updated"], a.PerOK["rows_deleted"])
	}
	return s
}

// StatementLines are the summary's lines on the statements (none when the
// database keeps no per-statement statistics).
func (a *DBActivity) StatementLines() []string {
	if len(a.Statements) == 0 {
		return nil
	}
	head := fmt.Sprintf("statements: PostgreSQL executed for %.0f ms", a.ExecMS)
	if a.ExecUSPerOK > 0 {
		head += fmt.Sprintf(" (%.0f µs per ok)", a.ExecUSPerOK)
	}
	lines := []string{head + "; the most:"}
	for _, st := range a.Statements {
		if st.PerOK != nil {
			lines = append(lines, fmt.Sprintf("  %7.0f µs %6.2f calls %7.2f rows per ok  %s", st.PerOK["exec_us"], st.PerOK["calls"], st.PerOK["rows"], st.Query))
		} else {
			lines = append(lines, fmt.Sprintf("  %9.1f ms %8d calls %9d rows  %s", st.ExecMS, st.Calls, st.Rows, st.Query))
		}
	}
	return lines
}

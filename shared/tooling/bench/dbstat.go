package bench

import (
	"context"
	"fmt"
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
}

type dbReading struct{ commits, rollbacks, inserted, updated, deleted int64 }

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
	return r, err == nil
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
	return a
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

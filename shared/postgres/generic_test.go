package postgres_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"orderpipe/shared/postgres"
	"orderpipe/shared/tooling/testenv"
)

// planCacheMode reads the setting of one's connection.
func planCacheMode(t *testing.T, one postgres.DB) string {
	t.Helper()
	var mode string
	if err := one.QueryRow(t.Context(), `SELECT current_setting('plan_cache_mode')`).Scan(&mode); err != nil {
		t.Fatal(err)
	}
	return mode
}

// TestGenericPlansAreTheTransactionsOwn: a statement run by ExecGeneric or
// QueryGeneric, or in a GenericPlans transaction, runs with generic plans
// forced and commits; the connection goes back to the pool with
// PostgreSQL's default, after a failed statement too, which rolls back
// what its transaction did.
func TestGenericPlansAreTheTransactionsOwn(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	ctx := ctxT(t)
	one := testenv.OneConnection(t, db)
	if _, err := one.Exec(ctx, `CREATE TABLE g (k int PRIMARY KEY, mode text)`); err != nil {
		t.Fatal(err)
	}
	const insert = `INSERT INTO g VALUES ($1, current_setting('plan_cache_mode'))`
	if tag, err := postgres.ExecGeneric(ctx, one, insert, 1); err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("ExecGeneric = %v, %v; want 1 row inserted", tag, err)
	}
	var modes []string
	if err := postgres.QueryGeneric(ctx, one, func(rows pgx.Rows) (err error) {
		modes, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	}, `SELECT mode FROM g WHERE k = ANY($1) UNION ALL SELECT current_setting('plan_cache_mode')`, []int{1}); err != nil {
		t.Fatal(err)
	}
	if want := "force_generic_plan"; len(modes) != 2 || modes[0] != want || modes[1] != want {
		t.Fatalf("modes seen by the statements = %q, want %q twice", modes, want)
	}
	if m := planCacheMode(t, one); m != "auto" {
		t.Fatalf("after ExecGeneric and QueryGeneric the connection's plan_cache_mode is %q, want auto", m)
	}
	if err := pgx.BeginTxFunc(ctx, one, postgres.GenericPlans, func(tx pgx.Tx) error {
		if m := planCacheMode(t, tx); m != "force_generic_plan" {
			t.Errorf("in a GenericPlans transaction plan_cache_mode is %q", m)
		}
		_, err := tx.Exec(ctx, insert, 2)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if m := planCacheMode(t, one); m != "auto" {
		t.Fatalf("after a GenericPlans transaction the connection's plan_cache_mode is %q, want auto", m)
	}

	// A failing statement: its error, nothing of its transaction kept, and
	// a connection that works with the default.
	_, err := postgres.ExecGeneric(ctx, one, `INSERT INTO g SELECT k, 'x' FROM unnest($1::int[]) k`, []int{3, 1})
	if err == nil || !strings.Contains(err.Error(), "duplicate key") {
		t.Fatalf("ExecGeneric of a duplicate key = %v, want its error", err)
	}
	err = postgres.QueryGeneric(ctx, one, func(pgx.Rows) error { return nil }, `SELECT 1/0 WHERE $1`, true)
	if err == nil || !strings.Contains(err.Error(), "division by zero") {
		t.Fatalf("QueryGeneric of a failing statement = %v, want its error", err)
	}
	var n int
	if err := one.QueryRow(ctx, `SELECT count(*) FROM g`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("rows after the failed statement = %d, %v; want 2 (row 3 rolled back)", n, err)
	}
	if m := planCacheMode(t, one); m != "auto" {
		t.Fatalf("after a failed statement the connection's plan_cache_mode is %q, want auto", m)
	}
}

// TestGenericRefusesATransaction: ExecGeneric and QueryGeneric run a
// transaction of their own, so given the caller's transaction they refuse
// it, rather than commit it halfway.
func TestGenericRefusesATransaction(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	ctx := ctxT(t)
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := postgres.ExecGeneric(ctx, tx, `SELECT 1`); err == nil || !strings.Contains(err.Error(), "not a transaction") {
		t.Fatalf("ExecGeneric in a transaction = %v, want it refused", err)
	}
	if err := postgres.QueryGeneric(ctx, tx, func(pgx.Rows) error { return nil }, `SELECT 1`); err == nil || !strings.Contains(err.Error(), "not a transaction") {
		t.Fatalf("QueryGeneric in a transaction = %v, want it refused", err)
	}
}

// TestGenericPlansWarnNothing: ExecGeneric and QueryGeneric send the
// setting in an implicit transaction, where PostgreSQL answers SET LOCAL
// with a warning (written to the server's log, and sent to the client)
// on every call. They set it without one.
func TestGenericPlansWarnNothing(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	ctx := ctxT(t)
	cfg, err := pgx.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu      sync.Mutex
		notices []string
	)
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		mu.Lock()
		defer mu.Unlock()
		notices = append(notices, n.Severity+": "+n.Message)
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	if _, err := postgres.ExecGeneric(ctx, conn, `SELECT $1::int`, 1); err != nil {
		t.Fatal(err)
	}
	var mode string
	if err := postgres.QueryGeneric(ctx, conn, func(rows pgx.Rows) error {
		for rows.Next() {
			if err := rows.Scan(&mode); err != nil {
				return err
			}
		}
		return rows.Err()
	}, `SELECT current_setting('plan_cache_mode') WHERE $1`, true); err != nil {
		t.Fatal(err)
	}
	if mode != "force_generic_plan" {
		t.Fatalf("QueryGeneric's statement ran with plan_cache_mode %q", mode)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(notices) != 0 {
		t.Fatalf("the server sent %q", notices)
	}
}

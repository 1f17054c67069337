// Package postgres opens orderpipe's connection pool, applies the schema
// and translates PostgreSQL errors into the ones the parts match on.
package postgres

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
	pgxuuid "github.com/vgarvardt/pgx-google-uuid/v5"

	"orderpipe/migrations"
	"orderpipe/shared/config"
)

// DB is what the data functions of every package take: a pool, a
// connection or a transaction (*pgxpool.Pool, *pgx.Conn and pgx.Tx all
// satisfy it). A function that must run inside the caller's transaction
// takes a pgx.Tx instead.
//
// pgx prepares statements, and PostgreSQL may cache one plan for a
// prepared statement after five runs, whatever its arguments. A join of
// unnest with a table that was nearly empty then (a fresh database, every
// benchmark's first minute) is planned as a full scan, and stays one as
// the table grows, until autovacuum's next ANALYZE. A read of a batch of
// keys that must stay an index lookup from the start looks each key up in
// a LATERAL subquery with LIMIT 1 (orderstore.GetByRequestIDs); an update
// or a lock of rows named by a key array joins them on "key =
// ANY(ARRAY[v.key])", which can be neither hashed nor merged, so that its
// one plan is a nested loop over the keys with the key's index
// (orderstore.TransitionMany, the outbox's stamp). A redundant "key =
// ANY($1)" beside a plain join is not enough: depending on the table's
// size when the plan was cached, PostgreSQL answers it with a full scan.
//
// A partial index is the exception. When a constant condition of the
// statement implies the index's predicate (status = 'pending' and the
// unsettled payments' index), the join form's plan may scan that whole
// index and filter it by the join; the index keeps an entry for every
// row version that matched its predicate until a vacuum. There, "key =
// ANY($1)" is what gives the plan the keys as its index condition
// (payments.RecordMany); TestGenericPlansStayOnTheKeysAsTheTablesGrow
// counts index entries read as well as rows.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// GenericPlans are the options of a transaction (pgx.BeginTxFunc) whose
// prepared statements run on their generic plan: planned once per
// connection, not once per run. PostgreSQL's default keeps planning a
// statement over a key array for every run when its small arrays make a
// custom plan look cheaper than the generic plan's guess, which is the
// pipeline's case: at 150 orders/s its steps spent about 1.6 ms of
// PostgreSQL's time per order planning (docs/benchmarks.md, twelfth step).
// Only statements whose generic plan stays on their keys as the tables
// grow may run so (see DB); TestGenericPlansStayOnTheKeysAsTheTablesGrow
// runs the whole pipeline so. The setting is the transaction's own (SET
// LOCAL), sent with its BEGIN in one round trip.
var GenericPlans = pgx.TxOptions{BeginQuery: "BEGIN; " + genericPlans}

const genericPlans = "SET LOCAL plan_cache_mode = force_generic_plan"

// genericPlansImplicit is genericPlans for an implicit transaction (a
// pipeline without BEGIN), where SET LOCAL still lasts until the
// transaction ends but PostgreSQL warns on every call that it is not in a
// transaction block; set_config does the same without the warning.
const genericPlansImplicit = "SELECT set_config('plan_cache_mode', 'force_generic_plan', true)"

// Batcher is what ExecGeneric and QueryGeneric take: a pool or a
// connection, not a transaction (they run one of their own).
type Batcher interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// ExecGeneric runs one statement as GenericPlans do, in a transaction of
// its own sent in one round trip: the setting and the statement in one
// pipeline, which PostgreSQL runs as one implicit transaction, ended by
// the pipeline's Sync.
func ExecGeneric(ctx context.Context, db Batcher, sql string, args ...any) (pgconn.CommandTag, error) {
	var tag pgconn.CommandTag
	err := generic(ctx, db, func(b *pgx.Batch) {
		b.Queue(sql, args...).Exec(func(ct pgconn.CommandTag) error {
			tag = ct
			return nil
		})
	})
	return tag, err
}

// QueryGeneric is ExecGeneric for a statement that returns rows: read
// reads them.
func QueryGeneric(ctx context.Context, db Batcher, read func(pgx.Rows) error, sql string, args ...any) error {
	return generic(ctx, db, func(b *pgx.Batch) { b.Queue(sql, args...).Query(read) })
}

// generic sends the setting and what queue adds as one batch: one
// implicit transaction, which the batch's Sync commits. When a statement
// fails, PostgreSQL skips the rest and rolls the transaction back, its
// setting with it.
func generic(ctx context.Context, db Batcher, queue func(*pgx.Batch)) error {
	if _, ok := db.(pgx.Tx); ok {
		return errors.New("postgres: a statement on generic plans runs in a transaction of its own: give it a pool or a connection, not a transaction")
	}
	b := &pgx.Batch{}
	b.Queue(genericPlansImplicit)
	queue(b)
	return db.SendBatch(ctx, b).Close()
}

// Open creates a pool of pgx's default size and pings it, so a wrong URL
// fails here and not at the first query.
func Open(ctx context.Context, url string) (*pgxpool.Pool, error) {
	return OpenSized(ctx, url, 0)
}

// OpenSized is Open with a pool of at most maxConns connections (0: pgx's
// default), unless url sets pool_max_conns itself.
func OpenSized(ctx context.Context, url string, maxConns int) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse DATABASE_URL: %w", err)
	}
	if maxConns > config.MaxDBMaxConns {
		return nil, fmt.Errorf("a pool of %d connections: want at most %d (%s)", maxConns, config.MaxDBMaxConns, config.EnvDBMaxConns)
	}
	if maxConns > 0 && !strings.Contains(url, "pool_max_conns=") {
		cfg.MaxConns = int32(maxConns)
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	}
	cfg.AfterConnect = RegisterTypes
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("create pool: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to PostgreSQL at %s: %w", redact(cfg), err)
	}
	return pool, nil
}

// RegisterTypes teaches a connection the Go types that pgx does not know:
// google/uuid's UUID, which every order, client and event id is. pgx took
// it for a database/sql Valuer: each one sent went to its text form,
// failed to encode as a uuid (an error built and dropped), was parsed back
// and encoded again, in every statement and array of ids. With
// pgx-google-uuid's plan it is copied as its 16 bytes. Reading is as
// before (pgx prefers uuid.UUID's database/sql Scan to any registered
// plan), and a uuid read into an any is a uuid.UUID, not a [16]byte.
func RegisterTypes(_ context.Context, conn *pgx.Conn) error {
	pgxuuid.Register(conn.TypeMap())
	return nil
}

func redact(cfg *pgxpool.Config) string {
	return fmt.Sprintf("%s:%d/%s", cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Database)
}

// Migrator applies the embedded schema with goose's Provider API under a
// PostgreSQL session lock, so several processes starting at once migrate
// one after the other.
type Migrator struct {
	db       *sql.DB
	provider *goose.Provider
}

// NewMigrator opens a database/sql handle on the pool (goose needs one).
// Close it when done.
func NewMigrator(pool *pgxpool.Pool) (*Migrator, error) {
	db := stdlib.OpenDBFromPool(pool)
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("create migration lock: %w", err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations.FS, goose.WithSessionLocker(locker))
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("load migrations: %w", err)
	}
	return &Migrator{db: db, provider: p}, nil
}

// Close releases the database/sql handle (not the pool).
func (m *Migrator) Close() error { return m.db.Close() }

// Up applies every pending migration.
func (m *Migrator) Up(ctx context.Context) error {
	if _, err := m.provider.Up(ctx); err != nil {
		return fmt.Errorf("migrate up: %w", err)
	}
	return nil
}

// Down rolls back the newest applied migration.
func (m *Migrator) Down(ctx context.Context) error {
	if _, err := m.provider.Down(ctx); err != nil && !errors.Is(err, goose.ErrNoNextVersion) {
		return fmt.Errorf("migrate down: %w", err)
	}
	return nil
}

// Reset rolls back every applied migration.
func (m *Migrator) Reset(ctx context.Context) error {
	if _, err := m.provider.DownTo(ctx, 0); err != nil {
		return fmt.Errorf("migrate down to 0: %w", err)
	}
	return nil
}

// Status writes one line per migration: version, state, file.
func (m *Migrator) Status(ctx context.Context, w io.Writer) error {
	st, err := m.provider.Status(ctx)
	if err != nil {
		return fmt.Errorf("migration status: %w", err)
	}
	for _, s := range st {
		applied := "pending"
		if s.State == goose.StateApplied {
			applied = "applied " + s.AppliedAt.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(w, "%05d  %-28s  %s\n", s.Source.Version, applied, s.Source.Path)
	}
	return nil
}

// Migrate applies every pending migration on pool.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	m, err := NewMigrator(pool)
	if err != nil {
		return err
	}
	defer m.Close()
	return m.Up(ctx)
}

// SQLSTATE codes that the parts match on.
const (
	CodeUniqueViolation      = "23505"
	CodeSerializationFailure = "40001"
	CodeDeadlockDetected     = "40P01"
)

// IsUniqueViolation reports whether err is a unique violation of the named
// constraint (any constraint when name is empty), matched by SQLSTATE and
// constraint name, never by error text.
func IsUniqueViolation(err error, constraint string) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != CodeUniqueViolation {
		return false
	}
	return constraint == "" || pgErr.ConstraintName == constraint
}

// IsTransient reports whether err is worth retrying: a serialization
// failure, a deadlock, or a connection-level failure (server restarting,
// connection refused or lost).
func IsTransient(err error) bool {
	if err == nil {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code[:2] {
		case "08", "53", "57": // connection exception, insufficient resources, operator intervention (shutdown)
			return true
		}
		return pgErr.Code == CodeSerializationFailure || pgErr.Code == CodeDeadlockDetected
	}
	if pgconn.SafeToRetry(err) || pgconn.Timeout(err) {
		return true
	}
	var connErr *pgconn.ConnectError
	return errors.As(err, &connErr) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF)
}

// OpenConfig opens the pool of DATABASE_URL for a command, with a clear
// error when the variable is not set.
func OpenConfig(ctx context.Context, cfg config.Config) (*pgxpool.Pool, error) {
	if err := cfg.Require(config.EnvDatabaseURL); err != nil {
		return nil, err
	}
	return OpenSized(ctx, cfg.DatabaseURL, cfg.DBMaxConns)
}

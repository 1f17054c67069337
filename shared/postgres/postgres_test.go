package postgres_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"orderpipe/migrations"
	"orderpipe/shared/postgres"
	"orderpipe/shared/tooling/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func ctxT(t *testing.T) context.Context { return testenv.Context(t, 2*time.Minute) }

// migrationFiles lists the embedded migrations by version.
func migrationFiles(t *testing.T) map[int64]string {
	t.Helper()
	names, err := fs.Glob(migrations.FS, "*.sql")
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`^(\d+)_[A-Za-z0-9_]+\.sql$`)
	out := map[int64]string{}
	for _, n := range names {
		m := re.FindStringSubmatch(n)
		if m == nil {
			t.Fatalf("migration %s is not named NNNNN_name.sql", n)
		}
		v, _ := strconv.ParseInt(m[1], 10, 64)
		if prev, dup := out[v]; dup {
			t.Fatalf("migrations %s and %s share version %d", prev, n, v)
		}
		b, _ := fs.ReadFile(migrations.FS, n)
		if !bytes.Contains(b, []byte("-- +goose Up")) || !bytes.Contains(b, []byte("-- +goose Down")) {
			t.Fatalf("migration %s needs both -- +goose Up and -- +goose Down", n)
		}
		out[v] = n
	}
	if len(out) == 0 {
		t.Fatal("no migrations embedded")
	}
	return out
}

// tables lists the user tables of the public schema, without goose's own.
func tables(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	return testenv.Column[string](t, pool, `SELECT tablename FROM pg_tables
		WHERE schemaname = 'public' AND tablename <> 'goose_db_version' ORDER BY 1`)
}

func appliedVersions(t *testing.T, pool *pgxpool.Pool) []int64 {
	t.Helper()
	return testenv.Column[int64](t, pool, `SELECT version_id FROM goose_db_version WHERE version_id > 0 AND is_applied ORDER BY id`)
}

func status(t *testing.T, m *postgres.Migrator) string {
	t.Helper()
	var buf bytes.Buffer
	if err := m.Status(ctxT(t), &buf); err != nil {
		t.Fatalf("status: %v", err)
	}
	return buf.String()
}

func TestMigrationsUpDownUp(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	files := migrationFiles(t)
	db := testenv.EmptyDB(t)
	m, err := postgres.NewMigrator(db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()

	before := status(t, m)
	for v, name := range files {
		line := lineOf(before, name)
		if line == "" || !strings.Contains(line, "pending") || !strings.HasPrefix(line, padVersion(v)) {
			t.Fatalf("status before up: want %s pending, got:\n%s", name, before)
		}
	}

	if err := m.Up(ctx); err != nil {
		t.Fatalf("up: %v", err)
	}
	up := tables(t, db.Pool)
	for _, want := range []string{"api_clients", "orders", "order_events", "processed_messages", "outbox"} {
		if !slices.Contains(up, want) {
			t.Fatalf("after up, table %s is missing; have %v", want, up)
		}
	}
	if got := appliedVersions(t, db.Pool); len(got) != len(files) {
		t.Fatalf("after up, applied versions %v; want %d of them", got, len(files))
	}
	after := status(t, m)
	for _, name := range files {
		if line := lineOf(after, name); !strings.Contains(line, "applied ") {
			t.Fatalf("status after up: want %s applied, got:\n%s", name, after)
		}
	}
	// Up again is a no-op.
	if err := m.Up(ctx); err != nil {
		t.Fatalf("second up: %v", err)
	}

	// Down rolls back exactly the newest one.
	if err := m.Down(ctx); err != nil {
		t.Fatalf("down: %v", err)
	}
	if got := appliedVersions(t, db.Pool); len(got) != len(files)-1 {
		t.Fatalf("after one down, applied versions %v; want %d", got, len(files)-1)
	}

	// Reset rolls back every one and leaves no table behind.
	if err := m.Reset(ctx); err != nil {
		t.Fatalf("reset: %v", err)
	}
	if got := tables(t, db.Pool); len(got) != 0 {
		t.Fatalf("after reset, tables remain: %v (a Down section misses them)", got)
	}
	if got := appliedVersions(t, db.Pool); len(got) != 0 {
		t.Fatalf("after reset, applied versions %v", got)
	}
	// Down with nothing applied is not an error.
	if err := m.Down(ctx); err != nil {
		t.Fatalf("down on an empty schema: %v", err)
	}

	// And up again gives the same schema.
	if err := m.Up(ctx); err != nil {
		t.Fatalf("up after reset: %v", err)
	}
	if again := tables(t, db.Pool); strings.Join(again, ",") != strings.Join(up, ",") {
		t.Fatalf("schema differs after up/reset/up:\n first %v\n again %v", up, again)
	}
}

func TestMigrateMatchesTemplate(t *testing.T) {
	t.Parallel()
	// testenv's per-test databases come from a template migrated with the
	// same files: Migrate on one of them has nothing left to do.
	db := testenv.DB(t)
	if err := postgres.Migrate(ctxT(t), db.Pool); err != nil {
		t.Fatalf("migrate an up-to-date database: %v", err)
	}
	if got, want := len(appliedVersions(t, db.Pool)), len(migrationFiles(t)); got != want {
		t.Fatalf("applied %d versions, want %d", got, want)
	}
}

func TestTwoMigratorsAtOnce(t *testing.T) {
	t.Parallel()
	db := testenv.EmptyDB(t)
	ctx := ctxT(t)
	// Two processes starting at once: each has its own pool, so goose's
	// session lock is the only thing keeping them apart.
	pools := []*pgxpool.Pool{testenv.Pool(t, db.URL), testenv.Pool(t, db.URL), testenv.Pool(t, db.URL)}
	var wg sync.WaitGroup
	errs := make([]error, len(pools))
	start := make(chan struct{})
	for i, p := range pools {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			errs[i] = postgres.Migrate(ctx, p)
		}()
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("migrator %d: %v", i, err)
		}
	}
	got := appliedVersions(t, db.Pool)
	seen := map[int64]bool{}
	for _, v := range got {
		if seen[v] {
			t.Fatalf("version %d applied twice: %v", v, got)
		}
		seen[v] = true
	}
	if len(got) != len(migrationFiles(t)) {
		t.Fatalf("applied %v, want every migration once", got)
	}
}

func TestIsUniqueViolation(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	ctx := ctxT(t)
	insertClient := func(hash string) error {
		_, err := db.Pool.Exec(ctx, `INSERT INTO api_clients (client_id, name, api_key_hash, webhook_secret)
			VALUES (gen_random_uuid(), 'c', $1, 's')`, []byte(hash))
		return err
	}
	if err := insertClient("k1"); err != nil {
		t.Fatal(err)
	}
	err := insertClient("k1")
	if err == nil {
		t.Fatal("duplicate api_key_hash accepted")
	}
	wrapped := errors.Join(errors.New("create client"), err)
	for _, tc := range []struct {
		err        error
		constraint string
		want       bool
	}{
		{err, "uk_api_key_hash", true},
		{err, "", true},
		{wrapped, "uk_api_key_hash", true},
		{err, "uk_order_request", false},
		{nil, "", false},
		{errors.New(`duplicate key value violates unique constraint "uk_api_key_hash"`), "", false},
		{&pgconn.PgError{Code: "23503", ConstraintName: "uk_api_key_hash"}, "uk_api_key_hash", false},
	} {
		if got := postgres.IsUniqueViolation(tc.err, tc.constraint); got != tc.want {
			t.Errorf("IsUniqueViolation(%v, %q) = %v, want %v", tc.err, tc.constraint, got, tc.want)
		}
	}
	if postgres.IsTransient(err) {
		t.Error("a unique violation is not transient")
	}

	// The order's own constraints, by name.
	var clientID string
	if err := db.Pool.QueryRow(ctx, `SELECT client_id::text FROM api_clients LIMIT 1`).Scan(&clientID); err != nil {
		t.Fatal(err)
	}
	insertOrder := func(orderNo, requestID string) error {
		_, err := db.Pool.Exec(ctx, `INSERT INTO orders (order_id, order_no, client_id, request_id, fingerprint,
			status, user_id, items, amount, currency)
			VALUES (gen_random_uuid(), $1, $2, $3, '\x00', 'processing', 1, '[]', 1, 'CNY')`, orderNo, clientID, requestID)
		return err
	}
	if err := insertOrder("ORD1", "r1"); err != nil {
		t.Fatal(err)
	}
	if err := insertOrder("ORD2", "r1"); !postgres.IsUniqueViolation(err, "uk_order_request") || postgres.IsUniqueViolation(err, "uk_order_no") {
		t.Errorf("same request_id: want uk_order_request only, got %v", err)
	}
	if err := insertOrder("ORD1", "r2"); !postgres.IsUniqueViolation(err, "uk_order_no") || postgres.IsUniqueViolation(err, "uk_order_request") {
		t.Errorf("same order_no: want uk_order_no only, got %v", err)
	}
}

func TestIsTransientConnectionRefused(t *testing.T) {
	t.Parallel()
	port := testenv.ClosedPort(t) // nothing listens there
	url := "postgres://postgres@127.0.0.1:" + strconv.Itoa(port) + "/postgres?sslmode=disable&connect_timeout=2"

	ctx := ctxT(t)
	conn, err := pgx.Connect(ctx, url)
	if err == nil {
		conn.Close(ctx)
		t.Fatalf("connected to a closed port %d", port)
	}
	if !postgres.IsTransient(err) {
		t.Errorf("IsTransient(connection refused) = false: %v", err)
	}
	_, err = postgres.Open(ctx, url)
	if err == nil || !postgres.IsTransient(err) {
		t.Errorf("Open on a closed port: want a transient error, got %v", err)
	}
	if !strings.Contains(err.Error(), "127.0.0.1:"+strconv.Itoa(port)) || strings.Contains(err.Error(), "postgres@") {
		t.Errorf("Open's error should name the host and port without the user: %v", err)
	}
	if _, err := postgres.Open(ctx, "postgres://%zz"); err == nil || postgres.IsTransient(err) {
		t.Errorf("a malformed URL must fail and not be transient: %v", err)
	}
}

func TestIsTransientServerErrors(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	ctx := ctxT(t)

	// A backend terminated by an operator (SQLSTATE 57P01) or its lost
	// connection: worth a retry on a new connection.
	victim, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer victim.Close(t.Context())
	var pid uint32
	if err := victim.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
		t.Fatal(err)
	}
	_, err = victim.Exec(ctx, "SELECT 1")
	if err == nil {
		t.Fatal("query on a terminated backend succeeded")
	}
	if !postgres.IsTransient(err) {
		t.Errorf("IsTransient(terminated backend) = false: %#v", err)
	}

	// A serialization failure between two SERIALIZABLE transactions.
	if _, err := db.Pool.Exec(ctx, "CREATE TABLE ser (k int PRIMARY KEY, v int); INSERT INTO ser VALUES (1, 0), (2, 0)"); err != nil {
		t.Fatal(err)
	}
	opts := pgx.TxOptions{IsoLevel: pgx.Serializable}
	tx1, err := db.Pool.BeginTx(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx1.Rollback(ctx) }()
	tx2, err := db.Pool.BeginTx(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx2.Rollback(ctx) }()
	var sum int
	mustExec := func(tx pgx.Tx, sql string) {
		t.Helper()
		if _, err := tx.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	if err := tx1.QueryRow(ctx, "SELECT sum(v) FROM ser").Scan(&sum); err != nil {
		t.Fatal(err)
	}
	if err := tx2.QueryRow(ctx, "SELECT sum(v) FROM ser").Scan(&sum); err != nil {
		t.Fatal(err)
	}
	mustExec(tx1, "UPDATE ser SET v = 1 WHERE k = 1")
	mustExec(tx2, "UPDATE ser SET v = 1 WHERE k = 2")
	if err := tx1.Commit(ctx); err != nil {
		t.Fatalf("first commit: %v", err)
	}
	err = tx2.Commit(ctx)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != postgres.CodeSerializationFailure {
		t.Fatalf("second commit: want a serialization failure, got %v", err)
	}
	if !postgres.IsTransient(err) {
		t.Error("IsTransient(serialization failure) = false")
	}
	if postgres.IsTransient(nil) || postgres.IsTransient(context.Canceled) {
		t.Error("nil and context.Canceled are not transient")
	}
}

func lineOf(text, name string) string {
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, name) {
			return l
		}
	}
	return ""
}

func padVersion(v int64) string {
	s := strconv.FormatInt(v, 10)
	for len(s) < 5 {
		s = "0" + s
	}
	return s
}

// TestOpenSized: the pool holds the configured number of connections, a
// pool_max_conns in the URL wins, and 0 keeps pgx's default.
func TestOpenSized(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	ctx := ctxT(t)
	sep := "?"
	if strings.Contains(db.URL, "?") {
		sep = "&"
	}
	for _, c := range []struct {
		url  string
		max  int
		want int32
	}{
		{db.URL, 32, 32},
		{db.URL + sep + "pool_max_conns=3", 32, 3},
	} {
		pool, err := postgres.OpenSized(ctx, c.url, c.max)
		if err != nil {
			t.Fatal(err)
		}
		got := pool.Config().MaxConns
		pool.Close()
		if got != c.want {
			t.Errorf("OpenSized(%q, %d): MaxConns %d, want %d", c.url, c.max, got, c.want)
		}
	}
	pool, err := postgres.OpenSized(ctx, db.URL, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	def, _ := pgxpool.ParseConfig(db.URL)
	if pool.Config().MaxConns != def.MaxConns {
		t.Errorf("OpenSized(url, 0): MaxConns %d, want pgx's default %d", pool.Config().MaxConns, def.MaxConns)
	}
	if _, err := postgres.OpenSized(ctx, "postgres://x/?pool_max_conns=zero", 4); err == nil || !strings.Contains(err.Error(), "DATABASE_URL") {
		t.Errorf("malformed pool_max_conns: %v", err)
	}
	// More than a pool can hold is refused, not truncated (to 1, here).
	if pool, err := postgres.OpenSized(ctx, db.URL, 1<<32+1); err == nil {
		t.Errorf("OpenSized(url, 1<<32+1): a pool of %d, want an error", pool.Config().MaxConns)
		pool.Close()
	}
}

// TestUUIDsAreCopiedNotFormatted: pgx took google/uuid's UUID for a
// database/sql Valuer: every id sent went to its text form, failed to
// encode as a uuid (an error built and dropped), and was parsed back. The
// pools of Open encode it as its 16 bytes, and what is read back is the
// same (reading still goes through uuid.UUID's Scan: pgx prefers a
// database/sql Scanner to any registered plan).
func TestUUIDsAreCopiedNotFormatted(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	pool := testenv.Pool(t, db.URL)
	ctx := t.Context()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	tm := conn.Conn().TypeMap()
	for _, v := range []any{uuid.UUID{}, []uuid.UUID{{}}} {
		oid := uint32(pgtype.UUIDOID)
		if _, ok := v.([]uuid.UUID); ok {
			oid = pgtype.UUIDArrayOID
		}
		plan := tm.PlanEncode(oid, pgtype.BinaryFormatCode, v)
		if plan == nil || strings.Contains(fmt.Sprintf("%T", plan), "DriverValuer") {
			t.Errorf("%T is encoded by %T: through its text form", v, plan)
		}
	}

	ids := []uuid.UUID{uuid.New(), uuid.Must(uuid.NewV7())}
	var back []uuid.UUID
	var one uuid.UUID
	var text string
	if err := pool.QueryRow(ctx, `SELECT $1::uuid[], ($1::uuid[])[2], ($1::uuid[])[1]::text`, ids).Scan(&back, &one, &text); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(back, ids) || one != ids[1] || text != ids[0].String() {
		t.Fatalf("read back %v, %v, %q; want %v, %v, %q", back, one, text, ids, ids[1], ids[0])
	}
	var null uuid.NullUUID
	var ptr *uuid.UUID
	if err := pool.QueryRow(ctx, `SELECT NULL::uuid, NULL::uuid`).Scan(&null, &ptr); err != nil || null.Valid || ptr != nil {
		t.Fatalf("NULL read as %+v, %v: %v", null, ptr, err)
	}
	var wasString bool
	if err := pool.QueryRow(ctx, `SELECT $1::uuid = $2::uuid`, ids[0], ids[0].String()).Scan(&wasString); err != nil || !wasString {
		t.Fatalf("a uuid given as a string: %v, %v", wasString, err)
	}
}

// Package testenv gives tests real servers: one PostgreSQL per test binary,
// started from the machine's own binaries (see shared/tooling/localpg), with a
// migrated template database that each test clones into its own database;
// and one in-process NATS server with JetStream (the real nats-server as a
// library, file store in a temp dir), with a stream and subject prefix of
// its own for each test. TEST_DATABASE_URL and TEST_NATS_URL point it at
// external servers instead.
//
// Every test package's TestMain calls Main, which stops the servers after
// the tests, removes their temp dirs and fails the binary when goroutines
// leak. A server that cannot start fails the test loudly; nothing skips.
package testenv

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"orderpipe/shared/app"
	"orderpipe/shared/config"
	"orderpipe/shared/natsjs"
	"orderpipe/shared/orderevent"
	"orderpipe/shared/postgres"
	"orderpipe/shared/tooling/localpg"
)

var (
	pgOnce     sync.Once
	pgErr      error
	pgServer   *localpg.Server
	pgAdminURL string // URL of the maintenance database
	pgTemplate string
	pgDir      string

	natsOnce   sync.Once
	natsErr    error
	natsServer *server.Server
	natsURL    string
	natsDir    string

	seq atomic.Int64
)

// Main runs the tests of a package, then stops the shared servers, removes
// their temp dirs and checks for leaked goroutines. Call it from TestMain:
//
//	func TestMain(m *testing.M) { testenv.Main(m) }
func Main(m *testing.M) {
	code := m.Run()
	teardown()
	if code == 0 {
		if err := goleak.Find(goleakOptions()...); err != nil {
			fmt.Fprintf(os.Stderr, "testenv: leaked goroutines after the tests:\n%v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

func goleakOptions() []goleak.Option {
	return []goleak.Option{
		// database/sql's connection opener lives as long as a *sql.DB that
		// goose opened and closed; it exits asynchronously.
		goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"),
	}
}

func teardown() {
	if pgTemplate != "" && pgAdminURL != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if conn, err := pgx.Connect(ctx, pgAdminURL); err == nil {
			_, _ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{pgTemplate}.Sanitize()+" WITH (FORCE)")
			_ = conn.Close(ctx)
		}
		cancel()
	}
	if pgServer != nil {
		if err := pgServer.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "testenv: stop postgres: %v\n", err)
		}
	}
	if pgDir != "" {
		_ = os.RemoveAll(pgDir)
	}
	if natsServer != nil {
		natsServer.Shutdown()
		natsServer.WaitForShutdown()
	}
	if natsDir != "" {
		_ = os.RemoveAll(natsDir)
	}
}

// Logger returns a logger that writes to the test's log.
func Logger(t testing.TB) *slog.Logger { return LoggerAt(t, slog.LevelDebug) }

// LoggerAt returns a logger of level and above that writes to the test's
// log (slog.LevelWarn for load tests).
func LoggerAt(t testing.TB, level slog.Level) *slog.Logger {
	return slog.New(slog.NewTextHandler(Writer(t), &slog.HandlerOptions{Level: level}))
}

// Writer returns an io.Writer that logs each write to the test's log.
func Writer(t testing.TB) io.Writer { return testWriter{t} }

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// Env returns the app.Env that a part runs on in a test: db's pool, n's
// connection and topology (n may be nil: no broker), the test's logger, a
// registry of its own and a 5 s shutdown timeout. Set more of Config on
// the result.
func Env(t testing.TB, db *Database, n *NATSEnv) *app.Env {
	env := &app.Env{Config: config.Config{ShutdownTimeout: 5 * time.Second}, Logger: Logger(t), Metrics: app.NewRegistry()}
	// The pool and the connections are the helpers' to close; the pools a
	// part reserves on the Env are the Env's.
	t.Cleanup(env.CloseReserved)
	if db != nil {
		env.Pool = db.Pool
		env.Config.DatabaseURL = db.URL
	}
	if n != nil {
		env.NC, env.JS, env.Topology = n.Conn, n.JS, n.Topology
		env.Config.NATSURL = n.URL
	}
	return env
}

// Database is one test's own database, cloned from the migrated template.
type Database struct {
	// Name of the database.
	Name string
	// URL connects to it.
	URL string
	// Pool is open on it and closed when the test ends.
	Pool *pgxpool.Pool
}

func startPostgres() {
	if u := os.Getenv("TEST_DATABASE_URL"); u != "" {
		pgAdminURL = u
	} else {
		dir, err := reachableTempDir()
		if err != nil {
			pgErr = err
			return
		}
		pgDir = dir
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		pgServer, pgErr = localpg.Start(ctx, localpg.Options{DataDir: dir + "/data"})
		if pgErr != nil {
			return
		}
		pgAdminURL = pgServer.URL("postgres")
	}
	pgTemplate = fmt.Sprintf("orderpipe_tmpl_%d_%d", os.Getpid(), time.Now().UnixNano()%1e6)
	pgErr = createTemplate(pgTemplate)
}

func createTemplate(name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, pgAdminURL)
	if err != nil {
		return fmt.Errorf("connect to test PostgreSQL: %w", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return fmt.Errorf("create template database: %w", err)
	}
	pool, err := postgres.Open(ctx, dbURL(pgAdminURL, name))
	if err != nil {
		return err
	}
	defer pool.Close()
	return postgres.Migrate(ctx, pool)
}

func dbURL(base, db string) string {
	u, err := url.Parse(base)
	if err != nil {
		panic(fmt.Sprintf("testenv: bad database URL: %v", err))
	}
	u.Path = "/" + db
	return u.String()
}

// DB returns a fresh, migrated database of the test's own. It is dropped
// when the test ends.
func DB(t testing.TB) *Database {
	t.Helper()
	return newDB(t, "t", true)
}

// EmptyDB returns a fresh database with no schema (for migration tests).
func EmptyDB(t testing.TB) *Database {
	t.Helper()
	return newDB(t, "e", false)
}

// newDB creates a database (a clone of the migrated template, or empty)
// that is dropped when the test ends.
func newDB(t testing.TB, prefix string, fromTemplate bool) *Database {
	t.Helper()
	pgOnce.Do(startPostgres)
	if pgErr != nil {
		t.Fatalf("testenv: PostgreSQL could not start: %v", pgErr)
	}
	name := fmt.Sprintf("%s_%d_%d", prefix, os.Getpid(), seq.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, pgAdminURL)
	if err != nil {
		t.Fatalf("testenv: connect to PostgreSQL: %v", err)
	}
	defer conn.Close(ctx)
	create := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize()
	if fromTemplate {
		create += " TEMPLATE " + pgx.Identifier{pgTemplate}.Sanitize()
	}
	if _, err := conn.Exec(ctx, create); err != nil {
		t.Fatalf("testenv: create test database: %v", err)
	}
	d := &Database{Name: name, URL: dbURL(pgAdminURL, name)}
	d.Pool, err = postgres.Open(ctx, d.URL)
	if err != nil {
		t.Fatalf("testenv: open test database: %v", err)
	}
	t.Cleanup(func() {
		d.Pool.Close()
		ctx, cancel := context.WithTimeout(context.WithoutCancel(context.Background()), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, pgAdminURL)
		if err != nil {
			t.Errorf("testenv: drop test database: %v", err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Errorf("testenv: drop test database: %v", err)
		}
	})
	return d
}

// reachableTempDir makes a temp dir that the postgres account can pass
// through when the tests run as root (a server started by localpg runs as
// postgres then; t.TempDir's parent is 0700).
func reachableTempDir() (string, error) {
	dir, err := os.MkdirTemp("", "orderpipe-testpg-")
	if err != nil {
		return "", err
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		_ = os.RemoveAll(dir)
		return "", err
	}
	return dir, nil
}

// PostgresDataDir returns a not-yet-existing data folder for a PostgreSQL
// cluster of the test's own, reachable by the postgres account; it is
// removed when the test ends (after the cleanups registered later, such as
// stopping the server).
func PostgresDataDir(t testing.TB) string {
	t.Helper()
	dir, err := reachableTempDir()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return filepath.Join(dir, "data")
}

// Postgres starts a PostgreSQL server of the test's own (for tests that
// restart or stop it), with the schema applied to database "postgres". It
// is stopped and removed when the test ends.
func Postgres(t testing.TB) *localpg.Server {
	t.Helper()
	dataDir := PostgresDataDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := localpg.Start(ctx, localpg.Options{DataDir: dataDir})
	if err != nil {
		t.Fatalf("testenv: PostgreSQL could not start: %v", err)
	}
	t.Cleanup(func() { // runs before the RemoveAll above
		if err := s.Stop(); err != nil {
			t.Errorf("testenv: stop postgres: %v", err)
		}
	})
	pool, err := postgres.Open(ctx, s.URL("postgres"))
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	defer pool.Close()
	if err := postgres.Migrate(ctx, pool); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return s
}

// NATSEnv is one test's share of the NATS server: its URL, and a topology
// (stream name, subject prefix) that no other test uses.
type NATSEnv struct {
	// URL of the server.
	URL string
	// Topology is the test's own stream and subject prefix.
	Topology orderevent.Topology
	// Conn and JS are a connection for the test's own use, closed at the end.
	Conn *nats.Conn
	JS   jetstream.JetStream
}

func startNATS() {
	if u := os.Getenv("TEST_NATS_URL"); u != "" {
		natsURL = u
		return
	}
	dir, err := os.MkdirTemp("", "orderpipe-testnats-")
	if err != nil {
		natsErr = err
		return
	}
	natsDir = dir
	natsServer, natsErr = natsjs.StartEmbedded(natsjs.EmbeddedOptions{StoreDir: dir})
	if natsErr == nil {
		natsURL = natsServer.ClientURL()
	}
}

// NATS returns the shared NATS server with a topology of the test's own; its
// stream is provisioned, and deleted when the test ends.
func NATS(t testing.TB) *NATSEnv {
	t.Helper()
	natsOnce.Do(startNATS)
	if natsErr != nil {
		t.Fatalf("testenv: NATS could not start: %v", natsErr)
	}
	n := seq.Add(1)
	env := &NATSEnv{URL: natsURL, Topology: orderevent.Topology{
		Stream: fmt.Sprintf("T%d_%d", os.Getpid(), n),
		Prefix: fmt.Sprintf("t%d_%d", os.Getpid(), n),
	}}
	var err error
	env.Conn, env.JS, err = natsjs.Connect(natsURL, t.Name(), Logger(t))
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := natsjs.EnsureStream(ctx, env.JS, env.Topology, 1); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = env.JS.DeleteStream(ctx, env.Topology.Stream)
		env.Conn.Close()
	})
	return env
}

// NATSServer is a NATS server of the test's own, for tests that restart it.
type NATSServer struct {
	t     testing.TB
	dir   string
	port  int
	mu    sync.Mutex
	srv   *server.Server
	alive bool
}

// OwnNATS starts a NATS server of the test's own with its store in a temp
// dir; it is shut down when the test ends.
func OwnNATS(t testing.TB) *NATSServer {
	t.Helper()
	s := &NATSServer{t: t, dir: t.TempDir(), port: -1}
	s.Start()
	t.Cleanup(s.Stop)
	return s
}

// URL of the server (stable across restarts).
func (s *NATSServer) URL() string {
	return fmt.Sprintf("nats://127.0.0.1:%d", s.port)
}

// Start starts the server (again) on the same port and store.
func (s *NATSServer) Start() {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.alive {
		return
	}
	srv, err := natsjs.StartEmbedded(natsjs.EmbeddedOptions{StoreDir: s.dir, Port: s.port})
	if err != nil {
		s.t.Fatalf("testenv: NATS could not start: %v", err)
	}
	s.srv, s.alive = srv, true
	if s.port == -1 {
		s.port = srv.Addr().(*net.TCPAddr).Port
	}
}

// Stop shuts the server down and waits for it.
func (s *NATSServer) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.alive {
		return
	}
	s.srv.Shutdown()
	s.srv.WaitForShutdown()
	s.alive = false
}

// WaitFor polls cond every 10ms until it returns true, failing the test
// with msg after timeout. Use it instead of sleeping.
func WaitFor(t testing.TB, timeout time.Duration, msg string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, msg)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func natsConnect(url string, logger *slog.Logger) (*nats.Conn, jetstream.JetStream, error) {
	return natsjs.Connect(url, "testenv", logger)
}

func openPool(t testing.TB, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := postgres.Open(context.Background(), url)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Pool opens a pool on url that is closed when the test ends.
func Pool(t testing.TB, url string) *pgxpool.Pool { return openPool(t, url) }

// Connect opens a NATS connection on url that is closed when the test ends.
func Connect(t testing.TB, url string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, js, err := natsConnect(url, Logger(t))
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc, js
}

// OneConnection opens a pool of a single connection on db, closed when the
// test ends: what it runs, one backend runs, whose statistics TableReads
// can flush.
func OneConnection(t testing.TB, db *Database) *pgxpool.Pool {
	t.Helper()
	pool, err := postgres.OpenSized(context.Background(), db.URL, 1)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Reads is how many rows of a table were read, from pg_stat_user_tables:
// by full scans (seq_tup_read) and fetched through its indexes
// (idx_tup_fetch).
type Reads struct {
	FullScan, ByIndex int64
}

// TableReads flushes the statistics of one (a OneConnection), waits until
// table's counters in db show at least updated rows updated, and returns
// how many of table's rows were read in all.
func TableReads(t testing.TB, db *Database, one *pgxpool.Pool, table string, updated int64) Reads {
	t.Helper()
	if _, err := one.Exec(t.Context(), `SELECT pg_stat_force_next_flush()`); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	var upd int64
	var r Reads
	WaitFor(t, 30*time.Second, table+"'s counters in pg_stat_user_tables", func() bool {
		err := db.Pool.QueryRow(t.Context(), `SELECT n_tup_upd, seq_tup_read, coalesce(idx_tup_fetch, 0) FROM pg_stat_user_tables WHERE relname = $1`, table).
			Scan(&upd, &r.FullScan, &r.ByIndex)
		return err == nil && upd >= updated
	})
	return r
}

// GrowOrders adds n confirmed orders of client to the database of pool in
// one statement: a table grown after a statement's plan may have been
// cached, for the tests that TableReads checks.
func GrowOrders(t testing.TB, pool *pgxpool.Pool, client uuid.UUID, n int) {
	t.Helper()
	if _, err := pool.Exec(t.Context(), `
		INSERT INTO orders (order_id, order_no, client_id, request_id, fingerprint, status, user_id, items, amount, currency)
		SELECT id, 'GROWN-' || id, $1, 'grown-' || id, '\x00', 'confirmed', 1, '[]', 1, 'CNY'
		FROM (SELECT gen_random_uuid() AS id FROM generate_series(1, $2)) g`, client, n); err != nil {
		t.Fatalf("testenv: grow orders: %v", err)
	}
}

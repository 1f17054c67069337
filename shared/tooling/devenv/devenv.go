// Package devenv starts the infrastructure of `orderpipe dev` on a laptop:
// a managed PostgreSQL in $ORDERPIPE_DATA_DIR/pg (kept between runs), an
// embedded NATS server with JetStream in $ORDERPIPE_DATA_DIR/nats, the
// schema, a dev API client created once, first-start seeding hooks, and
// $ORDERPIPE_DATA_DIR/dev.env. DATABASE_URL and NATS_URL, when set, replace
// the managed servers.
package devenv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"

	"orderpipe/shared/config"
	"orderpipe/shared/natsjs"
	"orderpipe/shared/postgres"
	"orderpipe/shared/tenant"
	"orderpipe/shared/tooling/localpg"
)

// Preferred ports; a busy one is replaced by a free one.
const (
	PreferredPGPort   = 55432
	PreferredNATSPort = 4222
)

// Seeder puts a part's dev data in place (e.g. stocking the inventory). It
// runs after the migrations at every `dev` start with the part, and must
// leave what already exists as it is: the data dir may be new, or known
// from a start without that part (`dev producer`, then `dev`), or from an
// earlier start with it.
type Seeder func(ctx context.Context, pool *pgxpool.Pool) error

// Stack is the running dev infrastructure.
type Stack struct {
	// Config is the input config with DATABASE_URL and NATS_URL filled in.
	Config config.Config
	// Credentials of the dev client.
	Credentials tenant.Credentials
	// EnvFile is the path of dev.env.
	EnvFile string

	pg   *localpg.Server
	nats *server.Server
}

// Start brings the infrastructure up. Call Stop when done, whatever
// happens after.
func Start(ctx context.Context, cfg config.Config, logger *slog.Logger, seeders ...Seeder) (*Stack, error) {
	dir, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create data dir: %w", err)
	}
	s := &Stack{Config: cfg, EnvFile: filepath.Join(dir, "dev.env")}
	ok := false
	defer func() {
		if !ok {
			s.Stop()
		}
	}()
	if cfg.DatabaseURL == "" {
		port := PreferredPGPort
		if !portFree(port) {
			port = 0
		}
		logger.Info("starting local PostgreSQL", slog.String("data", filepath.Join(dir, "pg")))
		args := devPGArgs
		if cfg.DevPGStatements {
			args = append(slices.Clip(args), statementsPGArgs...)
		}
		s.pg, err = localpg.Start(ctx, localpg.Options{DataDir: filepath.Join(dir, "pg"), Port: port, Durable: true, ExtraArgs: args})
		if err != nil {
			return nil, err
		}
		s.Config.DatabaseURL = s.pg.URL("postgres")
	}
	if cfg.NATSURL == "" {
		port := PreferredNATSPort
		if !portFree(port) {
			port = -1
		}
		logger.Info("starting embedded NATS", slog.String("data", filepath.Join(dir, "nats")))
		s.nats, err = natsjs.StartEmbedded(natsjs.EmbeddedOptions{StoreDir: filepath.Join(dir, "nats"), Port: port, SyncAlways: cfg.DevNATSSyncAlways})
		if err != nil {
			return nil, err
		}
		s.Config.NATSURL = s.nats.ClientURL()
	}
	pool, err := postgres.Open(ctx, s.Config.DatabaseURL)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	if err := postgres.Migrate(ctx, pool); err != nil {
		return nil, err
	}
	if s.pg != nil && cfg.DevPGStatements {
		if _, err := pool.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
			return nil, fmt.Errorf("%s: %w", config.EnvDevPGStatements, err)
		}
	}
	if err := s.devClient(ctx, pool, dir); err != nil {
		return nil, err
	}
	for _, seed := range seeders {
		if err := seed(ctx, pool); err != nil {
			return nil, fmt.Errorf("seed dev data: %w", err)
		}
	}
	if err := os.WriteFile(s.EnvFile, []byte(s.EnvText()), 0o600); err != nil {
		return nil, fmt.Errorf("write %s: %w", s.EnvFile, err)
	}
	ok = true
	return s, nil
}

// devClient loads the dev client's credentials from the data dir, or
// creates the client when the database does not know it (a new data dir,
// or a new DATABASE_URL).
func (s *Stack) devClient(ctx context.Context, pool *pgxpool.Pool, dir string) error {
	path := filepath.Join(dir, "dev-client.json")
	if b, err := os.ReadFile(path); err == nil {
		var c tenant.Credentials
		if json.Unmarshal(b, &c) == nil {
			if _, err := tenant.Authenticate(ctx, pool, c.APIKey); err == nil {
				s.Credentials = c
				return nil
			}
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	c, err := tenant.Create(ctx, pool, "dev")
	if err != nil {
		return err
	}
	b, _ := json.MarshalIndent(c, "", "  ")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	s.Credentials = c
	return nil
}

// EnvText is dev.env's content: shell KEY=value lines.
func (s *Stack) EnvText() string {
	addr := s.Config.HTTPAddr
	lines := []string{
		"DATABASE_URL=" + s.Config.DatabaseURL,
		"NATS_URL=" + s.Config.NATSURL,
		"HTTP_ADDR=" + addr,
		"ORDERPIPE_API_KEY=" + s.Credentials.APIKey,
		"ORDERPIPE_WEBHOOK_SECRET=" + s.Credentials.WebhookSecret,
	}
	if s.Config.PSPURL != "" {
		lines = append(lines, "PSP_URL="+s.Config.PSPURL)
	}
	return strings.Join(lines, "\n") + "\n"
}

// BaseURL is the intake's URL as seen from this machine.
func (s *Stack) BaseURL() string {
	host, port, err := net.SplitHostPort(s.Config.HTTPAddr)
	if err != nil {
		return "http://" + s.Config.HTTPAddr
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "localhost"
	}
	return "http://" + net.JoinHostPort(host, port)
}

// Stop shuts down what Start started (never an external server).
func (s *Stack) Stop() {
	if s.nats != nil {
		s.nats.Shutdown()
		s.nats.WaitForShutdown()
		s.nats = nil
	}
	if s.pg != nil {
		_ = s.pg.Stop()
		s.pg = nil
	}
}

// devPGArgs are dev's PostgreSQL settings beyond localpg's. A server
// that has been running recycles its old WAL segments; a new one, like
// dev's, creates every 16 MB segment it writes, and by default fills it
// with zeros first (wal_init_zero), stalling the commit that needs it: on
// a fresh dev at full intake load the slowest requests took 115–125 ms,
// against 41–46 ms once the segments existed (docs/benchmarks.md,
// eleventh step). Without the zeros a new segment costs what a recycled
// one does. Durability is unchanged: fsync, synchronous_commit and
// full_page_writes stay on.
var devPGArgs = []string{"-c", "wal_init_zero=off"}

// statementsPGArgs load pg_stat_statements (ORDERPIPE_DEV_PG_STATEMENTS):
// PostgreSQL's execution time, calls and rows per statement, which `bench`
// reports for its run. Off by default, as it costs a little on every
// statement. Given at each start, not stored in the data dir: a start
// without the setting runs without the extension's library.
var statementsPGArgs = []string{"-c", "shared_preload_libraries=pg_stat_statements"}

func portFree(port int) bool {
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return false
	}
	_ = l.Close()
	return true
}

// Package bench is `orderpipe bench`, the project's load generator: it
// measures a running stack from outside (the intake over HTTP, the
// pipeline through the database) and a plain INSERT on the same
// PostgreSQL to compare against. It is tooling, not product: no part of
// the pipeline imports it.
//
// HTTP load is generated with vegeta (github.com/tsenart/vegeta/v12) as a
// library, in its closed-loop mode (rate 0, a fixed number of workers:
// each worker sends its next request when the previous one answered); the
// plain INSERT runs the same closed loop over a pgx pool and feeds the same
// vegeta metrics, so both sides of a comparison are summarised alike.
package bench

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"orderpipe/producer/mcp"
	"orderpipe/shared/cli"
	"orderpipe/shared/config"
	"orderpipe/shared/tooling/devenv"
)

// Subcommands lists `orderpipe bench`'s actions in the order help shows them.
var Subcommands = []string{"intake", "replay", "e2e", "baseline", "compare"}

// Settings is one bench invocation's command line, validated.
type Settings struct {
	// Action is the subcommand: one of Subcommands.
	Action string `json:"action"`
	// URL is the intake's base URL; APIKey the client it sends as.
	URL    string `json:"url"`
	APIKey string `json:"-"`
	// DatabaseURL reaches the stack's PostgreSQL (for baseline, e2e and
	// the database checks).
	DatabaseURL string `json:"-"`
	// Concurrency is the number of closed-loop clients (intake, baseline,
	// e2e, compare); Duration how long each run lasts.
	Concurrency int           `json:"concurrency"`
	Duration    time.Duration `json:"duration_ns"`
	// Rate, when not 0, makes intake and e2e open-loop: Rate orders per
	// second in all, sent on a schedule whether or not earlier ones were
	// answered, by at most Concurrency clients at once (a load below what
	// the stack can take, to measure its latency there).
	Rate int `json:"rate,omitempty"`
	// Users and Requests shape replay: Users × Requests calls (see Burst).
	Users    int `json:"users"`
	Requests int `json:"requests_per_user"`
	// Cold makes replay open a new connection for each of its requests
	// inside the measured burst; by default the connections are opened
	// first (one warm-up burst of GET /healthz), as a shop backend's
	// keep-alive client has them open.
	Cold bool `json:"cold,omitempty"`
	// Burst makes replay send all Users × Requests requests at once;
	// without it the Users send at once, each its Requests one after
	// another.
	Burst bool `json:"burst"`
	// Rounds is how many baseline+intake pairs compare runs.
	Rounds int `json:"rounds"`
	// Timeout bounds one request.
	Timeout time.Duration `json:"timeout_ns"`
	// Drain bounds how long e2e (and compare between rounds) waits for
	// accepted orders to reach a terminal state.
	Drain time.Duration `json:"drain_ns"`
	// Settle makes compare wait, before each round, until the orders of
	// its earlier intake rounds are terminal, so that the pipeline's
	// draining does not share the CPU with the next round.
	Settle bool `json:"settle"`
	// Out is the folder for result.json and chart.html.
	Out string `json:"out"`
}

// Limits of the flags.
const (
	MaxConcurrency = 10000
	MaxRequests    = 1_000_000
	MaxRate        = 1_000_000
)

type flags struct {
	url, apiKey, databaseURL, envFile, out *string
	concurrency, users, requests, rounds   *int
	rate                                   *int
	duration, timeout, drain               *time.Duration
	settle, cold, burst                    *bool
}

// Command is `orderpipe bench <action> [flags]`.
func Command() cli.Command { return command(Run) }

// command is Command with the function that runs the parsed settings.
func command(run func(ctx context.Context, s Settings, out, progress io.Writer) error) cli.Command {
	var f flags
	return cli.Command{
		Name:    "bench",
		Summary: "load-test a running stack: bench intake|replay|e2e|baseline|compare (reads dev.env or --url/--api-key/--database-url)",
		Usage:   "intake|replay|e2e|baseline|compare [--concurrency 64] [--rate 0] [--duration 15s] [--users 100 --requests 10 --burst=false --cold] [--rounds 4] [--out DIR] [--url U --api-key K --database-url D]",
		Env:     []string{config.EnvDataDir, config.EnvDatabaseURL, config.EnvHTTPAddr, mcp.EnvAPIKey.Name},
		Setup: func(fs *flag.FlagSet) {
			f.url = fs.String("url", "", "base URL of the intake (default: from dev.env, else HTTP_ADDR)")
			f.apiKey = fs.String("api-key", "", "API key to send as (default: from dev.env, else ORDERPIPE_API_KEY)")
			f.databaseURL = fs.String("database-url", "", "the stack's PostgreSQL (default: from dev.env, else DATABASE_URL)")
			f.envFile = fs.String("env-file", "", "dev.env to read (default: $ORDERPIPE_DATA_DIR/dev.env; none when missing)")
			f.out = fs.String("out", "", "folder for result.json and chart.html (default: a new folder under ./bench-results)")
			f.concurrency = fs.Int("concurrency", 64, "closed-loop clients (intake, e2e, baseline, compare); with --rate, the clients to start with (more start whenever all wait for an answer, so that requests leave on schedule)")
			f.rate = fs.Int("rate", 0, "intake, e2e: orders per second in all, open-loop (0: closed-loop, as fast as the clients are answered)")
			f.duration = fs.Duration("duration", 15*time.Second, "length of one run (intake, e2e, baseline, and each compare round)")
			f.users = fs.Int("users", 100, "replay: users, each with its own request_id")
			f.requests = fs.Int("requests", 10, "replay: requests per user")
			f.burst = fs.Bool("burst", true, "replay: send all users × requests at once (false: the users at once, each its requests one after another)")
			f.cold = fs.Bool("cold", false, "replay: open the connections inside the measured burst (default: opened by a warm-up burst first)")
			f.rounds = fs.Int("rounds", 4, "compare: baseline+intake pairs (A B A B …)")
			f.timeout = fs.Duration("timeout", 30*time.Second, "intake, e2e, compare: bound on one request")
			f.drain = fs.Duration("drain", 5*time.Minute, "e2e: how long to wait for accepted orders to finish")
			f.settle = fs.Bool("settle", true, "compare: before each round, wait until earlier rounds' orders are terminal")
		},
		Run: func(ctx context.Context, inv cli.Invocation) error {
			s, err := parse(inv, f)
			if err != nil {
				return err
			}
			return run(ctx, s, inv.Stdout, inv.Stderr)
		},
	}
}

// flagActions names the actions that read each action-specific flag (the
// others, where the stack is and where results go, apply to all).
var flagActions = map[string][]string{
	"concurrency": {"intake", "e2e", "baseline", "compare"},
	"rate":        {"intake", "e2e"},
	"duration":    {"intake", "e2e", "baseline", "compare"},
	"timeout":     {"intake", "e2e", "compare"},
	"users":       {"replay"},
	"requests":    {"replay"},
	"burst":       {"replay"},
	"cold":        {"replay"},
	"rounds":      {"compare"},
	"settle":      {"compare"},
	"drain":       {"e2e"},
}

// parse turns the command line into Settings, or a usage error.
func parse(inv cli.Invocation, f flags) (Settings, error) {
	if len(inv.Args) == 0 {
		return Settings{}, cli.Usagef("want an action: %s", strings.Join(Subcommands, ", "))
	}
	action := inv.Args[0]
	known := false
	for _, a := range Subcommands {
		known = known || a == action
	}
	if !known {
		return Settings{}, cli.Usagef("unknown bench action %q (want %s)", action, strings.Join(Subcommands, ", "))
	}
	// Flags may come after the action: bench intake --concurrency 8.
	if err := cli.Parse(inv.Flags, inv.Args[1:]); err != nil {
		return Settings{}, err
	}
	if inv.Flags.NArg() > 0 {
		return Settings{}, cli.Usagef("unexpected arguments: %q", inv.Flags.Args())
	}
	// A flag the action does not read is refused, not ignored: a figure
	// must come from the settings the command line shows.
	var misplaced []string
	inv.Flags.Visit(func(fl *flag.Flag) {
		if actions, ok := flagActions[fl.Name]; ok && !slices.Contains(actions, action) {
			misplaced = append(misplaced, fmt.Sprintf("--%s does not apply to %s (it is for %s)", fl.Name, action, strings.Join(actions, ", ")))
		}
	})
	if len(misplaced) > 0 {
		return Settings{}, cli.Usagef("%s", strings.Join(misplaced, "; "))
	}
	s := Settings{
		Action: action, Concurrency: *f.concurrency, Rate: *f.rate, Duration: *f.duration, Users: *f.users, Requests: *f.requests,
		Cold: *f.cold, Burst: *f.burst, Rounds: *f.rounds, Timeout: *f.timeout, Drain: *f.drain, Settle: *f.settle, Out: *f.out,
	}
	var errs []string
	if s.Concurrency < 1 || s.Concurrency > MaxConcurrency {
		errs = append(errs, fmt.Sprintf("--concurrency must be between 1 and %d, got %d", MaxConcurrency, s.Concurrency))
	}
	if s.Rate < 0 || s.Rate > MaxRate {
		errs = append(errs, fmt.Sprintf("--rate must be between 0 (closed-loop) and %d orders per second, got %d", MaxRate, s.Rate))
	}
	if s.Duration <= 0 {
		errs = append(errs, fmt.Sprintf("--duration must be positive, got %s", s.Duration))
	}
	if s.Users < 1 || s.Requests < 1 || s.Users > MaxRequests || s.Requests > MaxRequests || s.Users*s.Requests > MaxRequests {
		errs = append(errs, fmt.Sprintf("--users and --requests must be at least 1 and at most %d requests together, got %d × %d", MaxRequests, s.Users, s.Requests))
	}
	if s.Rounds < 1 || s.Rounds > 1000 {
		errs = append(errs, fmt.Sprintf("--rounds must be between 1 and 1000, got %d", s.Rounds))
	}
	if s.Timeout <= 0 {
		errs = append(errs, fmt.Sprintf("--timeout must be positive, got %s", s.Timeout))
	}
	if s.Drain <= 0 {
		errs = append(errs, fmt.Sprintf("--drain must be positive, got %s", s.Drain))
	}
	if len(errs) > 0 {
		return Settings{}, cli.Usagef("%s", strings.Join(errs, "; "))
	}

	// Where the stack is: flags, then dev.env, then the environment.
	envFile := *f.envFile
	if envFile == "" {
		envFile = filepath.Join(inv.Config.DataDir, "dev.env")
	}
	dev, err := readEnvFile(envFile)
	switch {
	case err == nil:
	case errors.Is(err, os.ErrNotExist) && *f.envFile == "":
		dev = map[string]string{} // no dev stack: flags and environment only
	default:
		return Settings{}, cli.Usagef("--env-file: %v", err)
	}
	s.URL = first(*f.url, baseURL(dev["HTTP_ADDR"]), baseURL(inv.Config.HTTPAddr))
	envKey, _ := mcp.EnvAPIKey.Get()
	s.APIKey = first(*f.apiKey, dev["ORDERPIPE_API_KEY"], envKey)
	s.DatabaseURL = first(*f.databaseURL, dev["DATABASE_URL"], inv.Config.DatabaseURL)
	if err := checkURL(s.URL); err != nil {
		return Settings{}, cli.Usagef("--url: %v", err)
	}
	if s.DatabaseURL != "" {
		if _, err := pgxpool.ParseConfig(s.DatabaseURL); err != nil {
			return Settings{}, cli.Usagef("--database-url: not a PostgreSQL connection string")
		}
	}
	needsHTTP := action != "baseline"
	needsDB := action == "baseline" || action == "e2e" || action == "compare"
	if needsHTTP && s.APIKey == "" {
		return Settings{}, cli.Usagef("%s needs an API key: --api-key, dev.env (run `orderpipe dev`) or %s", action, mcp.EnvAPIKey)
	}
	if needsDB && s.DatabaseURL == "" {
		return Settings{}, cli.Usagef("%s needs the database: --database-url, dev.env (run `orderpipe dev`) or %s", action, config.EnvDatabaseURL)
	}
	if s.Out == "" {
		s.Out = filepath.Join("bench-results", time.Now().UTC().Format("20060102T150405Z")+"-"+action)
	}
	return s, nil
}

func first(vals ...string) string {
	for _, v := range vals {
		if v != "" {
			return v
		}
	}
	return ""
}

// baseURL is the URL of a server listening on addr, as seen from here.
func baseURL(addr string) string {
	if addr == "" {
		return ""
	}
	return (&devenv.Stack{Config: config.Config{HTTPAddr: addr}}).BaseURL()
}

func checkURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Hostname() == "" {
		return fmt.Errorf("want an http(s) URL like http://localhost:8080, got %q", raw)
	}
	if u.RawQuery != "" || u.Fragment != "" || (u.Path != "" && u.Path != "/") {
		return fmt.Errorf("want the intake's base URL without a path, got %q", raw)
	}
	return nil
}

// readEnvFile reads dev.env's KEY=value lines.
func readEnvFile(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("%s:%d: want KEY=value, got %q", path, n, line)
		}
		out[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return out, nil
}

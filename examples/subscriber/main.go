// Command subscriber is an example of a subscriber of orderpipe's
// confirmed-order events, written the way another team would write one:
// its own durable JetStream consumer, its own tables, and an effect that
// happens once per event even when the process is killed with -9 in the
// middle of a batch. See README.md next to this file for the why of every
// step.
//
// Usage:
//
//	subscriber --database-url postgres://… [--nats-url nats://…] [--durable shipping]
//
// Every flag has an environment variable (NATS_URL, DATABASE_URL,
// SUBSCRIBER_DURABLE, …); a flag wins over its variable.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"orderpipe/shared/orderevent"
)

// Exit codes of run.
const (
	exitOK    = 0
	exitError = 1 // a runtime failure (cannot reach the database, …)
	exitUsage = 2 // bad flags or environment
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Getenv, os.Stderr)
	stop()
	os.Exit(code)
}

// config is what the command line and the environment choose.
type config struct {
	natsURL     string
	databaseURL string
	durable     string
	stream      string
	prefix      string
	batch       int
	fetchWait   time.Duration
	ackWait     time.Duration
	maxDeliver  int
}

// Environment variables; each one is the default of its flag.
const (
	envNATSURL     = "NATS_URL"
	envDatabaseURL = "DATABASE_URL"
	envDurable     = "SUBSCRIBER_DURABLE"
	envStream      = "SUBSCRIBER_STREAM"
	envPrefix      = "SUBSCRIBER_SUBJECT_PREFIX"
	envBatch       = "SUBSCRIBER_BATCH"
	envFetchWait   = "SUBSCRIBER_FETCH_WAIT"
	envAckWait     = "SUBSCRIBER_ACK_WAIT"
	envMaxDeliver  = "SUBSCRIBER_MAX_DELIVER"
)

// envValue returns the variable name as parse reads it, or def when the
// variable is unset. A value that parse rejects is added to *errs, saying
// that it is not want, and def is returned.
func envValue[T any](getenv func(string) string, errs *[]error, name string, def T, parse func(string) (T, error), want string) T {
	v := getenv(name)
	if v == "" {
		return def
	}
	t, err := parse(v)
	if err != nil {
		*errs = append(*errs, fmt.Errorf("%s=%q: not %s", name, v, want))
		return def
	}
	return t
}

// parseConfig reads the environment, then the flags, and checks the result.
// Every error names the flag or variable at fault.
func parseConfig(args []string, getenv func(string) string, stderr io.Writer) (config, error) {
	str := func(name, def string) string {
		if v := getenv(name); v != "" {
			return v
		}
		return def
	}
	var errs []error
	num := func(name string, def int) int {
		return envValue(getenv, &errs, name, def, strconv.Atoi, "a whole number")
	}
	dur := func(name string, def time.Duration) time.Duration {
		return envValue(getenv, &errs, name, def, time.ParseDuration, "a duration (e.g. 30s)")
	}

	var c config
	fs := flag.NewFlagSet("subscriber", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.natsURL, "nats-url", str(envNATSURL, "nats://127.0.0.1:4222"), "NATS server URL(s), comma-separated (`"+envNATSURL+"`)")
	fs.StringVar(&c.databaseURL, "database-url", str(envDatabaseURL, ""), "PostgreSQL URL of this subscriber's own database; required (`"+envDatabaseURL+"`)")
	fs.StringVar(&c.durable, "durable", str(envDurable, "shipping"), "name of the durable consumer; every replica of this subscriber uses the same (`"+envDurable+"`)")
	fs.StringVar(&c.stream, "stream", str(envStream, orderevent.DefaultTopology.Stream), "the order events stream (`"+envStream+"`)")
	fs.StringVar(&c.prefix, "subject-prefix", str(envPrefix, orderevent.DefaultTopology.Prefix), "first subject token; the consumer filters <prefix>.confirmed (`"+envPrefix+"`)")
	fs.IntVar(&c.batch, "batch", num(envBatch, 10), "messages per fetch, 1..1000 (`"+envBatch+"`)")
	fs.DurationVar(&c.fetchWait, "fetch-wait", dur(envFetchWait, time.Second), "how long a fetch waits for a full batch; bounds the shutdown delay (`"+envFetchWait+"`)")
	fs.DurationVar(&c.ackWait, "ack-wait", dur(envAckWait, 30*time.Second), "redeliver a message not acked within this (`"+envAckWait+"`)")
	fs.IntVar(&c.maxDeliver, "max-deliver", num(envMaxDeliver, 10), "deliveries of one message before the broker gives up on it (`"+envMaxDeliver+"`)")
	if len(errs) > 0 {
		return config{}, errors.Join(errs...)
	}
	// A flag given twice is refused: the last value would win silently.
	given := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) { f.Value = &once{Value: f.Value, name: f.Name, given: given} })
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected argument %q (the subscriber takes flags only)", fs.Arg(0))
	}
	return c, c.check()
}

// once is a flag's value that may be set once (the subscriber has no
// boolean flags).
type once struct {
	flag.Value
	name  string
	given map[string]bool
}

func (o *once) Set(v string) error {
	if o.given[o.name] {
		return errors.New("given twice")
	}
	o.given[o.name] = true
	return o.Value.Set(v)
}

// String is the value's; the zero once (which -h makes to tell a default
// from a zero value) has none.
func (o *once) String() string {
	if o == nil || o.Value == nil {
		return ""
	}
	return o.Value.String()
}

func (c config) check() error {
	var errs []error
	if c.databaseURL == "" {
		errs = append(errs, fmt.Errorf("--database-url (or %s) is required", envDatabaseURL))
	} else if _, err := pgxpool.ParseConfig(c.databaseURL); err != nil {
		// pgx's message may quote the URL; say which setting is wrong
		// without echoing a password.
		errs = append(errs, errors.New("--database-url: not a PostgreSQL URL or DSN"))
	}
	if err := checkNATSURL(c.natsURL); err != nil {
		errs = append(errs, fmt.Errorf("--nats-url: %w", err))
	}
	if !validName(c.durable) {
		errs = append(errs, fmt.Errorf("--durable %q: want 1..64 letters, digits, '-' or '_'", c.durable))
	}
	if !validName(c.stream) {
		errs = append(errs, fmt.Errorf("--stream %q: want 1..64 letters, digits, '-' or '_'", c.stream))
	}
	if !validName(c.prefix) {
		errs = append(errs, fmt.Errorf("--subject-prefix %q: want one subject token of letters, digits, '-' or '_'", c.prefix))
	}
	if c.batch < 1 || c.batch > 1000 {
		errs = append(errs, fmt.Errorf("--batch %d: want 1..1000", c.batch))
	}
	if c.fetchWait < 100*time.Millisecond || c.fetchWait > time.Minute {
		errs = append(errs, fmt.Errorf("--fetch-wait %s: want 100ms..1m", c.fetchWait))
	}
	if c.ackWait < time.Second {
		errs = append(errs, fmt.Errorf("--ack-wait %s: want at least 1s", c.ackWait))
	}
	if c.maxDeliver < 1 {
		errs = append(errs, fmt.Errorf("--max-deliver %d: want at least 1", c.maxDeliver))
	}
	return errors.Join(errs...)
}

// validName accepts what is safe as a JetStream stream or consumer name
// and as a subject token.
func validName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, r := range s {
		ok := r == '-' || r == '_' || ('0' <= r && r <= '9') || ('a' <= r && r <= 'z') || ('A' <= r && r <= 'Z')
		if !ok {
			return false
		}
	}
	return true
}

func checkNATSURL(s string) error {
	if strings.TrimSpace(s) == "" {
		return errors.New("empty")
	}
	for part := range strings.SplitSeq(s, ",") {
		u, err := url.Parse(strings.TrimSpace(part))
		if err != nil || u.Host == "" {
			return fmt.Errorf("%q is not a URL like nats://host:4222", part)
		}
		switch u.Scheme {
		case "nats", "tls", "ws", "wss":
		default:
			return fmt.Errorf("%q: scheme %q, want nats, tls, ws or wss", part, u.Scheme)
		}
	}
	return nil
}

// run is the whole program: it returns the process's exit code. It ends
// when ctx ends (SIGTERM, Ctrl-C) after settling the message in hand.
func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) int {
	cfg, err := parseConfig(args, getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "subscriber: %v\n", err)
		return exitUsage
	}
	logger := slog.New(slog.NewJSONHandler(stderr, nil)).With(slog.String("durable", cfg.durable))
	if err := serve(ctx, cfg, logger); err != nil {
		logger.Error("subscriber stopped", slog.Any("error", err))
		return exitError
	}
	logger.Info("subscriber stopped")
	return exitOK
}

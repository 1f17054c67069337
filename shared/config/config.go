// Package config reads orderpipe's environment into one documented struct.
// Every environment variable that any part reads is listed in Vars, which is
// what `orderpipe help` prints and what the compose.yaml test checks against.
// A part's own typed variable is a Setting (DurationSetting, IntSetting):
// its default is written once, and the docs and the code both use it.
package config

import (
	"errors"
	"fmt"
	"math"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Var documents one environment variable.
type Var struct {
	Name    string
	Meaning string
	Default string
}

var registry = map[string]Var{}

// Register adds a variable to the documented set; parts call it from an
// init function for the variables that only they read. It returns the name.
func Register(name, meaning, def string) string {
	registry[name] = Var{Name: name, Meaning: meaning, Default: def}
	return name
}

// Setting is a registered variable of type T with its default: the one
// value that both `orderpipe help` (and so the docs) and the code use.
// Read it at the edge with Get and pass the value in.
type Setting[T any] struct {
	// Name is the environment variable.
	Name string
	// Default is used when the variable is unset or blank.
	Default T
	parse   func(string) (T, error)
}

// String is the variable's name (so that messages can print a Setting).
func (s Setting[T]) String() string { return s.Name }

// Get reads the variable: Default when it is unset or blank, else the
// parsed value; a malformed value is an error naming the variable.
func (s Setting[T]) Get() (T, error) {
	return s.lookup(os.LookupEnv)
}

// IsSet reports whether the variable is set to more than blanks (when it
// is not, Get returns Default).
func (s Setting[T]) IsSet() bool {
	v, _ := os.LookupEnv(s.Name)
	return strings.TrimSpace(v) != ""
}

// Into reads the variable into *dst as Get does and returns Get's error,
// so that a reader of several variables can join the errors and report
// every bad one at once.
func (s Setting[T]) Into(dst *T) error {
	v, err := s.Get()
	*dst = v
	return err
}

func (s Setting[T]) lookup(env func(string) (string, bool)) (T, error) {
	v, _ := env(s.Name)
	v = strings.TrimSpace(v)
	if v == "" {
		return s.Default, nil
	}
	t, err := s.parse(v)
	if err != nil {
		var zero T
		return zero, fmt.Errorf("%s: %w, got %q", s.Name, err, v)
	}
	return t, nil
}

// DurationSetting registers a positive duration variable.
func DurationSetting(name, meaning string, def time.Duration) Setting[time.Duration] {
	return durationSetting(name, meaning, def, false)
}

// DurationSettingOrZero registers a duration variable that may be 0.
func DurationSettingOrZero(name, meaning string, def time.Duration) Setting[time.Duration] {
	return durationSetting(name, meaning, def, true)
}

func durationSetting(name, meaning string, def time.Duration, zero bool) Setting[time.Duration] {
	Register(name, meaning, FormatDuration(def))
	return Setting[time.Duration]{Name: name, Default: def, parse: func(v string) (time.Duration, error) {
		d, err := time.ParseDuration(v)
		switch {
		case zero && (err != nil || d < 0):
			return 0, errors.New("want a duration like 20ms, or 0")
		case !zero && (err != nil || d <= 0):
			return 0, errors.New("want a positive duration like 5s")
		}
		return d, nil
	}}
}

// DurationSettingBetween registers a duration variable from min to max.
func DurationSettingBetween(name, meaning string, def, min, max time.Duration) Setting[time.Duration] {
	Register(name, meaning, FormatDuration(def))
	want := fmt.Sprintf("want a duration between %s and %s", FormatDuration(min), FormatDuration(max))
	return Setting[time.Duration]{Name: name, Default: def, parse: func(v string) (time.Duration, error) {
		d, err := time.ParseDuration(v)
		if err != nil || d < min || d > max {
			return 0, errors.New(want)
		}
		return d, nil
	}}
}

// IntSetting registers an integer variable of at least min.
func IntSetting(name, meaning string, def, min int) Setting[int] {
	return IntSettingBetween(name, meaning, def, min, math.MaxInt)
}

// IntSettingBetween registers an integer variable between min and max.
func IntSettingBetween(name, meaning string, def, min, max int) Setting[int] {
	Register(name, meaning, strconv.Itoa(def))
	want := fmt.Sprintf("want an integer between %d and %d", min, max)
	if max == math.MaxInt {
		want = fmt.Sprintf("want an integer >= %d", min)
	}
	return Setting[int]{Name: name, Default: def, parse: func(v string) (int, error) {
		n, err := strconv.Atoi(v)
		if err != nil || n < min || n > max {
			return 0, errors.New(want)
		}
		return n, nil
	}}
}

// StringSetting registers a text variable; blank is the same as unset.
func StringSetting(name, meaning, def, docDefault string) Setting[string] {
	Register(name, meaning, docDefault)
	return Setting[string]{Name: name, Default: def, parse: func(v string) (string, error) { return v, nil }}
}

// FormatDuration writes d as a person would: 15m rather than 15m0s.
func FormatDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// Vars returns every documented variable, sorted by name.
func Vars() []Var {
	out := make([]Var, 0, len(registry))
	for _, v := range registry {
		out = append(out, v)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// The variables every process reads.
var (
	EnvDatabaseURL           = Register("DATABASE_URL", "PostgreSQL connection string", "dev: the managed local server")
	EnvNATSURL               = Register("NATS_URL", "NATS server(s), comma-separated", "dev: the embedded server")
	EnvHTTPAddr              = Register("HTTP_ADDR", "listen address of the part's HTTP server (intake API, or health and metrics)", DefaultHTTPAddr)
	EnvPSPURL                = Register("PSP_URL", "base URL of the payment provider (an http(s) URL)", "dev: the built-in stand-in")
	EnvDataDir               = Register("ORDERPIPE_DATA_DIR", "where `dev` keeps its PostgreSQL and JetStream data", DefaultDataDir)
	EnvDevNATSSyncAlways     = Register("ORDERPIPE_DEV_NATS_SYNC_ALWAYS", "`dev`'s embedded JetStream fsyncs every message before acknowledging it (sync_interval: always) instead of once a second", "off")
	EnvDevPGStatements       = Register("ORDERPIPE_DEV_PG_STATEMENTS", "`dev`'s PostgreSQL keeps per-statement statistics (pg_stat_statements), which `bench` then reports", "off")
	EnvAllowPrivateCallbacks = Register("ORDERPIPE_ALLOW_PRIVATE_CALLBACKS", "let callback URLs be http and point at private/loopback addresses (dev, tests)", "off")
	EnvLogFormat             = Register("ORDERPIPE_LOG_FORMAT", "log format: json or text", "json (text in dev)")
	EnvLogLevel              = Register("ORDERPIPE_LOG_LEVEL", "log level: debug, info, warn, error", DefaultLogLevel)
	EnvStreamReplicas        = Register("ORDERPIPE_STREAM_REPLICAS", "replicas of the ORDERS stream (1, 3 or 5)", strconv.Itoa(DefaultStreamReplicas))
	EnvOTLPEndpoint          = Register("OTEL_EXPORTER_OTLP_ENDPOINT", "OTLP/HTTP endpoint to export traces to (e.g. http://otel-collector:4318); unset: traces are not exported", "unset")
	EnvDBMaxConns            = IntSettingBetween("ORDERPIPE_DB_MAX_CONNS", "PostgreSQL connections one process may open, at most "+strconv.Itoa(MaxDBMaxConns)+" (a pool_max_conns parameter in DATABASE_URL wins); an intake process opens up to 4 more for its group commit", DefaultDBMaxConns, 1, MaxDBMaxConns)
	EnvShutdownTimeout       = Register("ORDERPIPE_SHUTDOWN_TIMEOUT", "how long a process drains in-flight work on SIGTERM", FormatDuration(DefaultShutdownTimeout))
)

// Defaults of Config, each written once: Register documents it and
// fromLookup uses it.
const (
	DefaultHTTPAddr        = ":8080"
	DefaultDataDir         = ".data"
	DefaultLogFormat       = "json"
	DefaultLogLevel        = "info"
	DefaultStreamReplicas  = 1
	DefaultShutdownTimeout = 20 * time.Second
	// DefaultDBMaxConns is sized for the work, not the cores: every
	// in-flight step handler, the intake's batches, the relay and the
	// compensator each hold a connection while PostgreSQL waits on a WAL
	// flush, which costs no CPU (pgx's own default, max(4, cores), starved
	// `dev`'s one process; docs/benchmarks.md has the measurements).
	DefaultDBMaxConns = 32
	// MaxDBMaxConns bounds ORDERPIPE_DB_MAX_CONNS: far above what one
	// PostgreSQL server accepts, far below what a pool can count.
	MaxDBMaxConns = 10000
)

// Config is what every process reads from the environment. Parts read
// their own extra settings next to their Run function.
type Config struct {
	DatabaseURL           string
	NATSURL               string
	HTTPAddr              string
	PSPURL                string
	DataDir               string
	AllowPrivateCallbacks bool
	LogFormat             string
	LogLevel              string
	StreamReplicas        int
	ShutdownTimeout       time.Duration
	// OTLPEndpoint is where traces are exported; "" exports none.
	OTLPEndpoint string
	// DBMaxConns bounds the process's PostgreSQL pool.
	DBMaxConns int
	// DevNATSSyncAlways makes `dev`'s embedded broker fsync every message.
	DevNATSSyncAlways bool
	// DevPGStatements makes `dev`'s PostgreSQL keep per-statement
	// statistics (the pg_stat_statements extension).
	DevPGStatements bool
}

// FromEnv reads Config from the environment with defaults and validates
// it. Missing DATABASE_URL/NATS_URL are allowed here; commands that need
// them call Require.
func FromEnv() (Config, error) {
	return fromLookup(os.LookupEnv)
}

func fromLookup(lookup func(string) (string, bool)) (Config, error) {
	get := func(k, def string) string {
		if v, ok := lookup(k); ok && strings.TrimSpace(v) != "" {
			return strings.TrimSpace(v)
		}
		return def
	}
	var errs []error
	c := Config{
		DatabaseURL: get(EnvDatabaseURL, ""),
		NATSURL:     get(EnvNATSURL, ""),
		HTTPAddr:    get(EnvHTTPAddr, DefaultHTTPAddr),
		PSPURL:      get(EnvPSPURL, ""),
		DataDir:     get(EnvDataDir, DefaultDataDir),
		LogFormat:   get(EnvLogFormat, DefaultLogFormat),
		LogLevel:    get(EnvLogLevel, DefaultLogLevel),

		OTLPEndpoint: get(EnvOTLPEndpoint, ""),
	}
	var err error
	if err = checkHTTPURL(EnvOTLPEndpoint, c.OTLPEndpoint, "http://otel-collector:4318"); err != nil {
		errs = append(errs, err)
	}
	if err = checkHTTPURL(EnvPSPURL, c.PSPURL, "http://psp:8080"); err != nil {
		errs = append(errs, err)
	}
	if c.DBMaxConns, err = EnvDBMaxConns.lookup(lookup); err != nil {
		errs = append(errs, err)
	}
	if c.DevNATSSyncAlways, err = ParseBool(get(EnvDevNATSSyncAlways, "off")); err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", EnvDevNATSSyncAlways, err))
	}
	if c.DevPGStatements, err = ParseBool(get(EnvDevPGStatements, "off")); err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", EnvDevPGStatements, err))
	}
	if c.AllowPrivateCallbacks, err = ParseBool(get(EnvAllowPrivateCallbacks, "off")); err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", EnvAllowPrivateCallbacks, err))
	}
	replicas := get(EnvStreamReplicas, strconv.Itoa(DefaultStreamReplicas))
	if c.StreamReplicas, err = strconv.Atoi(replicas); err != nil || (c.StreamReplicas != 1 && c.StreamReplicas != 3 && c.StreamReplicas != 5) {
		errs = append(errs, fmt.Errorf("%s: want 1, 3 or 5, got %q", EnvStreamReplicas, replicas))
	}
	shutdown := get(EnvShutdownTimeout, DefaultShutdownTimeout.String())
	if c.ShutdownTimeout, err = time.ParseDuration(shutdown); err != nil || c.ShutdownTimeout <= 0 {
		errs = append(errs, fmt.Errorf("%s: want a positive duration like 20s, got %q", EnvShutdownTimeout, shutdown))
	}
	if c.LogFormat != "json" && c.LogFormat != "text" {
		errs = append(errs, fmt.Errorf("%s: want json or text, got %q", EnvLogFormat, c.LogFormat))
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		errs = append(errs, fmt.Errorf("%s: want debug, info, warn or error, got %q", EnvLogLevel, c.LogLevel))
	}
	return c, errors.Join(errs...)
}

// checkHTTPURL refuses a value of the variable name that is set but not an
// http or https URL with a host (psp:8090, localhost:8090, ftp://x and
// http:// all are refused); like is an example of a good one.
func checkHTTPURL(name, value, like string) error {
	if value == "" {
		return nil
	}
	if u, err := url.Parse(value); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%s: want an http(s) URL like %s, got %q", name, like, value)
	}
	return nil
}

// Require returns an error naming every variable in names that is empty.
func (c Config) Require(names ...string) error {
	var missing []string
	for _, n := range names {
		var v string
		switch n {
		case EnvDatabaseURL:
			v = c.DatabaseURL
		case EnvNATSURL:
			v = c.NATSURL
		case EnvPSPURL:
			v = c.PSPURL
		default:
			v = os.Getenv(n)
		}
		if v == "" {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("missing environment: %s must be set (or run `orderpipe dev`, which sets them)", strings.Join(missing, ", "))
	}
	return nil
}

// ParseBool accepts 1/0, true/false, yes/no, on/off (any case).
func ParseBool(s string) (bool, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "1", "true", "yes", "on":
		return true, nil
	case "", "0", "false", "no", "off":
		return false, nil
	}
	return false, fmt.Errorf("want on/off, true/false, 1/0 or yes/no, got %q", s)
}

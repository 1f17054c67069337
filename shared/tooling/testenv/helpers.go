package testenv

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"orderpipe/shared/cli"
	"orderpipe/shared/config"
	"orderpipe/shared/orderevent"
	"orderpipe/shared/tooling/pspserver"
)

// RunCommand runs cmd in-process as cli.Execute would, but on cfg instead
// of the environment: its flags parsed from args (a bad one is returned as
// a cli.UsageError, nothing printed), then Run with ctx, writing to stdout
// and stderr (nil: discarded).
func RunCommand(ctx context.Context, cmd cli.Command, cfg config.Config, stdout, stderr io.Writer, args ...string) error {
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	fs := flag.NewFlagSet(cmd.Name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	if cmd.Setup != nil {
		cmd.Setup(fs)
	}
	if err := cli.Parse(fs, args); err != nil {
		return cli.Usagef("%v", err) // -h too
	}
	return cmd.Run(ctx, cli.Invocation{Args: fs.Args(), Flags: fs, Stdout: stdout, Stderr: stderr, Config: cfg})
}

// WantUsageErrors runs cmd with each argument list, as RunCommand does on
// cfg, and fails the test for each list the command does not refuse with a
// cli.UsageError: the one check of a command's malformed command lines.
func WantUsageErrors(t testing.TB, cmd cli.Command, cfg config.Config, argLists ...[]string) {
	t.Helper()
	for _, args := range argLists {
		var ue cli.UsageError
		if err := RunCommand(t.Context(), cmd, cfg, nil, nil, args...); !errors.As(err, &ue) {
			t.Errorf("%s %q: %v, want a usage error", cmd.Name, args, err)
		}
	}
}

// Buffer is a bytes.Buffer that several goroutines may write and read at
// once: a log sink, or a child process's output. The zero value is ready.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// PSPHandler returns the HTTP handler of a payment provider stand-in
// (pspserver) with opts, storing on pool, logging to the test's log.
func PSPHandler(t testing.TB, pool *pgxpool.Pool, opts pspserver.Options) http.Handler {
	t.Helper()
	srv, err := pspserver.NewServer(pool, opts, Logger(t))
	if err != nil {
		t.Fatalf("testenv: payment stand-in: %v", err)
	}
	return srv.Handler()
}

// ServePSP serves PSPHandler over HTTP until the test ends and returns its
// URL.
func ServePSP(t testing.TB, pool *pgxpool.Pool, opts pspserver.Options) string {
	t.Helper()
	hs := httptest.NewServer(PSPHandler(t, pool, opts))
	t.Cleanup(hs.Close)
	return hs.URL
}

// Go runs fn in a goroutine until stop, or the end of the test: its
// context is cancelled by a cleanup, not with t.Context(), which ends
// before any cleanup runs, so fn serves the cleanups registered after Go.
// stop cancels it and waits for fn to return; an error from fn fails the
// test, named what. stop may be called more than once.
func Go(t testing.TB, what string, fn func(context.Context) error) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("%s: %v", what, err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// StreamInfo returns the stream of that name and its current info,
// failing the test if either lookup fails.
func StreamInfo(t testing.TB, js jetstream.JetStream, stream string) (jetstream.Stream, *jetstream.StreamInfo) {
	t.Helper()
	s, err := js.Stream(t.Context(), stream)
	if err != nil {
		t.Fatalf("testenv: stream %s: %v", stream, err)
	}
	info, err := s.Info(t.Context())
	if err != nil {
		t.Fatalf("testenv: stream %s info: %v", stream, err)
	}
	return s, info
}

// ClosedPort returns a local TCP port that nothing listens on (it was
// free a moment ago).
func ClosedPort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	return port
}

// Event returns a well-formed event of that name for an order of its own:
// fresh order and client ids, a random request id in the recommended
// "ORD…" form, the status the event announces, and now (to the
// microsecond, as PostgreSQL keeps it) as its time.
func Event(name orderevent.Name) orderevent.Event {
	return orderevent.Event{
		Version:    orderevent.Version,
		Name:       name,
		OrderID:    uuid.New(),
		ClientID:   uuid.New(),
		RequestID:  "ORD" + strings.ReplaceAll(uuid.NewString(), "-", "")[:20],
		Status:     name.Status(),
		OccurredAt: time.Now().UTC().Truncate(time.Microsecond),
	}
}

// Column returns the one column that the query sql selects, every row,
// failing the test if the query or a row's scan fails.
func Column[T any](t testing.TB, pool *pgxpool.Pool, sql string, args ...any) []T {
	t.Helper()
	// A failed query's rows return its error, and CollectRows returns it.
	rows, _ := pool.Query(t.Context(), sql, args...)
	v, err := pgx.CollectRows(rows, pgx.RowTo[T])
	if err != nil {
		t.Fatalf("testenv: %s: %v", sql, err)
	}
	return v
}

// BearerTransport sends every request with Key as its bearer API key, over
// Next: for clients that take an http.Client, not a header (the MCP SDK's).
type BearerTransport struct {
	Key  string
	Next http.RoundTripper
}

// RoundTrip sends a copy of r with the Authorization header set.
func (b BearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.Key)
	return b.Next.RoundTrip(r)
}

// Package app opens what every orderpipe process needs — the PostgreSQL
// pool, the NATS connection with the ORDERS stream provisioned, a logger and
// a metrics registry — and serves /healthz, /readyz and /metrics.
package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"orderpipe/shared/config"
	"orderpipe/shared/metrics"
	"orderpipe/shared/natsjs"
	"orderpipe/shared/orderevent"
	"orderpipe/shared/postgres"
	"orderpipe/shared/tracing"
)

// Env is a process's connections and shared services.
type Env struct {
	Config   config.Config
	Logger   *slog.Logger
	Pool     *pgxpool.Pool
	NC       *nats.Conn
	JS       jetstream.JetStream
	Topology orderevent.Topology
	// Metrics is the process's registry; parts register their collectors
	// on it and /metrics serves it.
	Metrics *prometheus.Registry

	stopTracing func(context.Context) error
	stopKeeper  context.CancelFunc
	keeperDone  chan struct{}

	mu       sync.Mutex
	reserved []*pgxpool.Pool
}

// NewLogger returns the process logger: JSON or text per the config, with
// trace_id and span_id on every line logged with a traced context.
func NewLogger(cfg config.Config, w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.LogLevel))
	opts := &slog.HandlerOptions{Level: level}
	if cfg.LogFormat == "text" {
		return slog.New(tracing.LogHandler(slog.NewTextHandler(w, opts)))
	}
	return slog.New(tracing.LogHandler(slog.NewJSONHandler(w, opts)))
}

// Open connects to PostgreSQL and NATS (DATABASE_URL and NATS_URL must be
// set) and provisions the stream. name identifies the process to NATS.
func Open(ctx context.Context, cfg config.Config, logger *slog.Logger, name string) (*Env, error) {
	if err := cfg.Require(config.EnvDatabaseURL, config.EnvNATSURL); err != nil {
		return nil, err
	}
	pool, err := postgres.OpenSized(ctx, cfg.DatabaseURL, cfg.DBMaxConns)
	if err != nil {
		return nil, err
	}
	nc, js, err := natsjs.Connect(cfg.NATSURL, "orderpipe-"+name, logger)
	if err != nil {
		pool.Close()
		return nil, err
	}
	env := &Env{Config: cfg, Logger: logger, Pool: pool, NC: nc, JS: js, Topology: orderevent.DefaultTopology, Metrics: NewRegistry()}
	if env.stopTracing, err = tracing.Setup(ctx, "orderpipe-"+name, cfg.OTLPEndpoint); err != nil {
		env.Close()
		return nil, fmt.Errorf("set up tracing: %w", err)
	}
	// Provision the stream now if the broker is there; either way keep it
	// provisioned (a start while NATS is down, a stream deleted or lost at
	// runtime) for as long as the process runs.
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	if _, err := natsjs.EnsureStream(sctx, js, env.Topology, cfg.StreamReplicas); err != nil {
		logger.Warn("the broker is not available yet; orders are accepted into the outbox and published when it is", slog.Any("error", err))
	}
	cancel()
	kctx, stop := context.WithCancel(context.Background())
	env.stopKeeper = stop
	env.keeperDone = make(chan struct{})
	go func() {
		defer close(env.keeperDone)
		natsjs.KeepStream(kctx, js, env.Topology, cfg.StreamReplicas, 2*time.Second, logger)
	}()
	return env, nil
}

// EnsureStream provisions the stream again (a relay or a subscriber that
// found it missing calls it).
func (e *Env) EnsureStream(ctx context.Context) error {
	_, err := natsjs.EnsureStream(ctx, e.JS, e.Topology, e.Config.StreamReplicas)
	return err
}

// NewRegistry returns a registry with the Go and process collectors and
// every orderpipe metric (shared/metrics).
func NewRegistry() *prometheus.Registry {
	r := prometheus.NewRegistry()
	r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	r.MustRegister(metrics.Collectors()...)
	return r
}

// Close closes the NATS connection (sending what its buffer holds; the
// parts have stopped their subscriptions by then), closes the pools (Pool
// and those Reserve opened) and flushes traces.
func (e *Env) Close() {
	e.CloseReserved()
	if e.stopKeeper != nil {
		e.stopKeeper()
		<-e.keeperDone
	}
	if e.stopTracing != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = e.stopTracing(ctx)
		cancel()
	}
	if e.NC != nil {
		e.NC.Close()
	}
	if e.Pool != nil {
		e.Pool.Close()
	}
}

// Reserve opens a pool of at most n connections of its own, with Pool's
// settings, apart from Pool and closed with the Env. It is for work that
// must not wait behind the rest of the process for a connection, and
// whose statements stay prepared and planned on the few connections it
// uses: the intake's group commit. Drawn from Pool, which up to 32
// handlers, streams and reads share in turn, its flushers were handed
// connections that had not run their statement yet (a parse, then a plan
// at each of the first runs). Its connections are opened at once, in the
// background, and kept open, so that a first burst does not wait for
// them.
func (e *Env) Reserve(n int) (*pgxpool.Pool, error) {
	if e.Pool == nil {
		return nil, errors.New("reserve connections: the process has no PostgreSQL pool")
	}
	cfg := e.Pool.Config()
	cfg.MaxConns, cfg.MinConns, cfg.MinIdleConns = int32(n), int32(n), 0
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		return nil, fmt.Errorf("reserve %d connections: %w", n, err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.reserved = append(e.reserved, p)
	return p, nil
}

// CloseReserved closes the pools that Reserve opened. Close calls it; a
// caller whose Env shares its Pool and connections with others (a test's)
// calls it alone.
func (e *Env) CloseReserved() {
	e.mu.Lock()
	reserved := e.reserved
	e.reserved = nil
	e.mu.Unlock()
	for _, p := range reserved {
		p.Close()
	}
}

// Ready checks both dependencies and returns an error naming each one that
// fails.
func (e *Env) Ready(ctx context.Context) map[string]error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return map[string]error{
		"postgres": e.Pool.Ping(ctx),
		"nats":     natsjs.Ping(ctx, e.NC, e.JS),
	}
}

// Mount adds /healthz, /readyz and /metrics to mux.
//
// /readyz depends on PostgreSQL only: it answers 503 when PostgreSQL does
// not answer, and 200 otherwise, naming the broker "degraded" while NATS is
// away (the intake still accepts orders durably into the outbox then). It
// shows no raw dependency errors (they may carry hosts and users); those go
// to the log.
func (e *Env) Mount(mux *http.ServeMux) {
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"status":"ok"}` + "\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		checks := e.Ready(r.Context())
		body := map[string]string{"status": "ok", "postgres": "ok", "nats": "ok"}
		code := http.StatusOK
		if err := checks["nats"]; err != nil {
			body["nats"], body["status"] = "degraded", "degraded"
			e.Logger.Warn("readyz: the broker is unavailable", slog.Any("error", err))
		}
		if err := checks["postgres"]; err != nil {
			body["postgres"], body["status"] = "unavailable", "unavailable"
			code = http.StatusServiceUnavailable
			e.Logger.Warn("readyz: PostgreSQL is unavailable", slog.Any("error", err))
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(body)
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(e.Metrics, promhttp.HandlerOpts{Registry: e.Metrics}))
}

// Serve runs an HTTP server on addr until ctx ends, then shuts it down,
// giving in-flight requests up to drain to finish.
func Serve(ctx context.Context, addr string, h http.Handler, logger *slog.Logger, drain time.Duration) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", addr, err)
	}
	return ServeListener(ctx, l, h, logger, drain)
}

// ServeListener is Serve on an open listener (tests use port 0).
//
// A shutdown fails only when requests were still running at the end of
// the drain. Connections that never sent a request (a client's transport
// may dial one and then use another that came free) do not fail it:
// net/http counts them idle only after 5 s, so it may still hold them when
// a shorter drain ends, but closing them cuts nothing off.
func ServeListener(ctx context.Context, l net.Listener, h http.Handler, logger *slog.Logger, drain time.Duration) error {
	var inFlight atomic.Int64
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			inFlight.Add(1)
			defer inFlight.Add(-1)
			h.ServeHTTP(w, r)
		}),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	logger.Info("http server listening", slog.String("addr", l.Addr().String()))
	select {
	case err := <-errc:
		return fmt.Errorf("http server: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), drain)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		n := inFlight.Load()
		_ = srv.Close()
		switch {
		case !errors.Is(err, context.DeadlineExceeded):
			return fmt.Errorf("http server shutdown: %w", err)
		case n > 0:
			return fmt.Errorf("http server shutdown: %d request(s) still running at the end of the drain were cut off: %w", n, err)
		}
		logger.Debug("http server closed connections that sent no request within the drain", slog.Duration("drain", drain))
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// Sleep waits d or until ctx ends; it reports whether d passed (false at
// once when ctx has ended).
func Sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

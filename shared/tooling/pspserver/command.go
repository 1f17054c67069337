package pspserver

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"time"

	"orderpipe/shared/app"
	"orderpipe/shared/cli"
	"orderpipe/shared/config"
	"orderpipe/shared/postgres"
)

type flags struct {
	addr string
	opts Options
}

func (f *flags) setup(fs *flag.FlagSet) {
	fs.StringVar(&f.addr, "addr", "127.0.0.1:8090", "listen address")
	fs.DurationVar(&f.opts.Latency, "latency", 50*time.Millisecond, "added to every charge, refund and void")
	fs.Float64Var(&f.opts.DeclineRate, "decline-rate", 0, "share of new charges declined with 402 (0-1)")
	fs.Float64Var(&f.opts.ErrorRate, "error-rate", 0, "share of new charges, refunds and voids answered 500 without effect (0-1)")
	fs.Float64Var(&f.opts.TimeoutRate, "timeout-rate", 0, `share of new charges that are charged and then not answered ("charge then time out", 0-1)`)
	fs.DurationVar(&f.opts.Hang, "hang", 30*time.Second, `how long a "charge then time out" holds the connection before dropping it (positive)`)
	fs.DurationVar(&f.opts.InFlightTimeout, "in-flight-timeout", 30*time.Second, "a key in flight for longer is taken to be abandoned and decided afresh (positive)")
	fs.Uint64Var(&f.opts.Seed, "seed", 0, "seed of the random outcomes (0: random)")
}

// Command is `orderpipe psp`: the payment provider stand-in.
func Command() cli.Command {
	f := &flags{}
	return cli.Command{
		Name:    "psp",
		Summary: "run the payment provider stand-in (charges and refunds with Idempotency-Key semantics, kept in PostgreSQL)",
		Usage:   "[--addr HOST:PORT] [--latency D] [--decline-rate R] [--error-rate R] [--timeout-rate R] [--hang D] [--in-flight-timeout D] [--seed N]",
		Env:     []string{config.EnvDatabaseURL, config.EnvLogFormat, config.EnvLogLevel, config.EnvShutdownTimeout},
		Setup:   f.setup,
		Run: func(ctx context.Context, inv cli.Invocation) error {
			if len(inv.Args) > 0 {
				return cli.Usagef("psp takes no arguments, got %q", inv.Args)
			}
			if err := f.opts.Validate(); err != nil {
				return cli.Usagef("%v", err)
			}
			// 0 in Options means the default; on the command line, whose
			// defaults are shown, it would be taken for 30s silently.
			if f.opts.Hang == 0 || f.opts.InFlightTimeout == 0 {
				return cli.Usagef("--hang and --in-flight-timeout must be positive, got %s and %s", f.opts.Hang, f.opts.InFlightTimeout)
			}
			if _, _, err := net.SplitHostPort(f.addr); err != nil {
				return cli.Usagef("--addr: %v", err)
			}
			if err := inv.Config.Require(config.EnvDatabaseURL); err != nil {
				return err
			}
			logger := app.NewLogger(inv.Config, inv.Stderr)
			pool, err := postgres.Open(ctx, inv.Config.DatabaseURL)
			if err != nil {
				return err
			}
			defer pool.Close()
			srv, err := NewServer(pool, f.opts, logger)
			if err != nil {
				return cli.Usagef("%v", err)
			}
			return app.Serve(ctx, f.addr, srv.Handler(), logger, inv.Config.ShutdownTimeout)
		},
	}
}

// EnvDevLatency is the latency of the stand-in that `orderpipe dev` runs
// (0 for a zero-latency provider, as `orderpipe bench e2e` wants).
var EnvDevLatency = config.DurationSettingOrZero("ORDERPIPE_DEV_PSP_LATENCY", "latency the `dev` payment provider stand-in adds to every charge, refund and void (0: none)", 20*time.Millisecond)

// Start runs the payment provider stand-in on a free loopback port until
// ctx ends (as `orderpipe dev` does) and returns its base URL, unless
// env.Config.PSPURL names a provider already (then it runs nothing and
// returns that URL); wait blocks until it stopped.
func Start(ctx context.Context, env *app.Env) (url string, wait func() error, err error) {
	if env.Config.PSPURL != "" {
		env.Logger.Info("payment provider from PSP_URL", slog.String("url", env.Config.PSPURL))
		return env.Config.PSPURL, func() error { <-ctx.Done(); return nil }, nil
	}
	latency, err := EnvDevLatency.Get()
	if err != nil {
		return "", nil, err
	}
	srv, err := NewServer(env.Pool, Options{Latency: latency}, env.Logger.With(slog.String("part", "psp")))
	if err != nil {
		return "", nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, fmt.Errorf("listen for the payment provider stand-in: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- app.ServeListener(ctx, l, srv.Handler(), env.Logger, env.Config.ShutdownTimeout) }()
	return "http://" + l.Addr().String(), func() error { return <-done }, nil
}

package compensator

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"orderpipe/shared/app"
	"orderpipe/shared/cli"
	"orderpipe/shared/config"
	"orderpipe/shared/outbox"
	"orderpipe/shared/postgres"
	"orderpipe/shared/psp"
	"orderpipe/shared/redelivery"
)

// flags are the command line of `orderpipe compensator`.
type flags struct {
	once, dryRun, force        bool
	stuckAfter                 time.Duration
	processing, reserved, paid time.Duration
	maxAttempts                int
	interval                   time.Duration
	batchSize                  int
	dedupeRetention            time.Duration
	outboxRetention            time.Duration
}

func (f *flags) setup(fs *flag.FlagSet) {
	fs.BoolVar(&f.once, "once", false, "make one pass, print one line per action and a summary, and exit")
	fs.BoolVar(&f.force, "force", false, "skip the start-up check that the windows fit together (for an operator who knows no consumer is still retrying); every action is recorded as forced")
	fs.BoolVar(&f.dryRun, "dry-run", false, "make one pass that only reads (in a READ ONLY transaction) and print what it would do; changes nothing")
	fs.DurationVar(&f.stuckAfter, "stuck-after", 0, fmt.Sprintf("stuck deadline of every open state (default %s each; the per-state flags override it)", DefaultStuckProcessing))
	fs.DurationVar(&f.processing, "stuck-processing", 0, fmt.Sprintf("stuck deadline of processing (default %s)", DefaultStuckProcessing))
	fs.DurationVar(&f.reserved, "stuck-reserved", 0, fmt.Sprintf("stuck deadline of reserved (default %s)", DefaultStuckReserved))
	fs.DurationVar(&f.paid, "stuck-paid", 0, fmt.Sprintf("stuck deadline of paid (default %s)", DefaultStuckPaid))
	fs.IntVar(&f.maxAttempts, "max-attempts", DefaultMaxAttempts, "re-drives per state before an order is unwound (0: unwind at the first deadline)")
	fs.DurationVar(&f.interval, "interval", DefaultInterval, "time between passes of the daemon")
	fs.IntVar(&f.batchSize, "batch-size", DefaultBatchSize, "stuck orders claimed per transaction")
	fs.DurationVar(&f.dedupeRetention, "dedupe-retention", DefaultDedupeRetention, "how long processed_messages rows are kept")
	fs.DurationVar(&f.outboxRetention, "outbox-retention", DefaultOutboxRetention, "how long published outbox rows of orders no longer open are kept")
}

// config turns the flags into a Config; set says which flags were given.
func (f *flags) config(set map[string]bool) (Config, error) {
	for name, d := range map[string]time.Duration{"stuck-after": f.stuckAfter, "stuck-processing": f.processing,
		"stuck-reserved": f.reserved, "stuck-paid": f.paid, "interval": f.interval, "dedupe-retention": f.dedupeRetention,
		"outbox-retention": f.outboxRetention} {
		if set[name] && d <= 0 {
			return Config{}, cli.Usagef("--%s must be a positive duration, got %s", name, d)
		}
	}
	if f.maxAttempts < 0 {
		return Config{}, cli.Usagef("--max-attempts must be 0 or more, got %d", f.maxAttempts)
	}
	if f.batchSize < 1 {
		return Config{}, cli.Usagef("--batch-size must be at least 1, got %d", f.batchSize)
	}
	cfg := Config{
		StuckProcessing: f.stuckAfter, StuckReserved: f.stuckAfter, StuckPaid: f.stuckAfter,
		MaxAttempts: f.maxAttempts, Interval: f.interval, BatchSize: f.batchSize,
		DedupeRetention: f.dedupeRetention, OutboxRetention: f.outboxRetention, DryRun: f.dryRun, Once: f.once || f.dryRun, Force: f.force,
	}
	var err error
	if cfg.ConsumerHorizon, err = SettingsFromEnv(); err != nil {
		return Config{}, err
	}
	if f.maxAttempts == 0 {
		cfg.MaxAttempts = NoRedrive
	}
	if set["stuck-processing"] {
		cfg.StuckProcessing = f.processing
	}
	if set["stuck-reserved"] {
		cfg.StuckReserved = f.reserved
	}
	if set["stuck-paid"] {
		cfg.StuckPaid = f.paid
	}
	return cfg.Validate()
}

// Command is `orderpipe compensator`.
func Command() cli.Command {
	f := &flags{}
	return cli.Command{
		Name:    "compensator",
		Summary: "find orders stuck in a non-terminal state; re-drive them or unwind them (cancel, release stock, refund); sweep dedupe rows",
		Usage:   "[--once] [--dry-run] [--force] [--stuck-after D | --stuck-processing D --stuck-reserved D --stuck-paid D] [--max-attempts N] [--interval D] [--batch-size N] [--dedupe-retention D] [--outbox-retention D]",
		Env: cli.Join(cli.Common, config.EnvHTTPAddr, config.EnvPSPURL, psp.EnvTimeout.Name, config.EnvShutdownTimeout,
			redelivery.EnvAckWait.Name, redelivery.EnvMaxDeliver.Name),
		Setup: f.setup,
		Run: func(ctx context.Context, inv cli.Invocation) error {
			if len(inv.Args) > 0 {
				return cli.Usagef("compensator takes no arguments, got %q", inv.Args)
			}
			set := map[string]bool{}
			inv.Flags.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
			cfg, err := f.config(set)
			if err != nil {
				var ue cli.UsageError
				if errors.As(err, &ue) {
					return err
				}
				return fmt.Errorf("refusing to start: %w", err)
			}
			logger := app.NewLogger(inv.Config, inv.Stderr)
			switch {
			case cfg.DryRun:
				return runDry(ctx, inv, cfg, logger)
			case f.once:
				return runOnce(ctx, inv, cfg, logger)
			default:
				return runDaemon(ctx, inv, cfg, logger)
			}
		},
	}
}

// provider returns the payment provider client, or nil (with a warning)
// when PSP_URL is not set: refunds then stay due until a compensator that
// has one runs.
func provider(cfg config.Config, logger *slog.Logger) (*psp.Client, error) {
	if cfg.PSPURL == "" {
		logger.Warn("PSP_URL is not set: refunds of unwound orders stay due until a compensator with a payment provider runs")
		return nil, nil
	}
	return psp.ClientFromEnv(cfg)
}

// runDry makes a read-only pass; it needs only PostgreSQL (connecting to
// NATS would provision the stream, which is a change).
func runDry(ctx context.Context, inv cli.Invocation, cfg Config, logger *slog.Logger) error {
	pool, err := postgres.OpenConfig(ctx, inv.Config)
	if err != nil {
		return err
	}
	defer pool.Close()
	c, err := New(cfg, pool, nil, nil, logger)
	if err != nil {
		return err
	}
	return printPass(ctx, c, inv.Stdout)
}

func printPass(ctx context.Context, c *Compensator, out io.Writer) error {
	c.OnAction = func(a Action) { fmt.Fprintln(out, a.String()) }
	res, err := c.RunOnce(ctx)
	fmt.Fprintln(out, res.Summary())
	if err != nil {
		return fmt.Errorf("the pass had errors (what it did is recorded; run it again): %w", err)
	}
	return nil
}

func openEnv(ctx context.Context, inv cli.Invocation, cfg Config, logger *slog.Logger) (*app.Env, *Compensator, error) {
	env, err := app.Open(ctx, inv.Config, logger, "compensator")
	if err != nil {
		return nil, nil, err
	}
	p, err := provider(inv.Config, logger)
	if err != nil {
		env.Close()
		return nil, nil, err
	}
	c, err := New(cfg, env.Pool, Relay(env), p, logger)
	if err != nil {
		env.Close()
		return nil, nil, err
	}
	return env, c, nil
}

// Relay returns the outbox relay the compensator publishes with.
func Relay(env *app.Env) *outbox.Relay {
	return &outbox.Relay{Pool: env.Pool, JS: env.JS, Topology: env.Topology, Logger: env.Logger, Ensure: env.EnsureStream}
}

func runOnce(ctx context.Context, inv cli.Invocation, cfg Config, logger *slog.Logger) error {
	env, c, err := openEnv(ctx, inv, cfg, logger)
	if err != nil {
		return err
	}
	defer env.Close()
	return printPass(ctx, c, inv.Stdout)
}

func runDaemon(ctx context.Context, inv cli.Invocation, cfg Config, logger *slog.Logger) error {
	env, c, err := openEnv(ctx, inv, cfg, logger)
	if err != nil {
		return err
	}
	defer env.Close()
	mux := http.NewServeMux()
	env.Mount(mux)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	var runErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		runErr = c.Run(ctx)
		cancel()
	}()
	logger.Info("compensator running", slog.Duration("interval", c.cfg.Interval), slog.String("actor", c.cfg.Actor),
		slog.Duration("stuck_processing", c.cfg.StuckProcessing), slog.Duration("stuck_reserved", c.cfg.StuckReserved),
		slog.Duration("stuck_paid", c.cfg.StuckPaid), slog.Int("max_attempts", c.cfg.Attempts()))
	serveErr := app.Serve(ctx, inv.Config.HTTPAddr, mux, logger, inv.Config.ShutdownTimeout)
	cancel()
	wg.Wait()
	return errors.Join(serveErr, runErr)
}

// Start runs the compensator daemon on env until ctx ends (as `orderpipe
// dev` does); wait blocks until it stopped.
func Start(ctx context.Context, env *app.Env) (wait func() error, err error) {
	logger := env.Logger.With(slog.String("part", "compensator"))
	p, err := provider(env.Config, logger)
	if err != nil {
		return nil, err
	}
	horizon, err := SettingsFromEnv()
	if err != nil {
		return nil, err
	}
	c, err := New(Config{ConsumerHorizon: horizon}, env.Pool, Relay(env), p, logger)
	if err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	return func() error { return <-done }, nil
}

package devenv

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"orderpipe/shared/app"
	"orderpipe/shared/cli"
	"orderpipe/shared/config"
)

// Part is one long-running part of the pipeline as `dev` runs it.
type Part struct {
	// Name for logs.
	Name string
	// Seed puts the part's dev data in place at every start with the part
	// (optional; see Seeder).
	Seed Seeder
	// Check reads the part's own settings from the environment and
	// returns what is wrong with them (optional). Run checks every part
	// before it starts anything: a bad value stops dev at once, not after
	// PostgreSQL, NATS and the parts before it started.
	Check func(cfg config.Config) error
	// Env names the variables the part reads, for `dev -h`.
	Env []string
	// Start starts the part and returns once it is serving; wait blocks
	// until the part has stopped after ctx ended. A part may fill in
	// env.Config (the payment stand-in sets PSPURL) for the parts after it.
	Start func(ctx context.Context, env *app.Env) (wait func() error, err error)
}

// Command is `orderpipe dev`.
func Command(parts []Part) cli.Command {
	return cli.Command{
		Name:    "dev",
		Summary: "run the whole pipeline in one process: managed PostgreSQL, embedded NATS, every part; writes $ORDERPIPE_DATA_DIR/dev.env",
		Usage:   "[PART...]",
		Env: cli.Join(cli.Common, append([]string{config.EnvHTTPAddr, config.EnvPSPURL, config.EnvDataDir,
			config.EnvAllowPrivateCallbacks, config.EnvShutdownTimeout, config.EnvDevNATSSyncAlways, config.EnvDevPGStatements}, partsEnv(parts)...)...),
		Run: func(ctx context.Context, inv cli.Invocation) error {
			parts, err := Select(parts, inv.Args)
			if err != nil {
				return cli.Usagef("%v", err)
			}
			cfg := inv.Config
			if _, set := os.LookupEnv(config.EnvLogFormat); !set {
				cfg.LogFormat = "text"
			}
			if _, set := os.LookupEnv(config.EnvAllowPrivateCallbacks); !set {
				cfg.AllowPrivateCallbacks = true
			}
			return Run(ctx, cfg, app.NewLogger(cfg, inv.Stderr), parts, inv.Stdout)
		},
	}
}

// partsEnv lists the variables that the parts read, in the parts' order.
func partsEnv(parts []Part) []string {
	var out []string
	for _, p := range parts {
		out = append(out, p.Env...)
	}
	return out
}

// Select returns the parts named, in the order dev starts them, or all of
// them when names is empty: `orderpipe dev producer` runs the intake alone
// (to measure it without the consumers sharing its cores). A name that is
// no part, or one given twice, is an error that lists the parts.
func Select(parts []Part, names []string) ([]Part, error) {
	if len(names) == 0 {
		return parts, nil
	}
	known := make([]string, len(parts))
	for i, p := range parts {
		known[i] = p.Name
	}
	want := make(map[string]bool, len(names))
	for _, n := range names {
		if !slices.Contains(known, n) {
			return nil, fmt.Errorf("dev: no part %q; the parts are %s", n, strings.Join(known, ", "))
		}
		if want[n] {
			return nil, fmt.Errorf("dev: part %q named twice", n)
		}
		want[n] = true
	}
	var out []Part
	for _, p := range parts {
		if want[p.Name] {
			out = append(out, p)
		}
	}
	return out, nil
}

// Run checks every part's settings (Part.Check: a UsageError naming what
// is wrong), starts the stack and the parts, prints how to reach them, and
// runs until ctx ends; then it stops the parts and the stack, in that
// order.
func Run(ctx context.Context, cfg config.Config, logger *slog.Logger, parts []Part, out interface{ Write([]byte) (int, error) }) (err error) {
	var seeders []Seeder
	var bad []error
	for _, p := range parts {
		if p.Seed != nil {
			seeders = append(seeders, p.Seed)
		}
		if p.Check != nil {
			if err := p.Check(cfg); err != nil {
				bad = append(bad, fmt.Errorf("%s: %w", p.Name, err))
			}
		}
	}
	if len(bad) > 0 {
		return cli.UsageError{Msg: "bad environment:\n" + errors.Join(bad...).Error()}
	}
	t0 := time.Now()
	stack, err := Start(ctx, cfg, logger, seeders...)
	if err != nil {
		return err
	}
	defer stack.Stop()
	env, err := app.Open(ctx, stack.Config, logger, "dev")
	if err != nil {
		return err
	}
	defer env.Close()

	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		waits []func() error
		names []string
	)
	stopAll := func() error {
		cancel()
		var errs []error
		var mu sync.Mutex
		var wg sync.WaitGroup
		for i, w := range waits {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := w(); err != nil && !errors.Is(err, context.Canceled) {
					mu.Lock()
					errs = append(errs, fmt.Errorf("%s: %w", names[i], err))
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		return errors.Join(errs...)
	}
	for _, p := range parts {
		w, err := p.Start(pctx, env)
		if err != nil {
			return errors.Join(fmt.Errorf("start %s: %w", p.Name, err), stopAll())
		}
		waits = append(waits, w)
		names = append(names, p.Name)
	}
	stack.Config = env.Config
	if err := os.WriteFile(stack.EnvFile, []byte(stack.EnvText()), 0o600); err != nil {
		return errors.Join(err, stopAll())
	}
	// One write: a reader that sees the first line sees the whole greeting.
	fmt.Fprintf(out, "orderpipe dev is up (%s). Its settings are in %s:\n\n%s\n\nSend an order:\n\n%s\n\nStop with Ctrl-C.\n",
		time.Since(t0).Round(time.Millisecond), stack.EnvFile, cli.Indent(stack.EnvText()), cli.Indent(CurlExample(stack.BaseURL(), stack.Credentials.APIKey)))

	<-ctx.Done()
	logger.Info("shutting down", slog.Duration("drain", env.Config.ShutdownTimeout))
	done := make(chan error, 1)
	go func() { done <- stopAll() }()
	select {
	case err := <-done:
		return err
	case <-time.After(env.Config.ShutdownTimeout + 5*time.Second):
		return errors.New("parts did not stop within the shutdown timeout")
	}
}

// CurlExample is a ready-to-paste command that sends an order.
func CurlExample(baseURL, apiKey string) string {
	return strings.Join([]string{
		"curl -sS -i -X POST " + baseURL + "/v1/orders \\",
		"  -H 'Authorization: Bearer " + apiKey + "' \\",
		"  -H 'Content-Type: application/json' \\",
		`  -d '{"request_id":"ORD'$(date -u +%Y%m%d%H%M%S)'demo","user_id":42,"items":[{"sku":"SKU-1","quantity":2}],"amount":"39.98","currency":"CNY"}'`,
	}, "\n")
}

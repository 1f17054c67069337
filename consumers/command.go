package consumers

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"text/tabwriter"

	"orderpipe/consumers/webhook"
	"orderpipe/shared/app"
	"orderpipe/shared/cli"
	"orderpipe/shared/config"
	"orderpipe/shared/postgres"
	"orderpipe/shared/psp"
	"orderpipe/shared/redelivery"
	"orderpipe/shared/stock"
)

// Command is `orderpipe consumers`: the router with every step, the outbox
// relay, and /healthz, /readyz, /metrics on HTTP_ADDR.
func Command() cli.Command {
	return cli.Command{
		Name:    "consumers",
		Summary: "run the pipeline steps (stock, payment, confirmation) on durable JetStream consumers",
		Env: cli.Join(cli.Common, config.EnvHTTPAddr, config.EnvPSPURL, psp.EnvTimeout.Name, redelivery.EnvAckWait.Name, redelivery.EnvMaxDeliver.Name,
			EnvWorkers.Name, webhook.EnvConcurrency.Name, webhook.EnvPerClient.Name, webhook.EnvTimeout.Name, config.EnvStreamReplicas, config.EnvShutdownTimeout),
		Run: func(ctx context.Context, inv cli.Invocation) error {
			if len(inv.Args) > 0 {
				return cli.Usagef("consumers takes no arguments, got %q", inv.Args)
			}
			// Every setting is read before any connection: a bad one is a
			// bad environment (exit 2), not a failure after connecting.
			cfg, err := ConfigFromEnv(inv.Config.ShutdownTimeout)
			hooks, herr := webhook.SettingsFromEnv()
			if err := errors.Join(err, herr); err != nil {
				return cli.Usagef("bad environment:\n%v", err)
			}
			if err := inv.Config.Require(config.EnvDatabaseURL, config.EnvNATSURL, config.EnvPSPURL); err != nil {
				return err
			}
			logger := app.NewLogger(inv.Config, inv.Stderr)
			env, err := app.Open(ctx, inv.Config, logger, "consumers")
			if err != nil {
				return err
			}
			defer env.Close()
			steps, err := Steps(env)
			if err != nil {
				return err
			}
			p, err := Build(env, cfg, steps...)
			if err != nil {
				return err
			}
			// The steps and the webhook worker stop when serving does: a
			// process whose address cannot be bound fails at start instead
			// of running without its probes and metrics.
			ctx, cancel := context.WithCancel(ctx)
			defer cancel()
			// The webhook delivery worker runs beside the steps; a slow
			// receiver only ever holds its own delivery slots.
			waitHooks := hooks.Start(ctx, env)
			defer func() { _ = waitHooks() }()
			mux := http.NewServeMux()
			env.Mount(mux)
			served := make(chan error, 1)
			go func() {
				served <- app.Serve(ctx, inv.Config.HTTPAddr, mux, logger, inv.Config.ShutdownTimeout)
				cancel()
			}()
			runErr := p.Run(ctx)
			cancel()
			return errors.Join(<-served, runErr)
		},
	}
}

// Start runs the pipeline steps on env until ctx ends (as `orderpipe dev`
// does): it returns once they consume; wait blocks until they stopped.
func Start(ctx context.Context, env *app.Env) (wait func() error, err error) {
	cfg, err := ConfigFromEnv(env.Config.ShutdownTimeout)
	if err != nil {
		return nil, err
	}
	steps, err := Steps(env)
	if err != nil {
		return nil, err
	}
	p, err := Build(env, cfg, steps...)
	if err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	select {
	case <-p.Running():
	case err := <-done:
		return nil, err
	}
	env.Logger.Info("pipeline steps running", slog.Int("steps", len(steps)))
	return func() error { return <-done }, nil
}

// DLQCommand is `orderpipe dlq list|replay ID`.
func DLQCommand() cli.Command {
	var all, asJSON bool
	var limit int
	return cli.Command{
		Name:    "dlq",
		Summary: "list dead-lettered messages, or replay one (with a fresh message id)",
		Usage:   "list [--all] [--limit N] [--json] | replay ID",
		Env:     cli.Common,
		Setup: func(fs *flag.FlagSet) {
			fs.BoolVar(&all, "all", false, "list: include dead letters already replayed")
			fs.IntVar(&limit, "limit", 100, "list: at most this many, newest first")
			fs.BoolVar(&asJSON, "json", false, "list: one JSON object per line")
		},
		Run: func(ctx context.Context, inv cli.Invocation) error {
			if len(inv.Args) == 0 {
				return cli.Usagef("want list or replay ID")
			}
			switch inv.Args[0] {
			case "list":
				// Flags may also follow the action: `dlq list --all`.
				if inv.Flags != nil {
					if err := cli.Parse(inv.Flags, inv.Args[1:]); err != nil {
						return err
					}
					if rest := inv.Flags.Args(); len(rest) > 0 {
						return cli.Usagef("list takes no arguments, got %q", rest)
					}
				} else if len(inv.Args) != 1 {
					return cli.Usagef("list takes no arguments")
				}
				if limit < 1 || limit > 100000 {
					return cli.Usagef("--limit must be between 1 and 100000")
				}
				pool, err := postgres.OpenConfig(ctx, inv.Config)
				if err != nil {
					return err
				}
				defer pool.Close()
				dls, err := ListDeadLetters(ctx, pool, all, limit)
				if err != nil {
					return err
				}
				return printDeadLetters(inv, dls, asJSON)
			case "replay":
				if len(inv.Args) != 2 {
					return cli.Usagef("replay takes one dead letter ID")
				}
				if inv.Flags != nil {
					var set []string
					inv.Flags.Visit(func(f *flag.Flag) { set = append(set, "--"+f.Name) })
					if len(set) > 0 {
						return cli.Usagef("replay takes no flags (%s: list's)", strings.Join(set, ", "))
					}
				}
				id, err := strconv.ParseInt(inv.Args[1], 10, 64)
				if err != nil || id < 1 {
					return cli.Usagef("dead letter ID must be a positive integer, got %q", inv.Args[1])
				}
				if err := inv.Config.Require(config.EnvDatabaseURL, config.EnvNATSURL); err != nil {
					return err
				}
				env, err := app.Open(ctx, inv.Config, app.NewLogger(inv.Config, inv.Stderr), "dlq")
				if err != nil {
					return err
				}
				defer env.Close()
				newID, err := ReplayDeadLetter(ctx, env.Pool, env.JS, id)
				if err != nil {
					return err
				}
				fmt.Fprintf(inv.Stdout, "replayed dead letter %d as %s\n", id, newID)
				return nil
			default:
				return cli.Usagef("unknown dlq action %q (want list or replay)", inv.Args[0])
			}
		},
	}
}

func printDeadLetters(inv cli.Invocation, dls []DeadLetter, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(inv.Stdout)
		for _, d := range dls {
			if err := enc.Encode(d); err != nil {
				return err
			}
		}
		return nil
	}
	tw := tabwriter.NewWriter(inv.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tCONSUMER\tMESSAGE\tATTEMPTS\tCREATED\tREPLAYED\tERROR")
	for _, d := range dls {
		replayed := "-"
		if d.ReplayedAt != nil {
			replayed = fmt.Sprintf("%dx, last %s", d.Replays, d.ReplayedAt.UTC().Format("2006-01-02T15:04:05Z"))
		}
		errText := strings.ReplaceAll(d.Error, "\n", " ")
		if len(errText) > 120 {
			errText = errText[:120] + "…"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%s\t%s\n", d.ID, d.Consumer, d.MessageID, d.Attempts,
			d.CreatedAt.UTC().Format("2006-01-02T15:04:05Z"), replayed, errText)
	}
	return tw.Flush()
}

// InventoryCommand is `orderpipe inventory set SKU QTY | list`.
func InventoryCommand() cli.Command {
	return cli.Command{
		Name:    "inventory",
		Summary: "set a SKU's available stock, or list stock (available and reserved)",
		Usage:   "set SKU QTY | list",
		Env:     cli.Common,
		Run: func(ctx context.Context, inv cli.Invocation) error {
			if len(inv.Args) == 0 {
				return cli.Usagef("want set SKU QTY or list")
			}
			var sku string
			var qty int64
			switch inv.Args[0] {
			case "set":
				if len(inv.Args) != 3 {
					return cli.Usagef("set takes SKU and QTY")
				}
				sku = inv.Args[1]
				var err error
				if qty, err = strconv.ParseInt(inv.Args[2], 10, 64); err != nil || qty < 0 {
					return cli.Usagef("QTY must be a whole number >= 0, got %q", inv.Args[2])
				}
				if err := stock.ValidSKU(sku); err != nil {
					return cli.Usagef("%v", err)
				}
			case "list":
				if len(inv.Args) != 1 {
					return cli.Usagef("list takes no arguments")
				}
			default:
				return cli.Usagef("unknown inventory action %q (want set or list)", inv.Args[0])
			}
			pool, err := postgres.OpenConfig(ctx, inv.Config)
			if err != nil {
				return err
			}
			defer pool.Close()
			if inv.Args[0] == "set" {
				if err := stock.Set(ctx, pool, sku, qty); err != nil {
					return err
				}
				fmt.Fprintf(inv.Stdout, "%s: %d available\n", sku, qty)
				return nil
			}
			levels, err := stock.List(ctx, pool)
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(inv.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "SKU\tAVAILABLE\tRESERVED")
			for _, l := range levels {
				fmt.Fprintf(tw, "%s\t%d\t%d\n", l.SKU, l.Available, l.Reserved)
			}
			return tw.Flush()
		},
	}
}

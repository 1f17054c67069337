package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"orderpipe/shared/app"
	"orderpipe/shared/callbackurl"
	"orderpipe/shared/cli"
	"orderpipe/shared/config"
)

// Environment variables of the delivery worker.
var (
	EnvConcurrency = config.IntSetting("ORDERPIPE_WEBHOOK_CONCURRENCY", "most webhook sends in flight per process", 32, 1)
	EnvPerClient   = config.IntSetting("ORDERPIPE_WEBHOOK_PER_CLIENT", "most webhook sends in flight per client per process (a slow receiver holds no more), at most ORDERPIPE_WEBHOOK_CONCURRENCY (unset: 4, or that if lower)", 4, 1)
	EnvTimeout     = config.DurationSetting("ORDERPIPE_WEBHOOK_TIMEOUT", "bound on one webhook request: connect, TLS, send, answer", 10*time.Second)
)

// Settings are the delivery worker's environment settings.
type Settings struct {
	// Concurrency is ORDERPIPE_WEBHOOK_CONCURRENCY.
	Concurrency int
	// PerClient is ORDERPIPE_WEBHOOK_PER_CLIENT, at most Concurrency.
	PerClient int
	// Timeout is ORDERPIPE_WEBHOOK_TIMEOUT.
	Timeout time.Duration
}

// SettingsFromEnv reads the worker's settings, so that a process can check
// them before it connects to anything; the error names every malformed
// variable. A per-client bound set above the concurrency is refused; left
// unset, it is lowered to a concurrency below its default.
func SettingsFromEnv() (Settings, error) {
	var s Settings
	err := errors.Join(EnvConcurrency.Into(&s.Concurrency), EnvPerClient.Into(&s.PerClient), EnvTimeout.Into(&s.Timeout))
	if err != nil {
		return Settings{}, err
	}
	if s.PerClient > s.Concurrency {
		if EnvPerClient.IsSet() {
			return Settings{}, fmt.Errorf("%s: want at most %s (%d), got %d", EnvPerClient, EnvConcurrency, s.Concurrency, s.PerClient)
		}
		s.PerClient = s.Concurrency
	}
	return s, nil
}

// Worker returns a worker with these settings on env's pool, logger and
// config (AllowPrivateCallbacks).
func (s Settings) Worker(env *app.Env) *Worker {
	return &Worker{
		Pool:         env.Pool,
		Logger:       env.Logger.With("part", "webhooks"),
		Client:       NewClient(ClientOptions{AllowPrivate: env.Config.AllowPrivateCallbacks, Timeout: s.Timeout}),
		AllowPrivate: env.Config.AllowPrivateCallbacks,
		Concurrency:  s.Concurrency,
		PerClient:    s.PerClient,
		Lease:        2*s.Timeout + 30*time.Second,
	}
}

// Start runs a worker with these settings in the background (for the
// consumers process); wait returns once ctx ended and the sends in flight
// were recorded.
func (s Settings) Start(ctx context.Context, env *app.Env) (wait func() error) {
	w := s.Worker(env)
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	return func() error { return <-done }
}

// Start runs a worker with the settings of the environment in the
// background (for `orderpipe dev`), as Settings.Start does.
func Start(ctx context.Context, env *app.Env) (wait func() error, err error) {
	s, err := SettingsFromEnv()
	if err != nil {
		return nil, err
	}
	return s.Start(ctx, env), nil
}

// Command is `orderpipe webhooks list --order ID | resend WEBHOOK_ID`.
func Command() cli.Command {
	return cli.Command{
		Name:    "webhooks",
		Summary: "list an order's webhook deliveries with their attempts, or resend one (same webhook-id)",
		Usage:   "list --order ORDER_ID [--json] | resend WEBHOOK_ID",
		Env:     []string{config.EnvDatabaseURL},
		Run: cli.Subcommands(
			cli.Sub{Name: "list", Run: runList},
			cli.Sub{Name: "resend", Run: runResend},
		),
	}
}

// runList is `webhooks list --order ID [--json]`.
func runList(ctx context.Context, inv cli.Invocation) error {
	fs := flag.NewFlagSet("webhooks list", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	order := fs.String("order", "", "order id (UUID)")
	asJSON := fs.Bool("json", false, "print JSON, one delivery per line")
	if err := cli.Parse(fs, inv.Args); errors.Is(err, flag.ErrHelp) {
		return err // the command's usage, exit 0
	} else if err != nil {
		return cli.Usagef("webhooks list: %v", err)
	}
	if fs.NArg() > 0 {
		return cli.Usagef("webhooks list: unexpected argument %q", fs.Arg(0))
	}
	if *order == "" {
		return cli.Usagef("webhooks list: --order is required")
	}
	id, err := uuid.Parse(*order)
	if err != nil || id == uuid.Nil {
		return cli.Usagef("webhooks list: --order %q is not an order id (a UUID)", *order)
	}
	return cli.WithPool(ctx, inv, func(q *pgxpool.Pool) error {
		ds, err := List(ctx, q, id)
		if err != nil {
			return err
		}
		if *asJSON {
			enc := json.NewEncoder(inv.Stdout)
			for _, d := range ds {
				if err := enc.Encode(d); err != nil {
					return err
				}
			}
			return nil
		}
		return printTable(inv.Stdout, ds)
	})
}

// runResend is `webhooks resend WEBHOOK_ID`.
func runResend(ctx context.Context, inv cli.Invocation) error {
	if len(inv.Args) != 1 {
		return cli.Usagef("webhooks resend: want exactly one WEBHOOK_ID")
	}
	if _, _, err := ParseID(inv.Args[0]); err != nil {
		return cli.Usagef("webhooks resend: %v", err)
	}
	return cli.WithPool(ctx, inv, func(q *pgxpool.Pool) error {
		d, err := Resend(ctx, q, inv.Args[0])
		if err != nil {
			return err
		}
		fmt.Fprintf(inv.Stdout, "%s queued again for %s (order %s, seq %d)\n", d.WebhookID, callbackurl.Redact(d.URL), d.OrderID, d.Seq)
		return nil
	})
}

func printTable(w io.Writer, ds []Delivery) error {
	if len(ds) == 0 {
		_, err := fmt.Fprintln(w, "no webhook deliveries for this order")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "WEBHOOK_ID\tSEQ\tSTATUS\tATTEMPTS\tLAST_CODE\tLAST_LATENCY\tNEXT_ATTEMPT\tLAST_ERROR")
	for _, d := range ds {
		code, lat, next, lastErr := "-", "-", "-", ""
		if d.LastStatusCode != nil {
			code = fmt.Sprint(*d.LastStatusCode)
		}
		if d.LastLatencyMS != nil {
			lat = fmt.Sprintf("%dms", *d.LastLatencyMS)
		}
		if d.Status == StatusPending {
			next = d.NextAttemptAt.UTC().Format(time.RFC3339)
		}
		if d.LastError != nil {
			lastErr = *d.LastError
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%s\t%s\t%s\t%s\n", d.WebhookID, d.Seq, d.Status, d.Attempts, code, lat, next, lastErr)
	}
	return errors.Join(tw.Flush())
}

package producer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"

	"orderpipe/producer/mcp"
	"orderpipe/shared/app"
	"orderpipe/shared/cli"
	"orderpipe/shared/config"
	"orderpipe/shared/idemtoken"
	"orderpipe/shared/outbox"
)

// Command is `orderpipe producer`: the intake API on HTTP_ADDR, with an
// outbox relay that publishes whatever the inline publish left behind.
func Command() cli.Command {
	return cli.Command{
		Name:    "producer",
		Summary: "serve the intake API (POST /v1/orders …) on HTTP_ADDR and relay the outbox to NATS",
		Usage:   "",
		Env: cli.Join(cli.Common, config.EnvHTTPAddr, config.EnvAllowPrivateCallbacks, config.EnvShutdownTimeout,
			EnvTimeout.Name, EnvRateLimit.Name, EnvRateBurst.Name, EnvMaxInFlight.Name, EnvMaxStreams.Name, EnvMaxStreamsPerClient.Name,
			idemtoken.EnvTTL.Name),
		Run: func(ctx context.Context, inv cli.Invocation) error {
			if len(inv.Args) > 0 {
				return cli.Usagef("producer takes no arguments")
			}
			opts, err := OptionsFromEnv()
			if err != nil {
				return fmt.Errorf("bad environment: %w", err)
			}
			logger := app.NewLogger(inv.Config, inv.Stderr)
			env, err := app.Open(ctx, inv.Config, logger, "producer")
			if err != nil {
				return err
			}
			defer env.Close()
			l, err := net.Listen("tcp", inv.Config.HTTPAddr)
			if err != nil {
				return fmt.Errorf("listen on %s: %w", inv.Config.HTTPAddr, err)
			}
			return Run(ctx, env, l, opts)
		},
	}
}

// Run serves the intake on l — the order routes, the events stream
// (GET /v1/orders/{order_id}/events) and the MCP endpoint (/mcp), all
// behind the intake's authentication — and runs the outbox relay until ctx
// ends, then drains in-flight requests within the shutdown timeout and stops
// the relay and the stream's listener.
func Run(ctx context.Context, env *app.Env, l net.Listener, opts Options) error {
	svc := NewService(env, opts)
	// The stream's listener ends with ctx, so open streams end, and a
	// wait_for_order in progress answers (timed_out), at once on SIGTERM
	// instead of holding the drain.
	xctx, stopExtra := context.WithCancel(ctx)
	extra, waitExtra, err := mcp.Routes(xctx, env, svc, ClientID)
	if err != nil {
		stopExtra()
		return fmt.Errorf("start the events stream and the MCP endpoint: %w", err)
	}
	defer waitExtra()
	defer stopExtra() // runs first: ends the listener, then waits for it
	own := svc.opts.Extra
	svc.opts.Extra = func(mux *http.ServeMux, auth func(http.Handler) http.Handler) {
		extra(mux, auth)
		if own != nil {
			own(mux, auth)
		}
	}
	relay := &outbox.Relay{Pool: env.Pool, JS: env.JS, Topology: env.Topology, Logger: env.Logger, Ensure: env.EnsureStream}
	rctx, stopRelay := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = relay.Run(rctx)
	}()
	h, _ := newAPI(env, svc)
	err = app.ServeListener(ctx, l, h, env.Logger, env.Config.ShutdownTimeout)
	stopRelay()
	wg.Wait()
	env.Logger.Info("producer stopped")
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// Start runs the intake on env.Config.HTTPAddr until ctx ends (as
// `orderpipe dev` does): it returns once the intake listens; wait blocks
// until it stopped.
func Start(ctx context.Context, env *app.Env) (wait func() error, err error) {
	opts, err := OptionsFromEnv()
	if err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", env.Config.HTTPAddr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", env.Config.HTTPAddr, err)
	}
	env.Logger.Info("intake listening", slog.String("addr", l.Addr().String()))
	done := make(chan error, 1)
	go func() { done <- Run(ctx, env, l, opts) }()
	return func() error { return <-done }, nil
}

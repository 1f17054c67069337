package mcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/google/uuid"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"orderpipe/producer/orderstream"
	"orderpipe/shared/app"
	"orderpipe/shared/cli"
	"orderpipe/shared/config"
	"orderpipe/shared/tenant"
)

// EnvAPIKey is the API key that `orderpipe mcp` acts as (dev.env sets it).
var EnvAPIKey = config.StringSetting("ORDERPIPE_API_KEY", "API key of the client that `orderpipe mcp` acts for (dev.env has the dev client's)", "", "none")

// Command is `orderpipe mcp`: the tools over stdio for the client of
// ORDERPIPE_API_KEY. intake reads the intake's settings, before anything
// connects (a bad one is a usage error naming it), and returns what builds
// the intake service on the process's connections (main passes
// producer's); intakeEnv names the variables it reads, for the help.
func Command(intake func() (func(env *app.Env) (Intake, error), error), intakeEnv ...string) cli.Command {
	return cli.Command{
		Name:    "mcp",
		Summary: "serve the MCP tools (create_order, get_order, wait_for_order) over stdio for the client of ORDERPIPE_API_KEY",
		Usage:   "",
		Env:     cli.Join(cli.Common, append([]string{EnvAPIKey.Name, config.EnvAllowPrivateCallbacks}, intakeEnv...)...),
		Run: func(ctx context.Context, inv cli.Invocation) error {
			if len(inv.Args) > 0 {
				return cli.Usagef("mcp takes no arguments")
			}
			newIntake, err := intake()
			if err != nil {
				return cli.Usagef("bad environment:\n%v", err)
			}
			apiKey, _ := EnvAPIKey.Get()
			return RunStdio(ctx, inv.Config, apiKey, os.Stdin, inv.Stdout, inv.Stderr, newIntake)
		},
	}
}

// RunStdio serves the tools on in/out (newline-delimited JSON-RPC) until
// ctx ends or the client closes in. Logs go to logs, never to out.
func RunStdio(ctx context.Context, cfg config.Config, apiKey string, in io.Reader, out, logs io.Writer,
	newIntake func(env *app.Env) (Intake, error),
) error {
	apiKey = strings.TrimSpace(apiKey)
	if apiKey == "" {
		return fmt.Errorf("missing environment: %s must be set to the API key of the client to act for", EnvAPIKey)
	}
	if err := cfg.Require(config.EnvDatabaseURL, config.EnvNATSURL); err != nil {
		return err
	}
	logger := app.NewLogger(cfg, logs).With(slog.String("part", "mcp"))
	env, err := app.Open(ctx, cfg, logger, "mcp")
	if err != nil {
		return err
	}
	defer env.Close()
	client, err := tenant.Authenticate(ctx, env.Pool, apiKey)
	if errors.Is(err, tenant.ErrUnauthenticated) {
		return fmt.Errorf("%s: %w", EnvAPIKey, err)
	}
	if err != nil {
		return err
	}
	intake, err := newIntake(env)
	if err != nil {
		return err
	}
	hctx, stopHub := context.WithCancel(ctx)
	hub := orderstream.NewHub(env.Pool, logger)
	hubDone := make(chan struct{})
	go func() {
		defer close(hubDone)
		_ = hub.Run(hctx)
	}()
	defer func() { stopHub(); <-hubDone }()
	srv, err := NewServer(Options{
		Intake: intake, Waker: hub, Logger: logger,
		Client: func(context.Context, *sdk.CallToolRequest) (uuid.UUID, bool) { return client.ID, true },
	})
	if err != nil {
		return err
	}
	logger.Info("serving MCP over stdio", slog.String("client_id", client.ID.String()))
	err = srv.Run(ctx, &sdk.IOTransport{Reader: io.NopCloser(in), Writer: nopWriteCloser{out}})
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, io.EOF) {
		return nil
	}
	return fmt.Errorf("mcp over stdio: %w", err)
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }

// Command orderpipe makes order writes safe to retry: an idempotent intake,
// an event-driven pipeline on NATS JetStream, a compensator and signed
// callbacks. `orderpipe help` lists the subcommands.
//
// This file only parses the command line and calls into the packages.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"orderpipe/compensator"
	"orderpipe/consumers"
	"orderpipe/consumers/webhook"
	"orderpipe/producer"
	"orderpipe/producer/mcp"
	"orderpipe/shared/app"
	"orderpipe/shared/cli"
	"orderpipe/shared/config"
	"orderpipe/shared/failpoint"
	"orderpipe/shared/tooling/bench"
	"orderpipe/shared/tooling/devenv"
	"orderpipe/shared/tooling/pspserver"
)

// commands lists every subcommand, in the order `help` shows them.
func commands() []cli.Command {
	return []cli.Command{
		devenv.Command(devParts()),
		migrateCommand(),
		producer.Command(),
		clientsCommand(),
		probeCommand(),
		bench.Command(),
		consumers.Command(),
		consumers.InventoryCommand(),
		consumers.DLQCommand(),
		pspserver.Command(),
		compensator.Command(), compensator.OrdersCommand(),
		chaosCommand(), checkCommand(), natsNodeCommand(), eventsCommand(),
		webhook.Command(), mcp.Command(func(env *app.Env) (mcp.Intake, error) {
			o, err := producer.OptionsFromEnv()
			return producer.NewService(env, o), err
		}),
	}
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		if len(args) > 1 {
			return run([]string{args[1], "-h"}, stdout, stderr)
		}
		usage(stdout)
		return 0
	}
	var cmd *cli.Command
	for _, c := range commands() {
		if c.Name == args[0] {
			cmd = &c
			break
		}
	}
	if cmd == nil {
		fmt.Fprintf(stderr, "orderpipe: unknown command %q\n\n", args[0])
		usage(stderr)
		return 2
	}
	if err := failpoint.FromEnv(); err != nil {
		fmt.Fprintf(stderr, "orderpipe: %v\n", err)
		return 2
	}
	fs := flag.NewFlagSet("orderpipe "+cmd.Name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	printUsage := func() {
		fmt.Fprintf(fs.Output(), "usage: orderpipe %s %s\n\n%s\n", cmd.Name, cmd.Usage, cmd.Summary)
		hasFlags := false
		fs.VisitAll(func(*flag.Flag) { hasFlags = true })
		if hasFlags {
			fmt.Fprintln(fs.Output(), "\nFlags:")
			fs.PrintDefaults()
		}
		cli.PrintEnv(fs.Output(), cmd.Env)
	}
	fs.Usage = func() {} // printed below, once, to the right stream
	if cmd.Setup != nil {
		cmd.Setup(fs)
	}
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(stdout)
			printUsage()
			return 0
		}
		printUsage()
		return 2
	}
	cfg, err := config.FromEnv()
	if err != nil {
		fmt.Fprintf(stderr, "orderpipe %s: bad environment:\n%v\n", cmd.Name, err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err = cmd.Run(ctx, cli.Invocation{Args: fs.Args(), Flags: fs, Stdout: stdout, Stderr: stderr, Config: cfg})
	var ue cli.UsageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "orderpipe %s: %v\n\n", cmd.Name, err)
		printUsage()
		return 2
	default:
		fmt.Fprintf(stderr, "orderpipe %s: %v\n", cmd.Name, err)
		return 1
	}
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "orderpipe makes order writes safe to retry.\n\nusage: orderpipe <command> [flags]\n\nCommands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-12s %s\n", c.Name, c.Summary)
	}
	fmt.Fprintln(w, "  help         this text; `orderpipe help <command>` or `orderpipe <command> -h` for one command")
	fmt.Fprintln(w, "\nEnvironment (every process):")
	for _, v := range config.Vars() {
		fmt.Fprintf(w, "  %-34s %s (default: %s)\n", v.Name, v.Meaning, v.Default)
	}
}

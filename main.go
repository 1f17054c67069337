// Command orderpipe makes order writes safe to retry: an idempotent intake,
// an event-driven pipeline on NATS JetStream, a compensator and signed
// callbacks. `orderpipe help` lists the subcommands.
//
// This file only parses the command line and calls into the packages.
package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"orderpipe/compensator"
	"orderpipe/consumers"
	"orderpipe/consumers/webhook"
	"orderpipe/producer"
	"orderpipe/producer/mcp"
	"orderpipe/shared/app"
	"orderpipe/shared/cli"
	"orderpipe/shared/config"
	"orderpipe/shared/idemtoken"
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
		webhook.Command(), mcp.Command(func() (func(*app.Env) (mcp.Intake, error), error) {
			o, err := producer.OptionsFromEnv()
			return func(env *app.Env) (mcp.Intake, error) { return producer.NewService(env, o), nil }, err
		}, producer.EnvTimeout.Name, idemtoken.EnvTTL.Name),
	}
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		if len(args) > 2 {
			fmt.Fprintf(stderr, "orderpipe: help takes one command, got %q\n\n", strings.Join(args[1:], " "))
			usage(stderr)
			return 2
		}
		if len(args) > 1 && args[1] != "help" && args[1] != "-h" && args[1] != "--help" {
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
	return cli.Execute(*cmd, args[1:], stdout, stderr)
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

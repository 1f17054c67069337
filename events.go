package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/google/uuid"

	"orderpipe/shared/app"
	"orderpipe/shared/cli"
	"orderpipe/shared/config"
	"orderpipe/shared/natsjs"
	"orderpipe/shared/orderevent"
)

// eventsCommand is `orderpipe events tail|asyncapi`: a subscriber's view of
// the ORDERS stream, for operators and for whoever writes a subscriber.
func eventsCommand() cli.Command {
	return cli.Command{
		Name:    "events",
		Summary: "follow the ORDERS stream's events live with their headers (tail), or print its AsyncAPI document (asyncapi)",
		Usage:   "tail [--order ORDER_ID] [--subject orders.paid] [--from-seq N | --since 10m] [--json] [--count N] [--stream ORDERS --prefix orders] | asyncapi",
		Env:     []string{config.EnvNATSURL},
		Run: cli.Subcommands(
			cli.Sub{Name: "tail", Run: runTail},
			cli.Sub{Name: "asyncapi", Run: runAsyncAPI},
		),
	}
}

// runAsyncAPI is `events asyncapi`.
func runAsyncAPI(_ context.Context, inv cli.Invocation) error {
	if len(inv.Args) > 0 {
		return cli.Usagef("events asyncapi takes no arguments, got %q", inv.Args)
	}
	_, err := inv.Stdout.Write(orderevent.AsyncAPI())
	return err
}

// runTail is `events tail`.
func runTail(ctx context.Context, inv cli.Invocation) error {
	topo, o, err := parseTail(inv.Args, inv.Stdout)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := inv.Config.Require(config.EnvNATSURL); err != nil {
		return err
	}
	nc, js, err := natsjs.Connect(inv.Config.NATSURL, "orderpipe events tail", app.NewLogger(inv.Config, inv.Stderr))
	if err != nil {
		return err
	}
	defer nc.Close()
	return orderevent.Tail(ctx, js, topo, o, inv.Stdout, inv.Stderr)
}

// parseTail parses the flags of `events tail`; every mistake is a usage
// error (exit code 2). -h prints the flags to help and returns flag.ErrHelp.
func parseTail(args []string, help io.Writer) (orderevent.Topology, orderevent.TailOptions, error) {
	var (
		o       orderevent.TailOptions
		order   string
		fromSeq int64
		topo    = orderevent.DefaultTopology
		fs      = flag.NewFlagSet("events tail", flag.ContinueOnError)
	)
	fail := func(err error) (orderevent.Topology, orderevent.TailOptions, error) { return topo, o, err }
	fs.SetOutput(io.Discard)
	fs.StringVar(&order, "order", "", "only this order's events (UUID)")
	fs.StringVar(&o.Subject, "subject", "", "only this subject, e.g. orders.paid (default: every subject)")
	fs.Int64Var(&fromSeq, "from-seq", 0, "start at this stream sequence (≥ 1)")
	fs.DurationVar(&o.Since, "since", 0, "start this long ago, e.g. 10m")
	fs.BoolVar(&o.JSON, "json", false, "print JSON, one message per line: seq, subject, time, headers, event")
	fs.IntVar(&o.Count, "count", 0, "stop after N events (default: follow until interrupted)")
	fs.StringVar(&topo.Stream, "stream", topo.Stream, "the stream")
	fs.StringVar(&topo.Prefix, "prefix", topo.Prefix, "the subjects' first token")
	if err := cli.Parse(fs, args); errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(help, "usage: orderpipe events tail [flags]\n\nFlags:")
		fs.SetOutput(help)
		fs.PrintDefaults()
		return fail(err)
	} else if err != nil {
		return fail(cli.Usagef("events tail: %v", err))
	}
	if fs.NArg() > 0 {
		return fail(cli.Usagef("events tail: unexpected argument %q", fs.Arg(0)))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if order != "" {
		id, err := uuid.Parse(order)
		if err != nil || id == uuid.Nil {
			return fail(cli.Usagef("events tail: --order %q is not an order id (a UUID)", order))
		}
		o.OrderID = id
	}
	switch {
	case set["from-seq"] && fromSeq < 1:
		return fail(cli.Usagef("events tail: --from-seq must be a stream sequence ≥ 1, got %d", fromSeq))
	case set["since"] && o.Since <= 0:
		return fail(cli.Usagef("events tail: --since must be a positive duration such as 10m, got %s", o.Since))
	case set["from-seq"] && set["since"]:
		return fail(cli.Usagef("events tail: give --from-seq or --since, not both"))
	case set["subject"] && o.Subject == "":
		return fail(cli.Usagef("events tail: --subject is empty"))
	case topo.Stream == "" || topo.Prefix == "":
		return fail(cli.Usagef("events tail: --stream and --prefix must not be empty"))
	}
	o.FromSeq = uint64(fromSeq)
	if err := o.Validate(topo); err != nil {
		if errors.Is(err, orderevent.ErrBadTailOptions) {
			return fail(cli.Usagef("events tail: %v", err))
		}
		return fail(err)
	}
	return topo, o, nil
}

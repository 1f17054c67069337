package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"orderpipe/shared/cli"
	"orderpipe/shared/config"
	"orderpipe/shared/natsjs"
	"orderpipe/shared/order"
	"orderpipe/shared/postgres"
	"orderpipe/shared/tooling/chaos"
)

// envChaosSeed and envChaosTime are read by `orderpipe chaos` (and `make
// chaos`) when the flags are not given.
var (
	envChaosSeed = config.Register("CHAOS_SEED", "seed of `orderpipe chaos`, a positive integer (replays a run's fault schedule)", "random, printed first")
	envChaosTime = config.DurationSettingBetween("CHAOS_TIME", "how long `orderpipe chaos` injects faults, 1s to 24h", 60*time.Second, minChaosTime, maxChaosTime)
)

// The bounds of CHAOS_TIME and --time.
const (
	minChaosTime = time.Second
	maxChaosTime = 24 * time.Hour
)

// chaosCommand is `orderpipe chaos`: the randomized fault checker.
func chaosCommand() cli.Command {
	var (
		seed    uint64
		dur     time.Duration
		quiesce time.Duration
		clients int
		dir     string
		asJSON  bool
	)
	return cli.Command{
		Name:    "chaos",
		Summary: "run the whole pipeline as separate processes on a 3-node NATS cluster, inject random faults from a seed, then check every invariant on every order",
		Usage:   "[--seed N] [--time 60s] [--quiesce 4m] [--clients 8] [--dir DIR] [--json]",
		Env:     []string{envChaosSeed, envChaosTime.Name},
		Setup: func(fs *flag.FlagSet) {
			fs.Uint64Var(&seed, "seed", 0, "seed of the fault schedule, a positive integer (default $CHAOS_SEED, else random)")
			fs.DurationVar(&dur, "time", 0, "how long to inject faults (default $CHAOS_TIME, else 60s)")
			fs.DurationVar(&quiesce, "quiesce", 4*time.Minute, "bound on the wait for every order to settle after the faults")
			fs.IntVar(&clients, "clients", 8, "concurrent clients")
			fs.StringVar(&dir, "dir", "", "keep data and logs here (default: a temporary folder, removed after a clean run)")
			fs.BoolVar(&asJSON, "json", false, "print the result as JSON at the end")
		},
		Run: func(ctx context.Context, inv cli.Invocation) error {
			if len(inv.Args) > 0 {
				return cli.Usagef("chaos takes no arguments, got %q", inv.Args)
			}
			set := map[string]bool{}
			inv.Flags.Visit(func(f *flag.Flag) { set[f.Name] = true })
			// 0 is the seed that chaos.Run takes for "pick one at random":
			// given, it would be ignored.
			if set["seed"] && seed == 0 {
				return cli.Usagef("--seed must be a positive integer (leave it out for a random one), got 0")
			}
			if !set["seed"] {
				if v := os.Getenv(envChaosSeed); v != "" {
					n, err := strconv.ParseUint(v, 10, 64)
					if err != nil || n == 0 {
						return cli.Usagef("%s must be a positive integer (unset: random), got %q", envChaosSeed, v)
					}
					seed = n
				}
			}
			if !set["time"] {
				var err error
				if dur, err = envChaosTime.Get(); err != nil {
					return cli.Usagef("%v", err)
				}
			}
			if dur < minChaosTime || dur > maxChaosTime {
				return cli.Usagef("--time must be between %s and %s, got %s", config.FormatDuration(minChaosTime), config.FormatDuration(maxChaosTime), dur)
			}
			if quiesce <= 0 {
				return cli.Usagef("--quiesce must be positive, got %s", quiesce)
			}
			if clients < 1 || clients > 1000 {
				return cli.Usagef("--clients must be between 1 and 1000, got %d", clients)
			}
			res, err := chaos.Run(ctx, chaos.Options{Seed: seed, Duration: dur, Quiesce: quiesce, Clients: clients, Dir: dir, Out: inv.Stdout})
			if err != nil {
				return fmt.Errorf("chaos run (seed %d): %w", res.Seed, err)
			}
			if asJSON {
				b, _ := res.JSON()
				fmt.Fprintln(inv.Stdout, string(b))
			}
			if !res.OK() {
				return fmt.Errorf("chaos run (seed %d): invariants broken; replay with CHAOS_SEED=%d", res.Seed, res.Seed)
			}
			fmt.Fprintf(inv.Stdout, "every invariant held (seed %d)\n", res.Seed)
			return nil
		},
	}
}

// checkCommand is `orderpipe check`: the invariant checker over a database.
func checkCommand() cli.Command {
	var (
		stock  string
		asJSON bool
	)
	return cli.Command{
		Name:    "check",
		Summary: "check every invariant on every order of a database (terminal, one order per request_id, money, stock, webhooks, outbox, dead letters); exit 1 if one is broken",
		Usage:   "[--initial-stock SKU=N,…] [--json]",
		Env:     []string{config.EnvDatabaseURL},
		Setup: func(fs *flag.FlagSet) {
			fs.StringVar(&stock, "initial-stock", "", "each SKU's stock before the orders (SKU=N,…): checks that stock is conserved")
			fs.BoolVar(&asJSON, "json", false, "print the report as JSON")
		},
		Run: func(ctx context.Context, inv cli.Invocation) error {
			if len(inv.Args) > 0 {
				return cli.Usagef("check takes no arguments, got %q", inv.Args)
			}
			initial, err := parseStock(stock)
			if err != nil {
				return err
			}
			if inv.Config.DatabaseURL == "" {
				return errors.New("DATABASE_URL must be set")
			}
			pool, err := postgres.Open(ctx, inv.Config.DatabaseURL)
			if err != nil {
				return err
			}
			defer pool.Close()
			rep, err := chaos.Check(ctx, pool, chaos.CheckOptions{InitialStock: initial})
			if err != nil {
				return err
			}
			if asJSON {
				b, _ := json.MarshalIndent(rep, "", "  ")
				fmt.Fprintln(inv.Stdout, string(b))
			} else {
				rep.Print(inv.Stdout)
			}
			if !rep.OK() {
				return fmt.Errorf("invariants broken for %d order(s)", len(rep.BrokenOrders()))
			}
			return nil
		},
	}
}

// parseStock parses "SKU-1=100,SKU-2=5".
func parseStock(s string) (map[string]int64, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	out := map[string]int64{}
	for _, part := range strings.Split(s, ",") {
		sku, n, ok := strings.Cut(strings.TrimSpace(part), "=")
		q, err := strconv.ParseInt(n, 10, 64)
		if !ok || !order.ValidSKU(sku) || err != nil || q < 0 {
			return nil, cli.Usagef("--initial-stock wants SKU=N pairs separated by commas (a SKU as orders name them, N ≥ 0), got %q", part)
		}
		out[sku] = q
	}
	return out, nil
}

// natsNodeCommand is `orderpipe natsnode`: one node of a NATS cluster with
// JetStream, in a process of its own, for the chaos checker (which stops,
// kills and restarts nodes for real).
func natsNodeCommand() cli.Command {
	var o natsjs.EmbeddedOptions
	var routes string
	return cli.Command{
		Name:    "natsnode",
		Summary: "run one NATS server with JetStream (optionally a cluster node) until SIGTERM; used by `orderpipe chaos`",
		Usage:   "--store DIR [--port N] [--name NAME] [--cluster-port N --routes URL,…] [--sync-always]",
		Setup: func(fs *flag.FlagSet) {
			fs.StringVar(&o.StoreDir, "store", "", "JetStream's file store (required)")
			fs.IntVar(&o.Port, "port", 4222, "client port (127.0.0.1)")
			fs.StringVar(&o.Name, "name", "", "server name (each cluster node needs its own)")
			fs.IntVar(&o.Cluster.Port, "cluster-port", 0, "cluster port (0: not a cluster node)")
			fs.StringVar(&o.Cluster.Name, "cluster-name", "orderpipe", "cluster name")
			fs.StringVar(&routes, "routes", "", "the other nodes' cluster URLs, comma-separated")
			fs.BoolVar(&o.SyncAlways, "sync-always", false, "fsync every write before acknowledging it")
		},
		Run: func(ctx context.Context, inv cli.Invocation) error {
			if len(inv.Args) > 0 {
				return cli.Usagef("natsnode takes no arguments, got %q", inv.Args)
			}
			if o.StoreDir == "" {
				return cli.Usagef("--store is required")
			}
			if o.Port < 1 || o.Port > 65535 || o.Cluster.Port < 0 || o.Cluster.Port > 65535 {
				return cli.Usagef("ports must be between 1 and 65535")
			}
			if routes != "" {
				if o.Cluster.Port == 0 {
					return cli.Usagef("--routes needs --cluster-port")
				}
				o.Cluster.Routes = strings.Split(routes, ",")
			}
			ns, err := natsjs.StartEmbedded(o)
			if err != nil {
				return err
			}
			fmt.Fprintf(inv.Stdout, "nats node %s listening on %s\n", o.Name, ns.ClientURL())
			<-ctx.Done()
			ns.Shutdown()
			ns.WaitForShutdown()
			return nil
		},
	}
}

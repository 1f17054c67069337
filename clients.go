package main

import (
	"context"
	"encoding/json"
	"flag"

	"github.com/google/uuid"

	"orderpipe/shared/cli"
	"orderpipe/shared/config"
	"orderpipe/shared/postgres"
	"orderpipe/shared/tenant"
)

// clientsCommand is `orderpipe clients`:
//
//   - `create --name N [--rate-limit R] [--burst B]` registers an API client
//     and prints its credentials as one JSON object
//     {"client_id","api_key","webhook_secret"}; the API key is shown only
//     then;
//   - `set-rate-limit --id ID [--rate-limit R] [--burst B]` changes a
//     client's own rate limit (0, or leaving a flag out, means the intake's
//     default) and prints the client's limits.
func clientsCommand() cli.Command {
	var name, id *string
	var limit *float64
	var burst *int
	return cli.Command{
		Name:    "clients",
		Summary: "register an API client: `clients create --name N [--rate-limit R --burst B]` prints {\"client_id\",\"api_key\",\"webhook_secret\"} once; `clients set-rate-limit --id ID --rate-limit R --burst B`",
		Usage:   "create --name N [--rate-limit R] [--burst B] | set-rate-limit --id ID [--rate-limit R] [--burst B]",
		Env:     []string{config.EnvDatabaseURL},
		Setup: func(fs *flag.FlagSet) {
			name = fs.String("name", "", "create: the client's name (1-200 characters), e.g. the shop it belongs to")
			id = fs.String("id", "", "set-rate-limit: the client_id")
			limit = fs.Float64("rate-limit", 0, "requests per second this client may send to the intake (0: the intake's ORDERPIPE_RATE_LIMIT)")
			burst = fs.Int("burst", 0, "burst of this client's token bucket (0: the intake's ORDERPIPE_RATE_BURST)")
		},
		Run: func(ctx context.Context, inv cli.Invocation) error {
			if len(inv.Args) == 0 || (inv.Args[0] != "create" && inv.Args[0] != "set-rate-limit") {
				return cli.Usagef("want the action create or set-rate-limit")
			}
			action := inv.Args[0]
			// Flags may come after the action: clients create --name N.
			if err := cli.Parse(inv.Flags, inv.Args[1:]); err != nil {
				return err
			}
			if inv.Flags.NArg() > 0 {
				return cli.Usagef("unexpected arguments: %v", inv.Flags.Args())
			}
			limits := tenant.Limits{Rate: *limit, Burst: *burst}
			if err := limits.Validate(); err != nil {
				return cli.Usagef("%v", err)
			}
			var clientID uuid.UUID
			switch action {
			case "create":
				if *id != "" {
					return cli.Usagef("--id is for set-rate-limit; create makes a new client id")
				}
				if *name == "" {
					return cli.Usagef("--name is required")
				}
				if err := tenant.ValidateName(*name); err != nil {
					return cli.Usagef("--name: %v", err)
				}
			case "set-rate-limit":
				if *name != "" {
					return cli.Usagef("--name is for create")
				}
				var err error
				if clientID, err = uuid.Parse(*id); err != nil {
					return cli.Usagef("--id must be a client_id (a UUID), got %q", *id)
				}
			}
			pool, err := postgres.OpenConfig(ctx, inv.Config)
			if err != nil {
				return err
			}
			defer pool.Close()
			if action == "create" {
				c, err := tenant.CreateLimited(ctx, pool, *name, limits)
				if err != nil {
					return err
				}
				return json.NewEncoder(inv.Stdout).Encode(c)
			}
			if err := tenant.SetLimits(ctx, pool, clientID, limits); err != nil {
				return err
			}
			c, err := tenant.Get(ctx, pool, clientID)
			if err != nil {
				return err
			}
			return json.NewEncoder(inv.Stdout).Encode(struct {
				ClientID uuid.UUID `json:"client_id"`
				tenant.Limits
			}{c.ID, c.Limits})
		},
	}
}

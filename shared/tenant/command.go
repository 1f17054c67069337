package tenant

import (
	"context"
	"encoding/json"
	"flag"
	"io"

	"orderpipe/shared/cli"
	"orderpipe/shared/config"
	"orderpipe/shared/postgres"
)

// Command is `orderpipe clients create --name N`: it registers an API
// client and prints its credentials as one JSON object
// {"client_id","api_key","webhook_secret"}. The API key is shown only then.
func Command() cli.Command {
	var name *string
	return cli.Command{
		Name:    "clients",
		Summary: "register an API client: `clients create --name N` prints {\"client_id\",\"api_key\",\"webhook_secret\"} once",
		Usage:   "create --name N",
		Env:     []string{config.EnvDatabaseURL},
		Setup: func(fs *flag.FlagSet) {
			name = fs.String("name", "", "the client's name (1-200 characters), e.g. the shop it belongs to")
		},
		Run: func(ctx context.Context, inv cli.Invocation) error {
			if len(inv.Args) == 0 || inv.Args[0] != "create" {
				return cli.Usagef("want the action create")
			}
			// Flags may come after the action: clients create --name N.
			inv.Flags.SetOutput(io.Discard) // the error is reported once, below
			if err := inv.Flags.Parse(inv.Args[1:]); err != nil {
				return cli.Usagef("%v", err)
			}
			if inv.Flags.NArg() > 0 {
				return cli.Usagef("unexpected arguments: %v", inv.Flags.Args())
			}
			if name == nil || *name == "" {
				return cli.Usagef("--name is required")
			}
			if err := ValidateName(*name); err != nil {
				return cli.Usagef("--name: %v", err)
			}
			pool, err := postgres.OpenConfig(ctx, inv.Config)
			if err != nil {
				return err
			}
			defer pool.Close()
			c, err := Create(ctx, pool, *name)
			if err != nil {
				return err
			}
			return json.NewEncoder(inv.Stdout).Encode(c)
		},
	}
}

package main

import (
	"context"
	"fmt"

	"orderpipe/shared/cli"
	"orderpipe/shared/config"
	"orderpipe/shared/postgres"
)

// migrateCommand is `orderpipe migrate up|down|status|reset`.
func migrateCommand() cli.Command {
	return cli.Command{
		Name:    "migrate",
		Summary: "apply (up), roll back one (down), roll back all (reset) or list (status) the schema migrations",
		Usage:   "up|down|reset|status",
		Env:     []string{config.EnvDatabaseURL},
		Run: func(ctx context.Context, inv cli.Invocation) error {
			if len(inv.Args) != 1 {
				return cli.Usagef("want exactly one of up, down, reset, status")
			}
			switch inv.Args[0] {
			case "up", "down", "reset", "status":
			default: // a bad command line is told before any connection is tried
				return cli.Usagef("unknown migrate action %q (want up, down, reset or status)", inv.Args[0])
			}
			pool, err := postgres.OpenConfig(ctx, inv.Config)
			if err != nil {
				return err
			}
			defer pool.Close()
			m, err := postgres.NewMigrator(pool)
			if err != nil {
				return err
			}
			defer m.Close()
			switch inv.Args[0] {
			case "up":
				err = m.Up(ctx)
			case "down":
				err = m.Down(ctx)
			case "reset":
				err = m.Reset(ctx)
			case "status":
				return m.Status(ctx, inv.Stdout)
			default:
				return cli.Usagef("unknown migrate action %q (want up, down, reset or status)", inv.Args[0])
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(inv.Stdout, "migrate %s: done\n", inv.Args[0])
			return m.Status(ctx, inv.Stdout)
		},
	}
}

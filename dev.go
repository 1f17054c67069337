package main

import (
	"context"

	"orderpipe/compensator"
	"orderpipe/consumers"
	"orderpipe/consumers/webhook"
	"orderpipe/producer"
	"orderpipe/shared/app"
	"orderpipe/shared/stock"
	"orderpipe/shared/tooling/devenv"
	"orderpipe/shared/tooling/pspserver"
)

// devParts are the long-running parts that `orderpipe dev` runs in one
// process, in start order. Each part exposes a Start(ctx, env); the one
// dependency between them is written here: the consumers and the
// compensator call the payment provider at env.Config.PSPURL, which the
// stand-in's start fills in (unless PSP_URL names a provider), so it
// starts before them.
func devParts() []devenv.Part {
	return []devenv.Part{
		{Name: "producer", Start: producer.Start},
		{Name: "psp", Start: func(ctx context.Context, env *app.Env) (func() error, error) {
			url, wait, err := pspserver.Start(ctx, env)
			env.Config.PSPURL = url
			return wait, err
		}},
		{Name: "consumers", Seed: stock.Seed, Start: consumers.Start},
		{Name: "compensator", Start: compensator.Start},
		{Name: "webhooks", Start: webhook.Start},
	}
}

package main

import (
	"context"

	"orderpipe/compensator"
	"orderpipe/consumers"
	"orderpipe/consumers/webhook"
	"orderpipe/producer"
	"orderpipe/shared/app"
	"orderpipe/shared/config"
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
		{Name: "producer", Env: producer.Command().Env, Start: producer.Start, Check: func(config.Config) error {
			_, err := producer.OptionsFromEnv()
			return err
		}},
		{Name: "psp", Env: []string{pspserver.EnvDevLatency.Name}, Start: func(ctx context.Context, env *app.Env) (func() error, error) {
			url, wait, err := pspserver.Start(ctx, env)
			env.Config.PSPURL = url
			return wait, err
		}, Check: func(cfg config.Config) error {
			if cfg.PSPURL != "" {
				return nil // the stand-in does not run
			}
			_, err := pspserver.EnvDevLatency.Get()
			return err
		}},
		{Name: "consumers", Seed: stock.Seed, Env: consumers.Command().Env, Start: consumers.Start, Check: func(cfg config.Config) error {
			_, err := consumers.ConfigFromEnv(cfg.ShutdownTimeout)
			return err
		}},
		{Name: "compensator", Env: compensator.Command().Env, Start: compensator.Start, Check: func(config.Config) error {
			_, err := compensator.SettingsFromEnv()
			return err
		}},
		{Name: "webhooks", Env: []string{webhook.EnvConcurrency.Name, webhook.EnvPerClient.Name, webhook.EnvTimeout.Name}, Start: webhook.Start, Check: func(config.Config) error {
			_, err := webhook.SettingsFromEnv()
			return err
		}},
	}
}

package consumers

import (
	"orderpipe/consumers/confirm"
	"orderpipe/consumers/inventory"
	"orderpipe/consumers/notify"
	"orderpipe/consumers/payment"
	"orderpipe/consumers/step"
	"orderpipe/shared/app"
	"orderpipe/shared/psp"
)

// Factory builds a step for a process's environment.
type Factory func(env *app.Env) (step.Step, error)

// Factories lists the steps that `orderpipe consumers` and `orderpipe dev`
// run. A new step (e.g. the webhook notifier, subscribed to every status
// event) is one more line here: its package returns a step.Step.
func Factories() []Factory {
	return []Factory{
		func(*app.Env) (step.Step, error) { return inventory.Step(), nil },
		func(env *app.Env) (step.Step, error) {
			client, err := psp.ClientFromEnv(env.Config)
			if err != nil {
				return step.Step{}, err
			}
			return payment.Step(env.Pool, client), nil
		},
		func(*app.Env) (step.Step, error) { return confirm.Step(), nil },
		func(env *app.Env) (step.Step, error) { return notify.Step(env.Pool), nil },
	}
}

// Steps builds every step of Factories on env.
func Steps(env *app.Env) ([]step.Step, error) {
	var out []step.Step
	for _, f := range Factories() {
		st, err := f(env)
		if err != nil {
			return nil, err
		}
		out = append(out, st)
	}
	return out, nil
}

package psp_test

import (
	"context"
	"testing"
	"time"

	"orderpipe/shared/app"
	"orderpipe/shared/config"
	"orderpipe/shared/psp"
	"orderpipe/shared/testenv"
)

func TestDevPart(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	env := &app.Env{Config: config.Config{ShutdownTimeout: time.Second}, Logger: testenv.Logger(t), Pool: db.Pool}
	ctx, cancel := context.WithCancel(context.Background())
	wait, err := psp.DevPart().Start(ctx, env)
	if err != nil {
		t.Fatal(err)
	}
	if env.Config.PSPURL == "" {
		t.Fatal("the dev part did not set PSP_URL")
	}
	a, err := psp.NewClient(env.Config.PSPURL, time.Second).Charge(context.Background(), "k-dev", "1.00", "CNY", "dev")
	if err != nil || a.Status != psp.StatusSucceeded {
		t.Fatalf("charge on the dev stand-in: %+v, %v", a, err)
	}
	cancel()
	if err := wait(); err != nil {
		t.Fatalf("stop: %v", err)
	}

	// PSP_URL set: the part leaves it alone and starts nothing.
	env.Config.PSPURL = "http://provider.invalid"
	ctx, cancel = context.WithCancel(context.Background())
	wait, err = psp.DevPart().Start(ctx, env)
	if err != nil || env.Config.PSPURL != "http://provider.invalid" {
		t.Fatalf("with PSP_URL set: %v, url %q", err, env.Config.PSPURL)
	}
	cancel()
	if err := wait(); err != nil {
		t.Fatal(err)
	}
}

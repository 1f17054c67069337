package pspserver_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"orderpipe/shared/psp"
	"orderpipe/shared/tooling/pspserver"
	"orderpipe/shared/tooling/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func TestStart(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	env := testenv.Env(t, db, nil)
	ctx, cancel := context.WithCancel(t.Context())
	url, wait, err := pspserver.Start(ctx, env)
	if err != nil {
		t.Fatal(err)
	}
	if url == "" || env.Config.PSPURL != "" {
		t.Fatalf("Start returned %q and set PSP_URL to %q; want a URL, and the config left alone", url, env.Config.PSPURL)
	}
	a, err := psp.NewClient(url, time.Second).Charge(t.Context(), "k-dev", "1.00", "CNY", "dev")
	if err != nil || a.Status != psp.StatusSucceeded {
		t.Fatalf("charge on the dev stand-in: %+v, %v", a, err)
	}
	cancel()
	if err := wait(); err != nil {
		t.Fatalf("stop: %v", err)
	}

	// PSP_URL set: the part leaves it alone and starts nothing.
	env.Config.PSPURL = "http://provider.invalid"
	ctx, cancel = context.WithCancel(t.Context())
	url, wait, err = pspserver.Start(ctx, env)
	if err != nil || url != "http://provider.invalid" {
		t.Fatalf("with PSP_URL set: %v, url %q", err, url)
	}
	cancel()
	if err := wait(); err != nil {
		t.Fatal(err)
	}
}

// A malformed ORDERPIPE_DEV_PSP_LATENCY fails the part's start, naming the
// variable.
func TestStartMalformedLatency(t *testing.T) {
	t.Setenv(pspserver.EnvDevLatency.Name, "-5ms")
	env := testenv.Env(t, testenv.DB(t), nil)
	if _, _, err := pspserver.Start(t.Context(), env); err == nil || !strings.Contains(err.Error(), pspserver.EnvDevLatency.Name) {
		t.Fatalf("Start with a negative latency: %v, want an error naming the variable", err)
	}
}

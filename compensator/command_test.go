package compensator_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"orderpipe/compensator"
	"orderpipe/shared/cli"
	"orderpipe/shared/config"
	"orderpipe/shared/idemtoken"
	"orderpipe/shared/order"
	"orderpipe/shared/orderstore"
	"orderpipe/shared/tooling/testenv"
)

// run runs a command the way main does: flags, then Run.
func run(t *testing.T, cmd cli.Command, cfg config.Config, args ...string) (string, error) {
	t.Helper()
	return runCtx(t.Context(), t, cmd, cfg, args...)
}

// runCtx is run until ctx ends (for the daemon).
func runCtx(ctx context.Context, t *testing.T, cmd cli.Command, cfg config.Config, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	cfg.LogLevel, cfg.LogFormat = "error", "text"
	err := testenv.RunCommand(ctx, cmd, cfg, &out, nil, args...)
	return out.String(), err
}

func isUsage(err error) bool {
	var ue cli.UsageError
	return errors.As(err, &ue)
}

func TestCommandRefusesMalformedFlags(t *testing.T) {
	t.Parallel()
	testenv.WantUsageErrors(t, compensator.Command(), config.Config{},
		[]string{"--max-attempts", "-1"},
		[]string{"--max-attempts", "many"},
		[]string{"--stuck-after", "0s"},
		[]string{"--stuck-after", "-5m"},
		[]string{"--stuck-after", "soon"},
		[]string{"--stuck-paid", "0"},
		[]string{"--interval", "-1s"},
		[]string{"--batch-size", "0"},
		[]string{"--dedupe-retention", "0s"},
		[]string{"--bogus"},
		[]string{"extra-argument"},
	)
}

func TestCommandRefusesWindowsThatDoNotFit(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"--once", "--stuck-after", "1m"},                          // inside the consumers' redelivery horizon
		{"--once", "--dedupe-retention", "1h"},                     // shorter than the duplicate window
		{"--interval", "3h"},                                       // the daemon's interval longer than a deadline
		{"--dry-run", "--stuck-reserved", "1s"},                    // one state
		{"--once", "--max-attempts", "100", "--stuck-after", "2h"}, // open horizon past the retention
	} {
		_, err := run(t, compensator.Command(), config.Config{}, args...)
		if err == nil || isUsage(err) || !strings.Contains(err.Error(), "refusing to start") || !strings.Contains(err.Error(), "does not fit") {
			t.Errorf("%q: got %v", args, err)
		}
	}
}

func TestCommandDryRunAndOnce(t *testing.T) {
	t.Parallel()
	w, id := newWorldWithOrder(t, spec{status: order.StatusReserved})
	w.exec(`UPDATE orders SET updated_at = now() - interval '1 day' WHERE order_id = $1`, id)
	w.unstamp()
	cfg := config.Config{DatabaseURL: w.db.URL, NATSURL: w.nats.URL, PSPURL: w.pspURL}
	before := dump(t, w.db.Pool)
	out, err := run(t, compensator.Command(), cfg, "--dry-run")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "would-redrive") || !strings.Contains(lines[0], id.String()) ||
		!strings.HasPrefix(lines[1], "dry run (nothing changed): stuck processing=0 reserved=1 paid=0") {
		t.Fatalf("dry run printed:\n%s", out)
	}
	after := dump(t, w.db.Pool)
	for tb, d := range before {
		if after[tb] != d {
			t.Errorf("dry run changed %s", tb)
		}
	}
	t.Logf("dry run:\n%s", out)
	// --once acts, through NATS on the default topology of a real
	// process: the test's stream does not see it, the outbox row does.
	out, err = run(t, compensator.Command(), cfg, "--once", "--max-attempts", "0")
	if err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 2 || !strings.HasPrefix(lines[0], "unwind ") ||
		!strings.HasPrefix(lines[1], "pass: stuck processing=0 reserved=1 paid=0; redriven 0, unwound 1") {
		t.Fatalf("--once printed:\n%s", out)
	}
	if w.status(id) != order.StatusCancelled {
		t.Fatal("not cancelled")
	}
}

func TestOrdersInspectAndStats(t *testing.T) {
	t.Parallel()
	w, id := newWorldWithOrder(t, spec{status: order.StatusPaid, lines: map[string]int{"SKU-1": 2}, payment: "succeeded"})
	w.exec(`INSERT INTO processed_messages (consumer, message_id) VALUES ('inventory', $1)`, id.String()+":accepted")
	w.exec(`INSERT INTO dead_letters (consumer, message_id, subject, payload, error, attempts, order_id) VALUES ('payment', $1, 's', '\x00', 'provider down', 8, $2)`, id.String()+":reserved", id)
	w.age(id)
	w.pass(w.comp(w.cfg(compensator.NoRedrive), w.psp))
	cfg := config.Config{DatabaseURL: w.db.URL}

	out, err := run(t, compensator.OrdersCommand(), cfg, "inspect", id.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("inspect:\n%s", out)
	for _, want := range []string{
		"status        cancelled", "history (order_events) (4)", "processing", "events (outbox) (4)", id.String() + ":cancelled",
		"processed steps (processed_messages) (1)", "reservations (1)", "SKU-1", "payment (1)", "refunded",
		"provider charges (psp_charges) (1)", "provider refunds (psp_refunds) (1)", "dead letters (1)", "provider down",
		"compensator actions (2)", "unwind", "refund", "webhook deliveries (0)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("inspect output lacks %q:\n%s", want, out)
		}
	}
	if _, err := run(t, compensator.OrdersCommand(), cfg, "inspect", uuid.NewString()); !errors.Is(err, orderstore.ErrNotFound) {
		t.Errorf("unknown order: %v", err)
	}

	w.newOrder(spec{status: order.StatusProcessing})
	for range 2 {
		if _, err := idemtoken.Issue(t.Context(), w.db.Pool, w.client, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	w.exec(`UPDATE idempotency_tokens SET expires_at = now() WHERE token = (SELECT min(token) FROM idempotency_tokens)`)
	out, err = run(t, compensator.OrdersCommand(), cfg, "stats", "--stuck-after", "1h")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("stats:\n%s", out)
	for _, want := range []string{"orders by status", "cancelled   1", "processing  1", "(stuck)", "dead letters by consumer (1)",
		"webhook deliveries by status (0)", "compensator actions in the last 24h (2)", "outbox",
		"idempotency tokens by state (4)", "unused      1", "expired     1"} {
		if !strings.Contains(out, want) {
			t.Errorf("stats output lacks %q:\n%s", want, out)
		}
	}

	for _, args := range [][]string{
		{}, {"inspect"}, {"inspect", "not-a-uuid"}, {"inspect", "00000000-0000-0000-0000-000000000000"},
		{"inspect", id.String(), "extra"}, {"stats", "extra"}, {"stats", "--stuck-after", "-1m"}, {"stats", "--stuck-after", "x"},
		{"stats", "--nope"}, {"delete", id.String()},
	} {
		if _, err := run(t, compensator.OrdersCommand(), cfg, args...); !isUsage(err) {
			t.Errorf("%q: got %v, want a usage error", args, err)
		}
	}
	if _, err := run(t, compensator.OrdersCommand(), config.Config{}, "stats"); err == nil || isUsage(err) {
		t.Errorf("no DATABASE_URL: %v", err)
	}
	_ = testenv.Logger
}

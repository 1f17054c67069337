package webhook_test

import (
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"orderpipe/consumers/webhook"
	"orderpipe/shared/tooling/testenv"
)

// TestFailedDeliveryKeepsTheQueryOutOfLogsAndAttempts: the receiver drops
// the connection, so net/http's error names the URL ("Post \"…?token=…\":
// EOF"); neither the log nor webhook_attempts.error nor last_error may
// carry the token.
func TestFailedDeliveryKeepsTheQueryOutOfLogsAndAttempts(t *testing.T) {
	t.Parallel()
	f := setup(t)
	srv, _ := tlsServer(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		c, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			_ = c.Close()
		}
	}))
	orderID, ids := f.enqueue(t, f.client, srv.URL+"/hooks?token=secret-t0ken&x=1", 1)
	var logs testenv.Buffer
	client := webhook.NewClient(webhook.ClientOptions{AllowPrivate: true, TLSConfig: trust(srv)})
	w := fastWorker(t, f.pool, client)
	w.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	w.Schedule = []time.Duration{10 * time.Millisecond}
	startWorker(t, w)
	ctx := t.Context()
	testenv.WaitFor(t, 20*time.Second, "the delivery failed", func() bool {
		d, err := webhook.Get(ctx, f.pool, ids[0])
		return err == nil && d.Status == webhook.StatusFailed
	})
	ds, err := webhook.List(ctx, f.pool, orderID)
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) != 1 || len(ds[0].History) != 2 || ds[0].LastError == nil {
		t.Fatalf("recorded %+v", ds)
	}
	for _, a := range ds[0].History {
		if a.Error == nil || !strings.Contains(*a.Error, "/hooks?REDACTED") {
			t.Errorf("attempt %d error %v: want the URL with its query redacted", a.Attempt, deref(a.Error))
		} else if strings.Contains(*a.Error, "secret-t0ken") {
			t.Errorf("attempt %d error carries the token: %s", a.Attempt, *a.Error)
		}
	}
	if strings.Contains(*ds[0].LastError, "secret-t0ken") {
		t.Errorf("last_error carries the token: %s", *ds[0].LastError)
	}
	out := logs.String()
	if !strings.Contains(out, "webhook attempt failed") {
		t.Fatalf("no failed attempt logged: %s", out)
	}
	if strings.Contains(out, "secret-t0ken") {
		t.Fatalf("the log carries the token:\n%s", out)
	}
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

package app_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"orderpipe/shared/tooling/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// TestReadyzNamesTheFailingDependency: /readyz answers 200 while PostgreSQL
// and NATS answer, and still 200, naming the broker degraded, when the NATS
// server is gone (the broker is not needed to accept orders durably).
func TestReadyzNamesTheFailingDependency(t *testing.T) {
	t.Parallel()
	db, ns := testenv.DB(t), testenv.OwnNATS(t)
	nc, js := testenv.Connect(t, ns.URL())
	env := testenv.Env(t, db, nil)
	env.NC, env.JS = nc, js
	mux := http.NewServeMux()
	env.Mount(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	get := func(path string) (int, map[string]string) {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body map[string]string
		_ = json.NewDecoder(resp.Body).Decode(&body)
		return resp.StatusCode, body
	}
	if code, body := get("/readyz"); code != 200 || body["postgres"] != "ok" || body["nats"] != "ok" {
		t.Fatalf("ready: %d %v", code, body)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Fatalf("healthz: %d", code)
	}
	ns.Stop()
	var body map[string]string
	// The intake still accepts orders into the outbox without the broker:
	// /readyz stays 200 and names the broker as degraded.
	var code int
	testenv.WaitFor(t, 10*time.Second, "/readyz to report NATS degraded", func() bool {
		code, body = get("/readyz")
		return body["nats"] == "degraded"
	})
	if code != http.StatusOK || body["postgres"] != "ok" || body["status"] != "degraded" {
		t.Fatalf("readyz %d %v: want 200, postgres ok, status degraded", code, body)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Fatal("healthz must stay 200 (alive) while a dependency is down")
	}
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("metrics: %d", resp.StatusCode)
	}
}

// TestReadyzDependsOnPostgres: without PostgreSQL /readyz answers 503, and
// its body shows no raw dependency error (hosts, users, ports).
func TestReadyzDependsOnPostgres(t *testing.T) {
	t.Parallel()
	ns := testenv.OwnNATS(t)
	nc, js := testenv.Connect(t, ns.URL())
	pool, err := pgxpool.New(t.Context(), "postgres://secretuser:secretpw@127.0.0.1:1/x?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	env := testenv.Env(t, nil, nil)
	env.Pool, env.NC, env.JS = pool, nc, js
	mux := http.NewServeMux()
	env.Mount(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	resp, err := http.Get(srv.URL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(raw), `"postgres":"unavailable"`) {
		t.Fatalf("readyz %d %s: want 503 naming postgres unavailable", resp.StatusCode, raw)
	}
	for _, leak := range []string{"secretuser", "127.0.0.1", "dial", "connect"} {
		if strings.Contains(string(raw), leak) {
			t.Errorf("readyz body leaks %q: %s", leak, raw)
		}
	}
}

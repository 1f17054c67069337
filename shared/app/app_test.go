package app_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"orderpipe/shared/app"
	"orderpipe/shared/config"
	"orderpipe/shared/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// TestReadyzNamesTheFailingDependency: /readyz answers 200 while PostgreSQL
// and NATS answer, and 503 naming NATS when its server is gone.
func TestReadyzNamesTheFailingDependency(t *testing.T) {
	t.Parallel()
	db, ns := testenv.DB(t), testenv.OwnNATS(t)
	nc, js := testenv.Connect(t, ns.URL())
	env := &app.Env{Config: config.Config{}, Logger: testenv.Logger(t), Pool: db.Pool, NC: nc, JS: js, Metrics: app.NewRegistry()}
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
	testenv.WaitFor(t, 10*time.Second, "/readyz to report NATS down", func() bool {
		var code int
		code, body = get("/readyz")
		return code == http.StatusServiceUnavailable
	})
	if body["postgres"] != "ok" || body["nats"] == "ok" || body["nats"] == "" {
		t.Fatalf("readyz body %v: want postgres ok and the NATS error", body)
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

package bench

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"orderpipe/consumers"
	"orderpipe/producer"
	"orderpipe/shared/app"
	"orderpipe/shared/stock"
	"orderpipe/shared/tenant"
	"orderpipe/shared/tooling/pspserver"
	"orderpipe/shared/tooling/testenv"
)

// stack is a real intake (and, on request, the pipeline behind it) in
// this process, on the test's own database and stream.
type stack struct {
	url, apiKey, dbURL string
}

func startStack(t *testing.T, pipeline bool) stack {
	t.Helper()
	db, n := testenv.DB(t), testenv.NATS(t)
	env := testenv.Env(t, db, n)
	env.Config.LogLevel, env.Config.LogFormat = "info", "text"
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	var waits []func() error
	t.Cleanup(func() {
		cancel()
		for _, w := range waits {
			if err := w(); err != nil && !strings.Contains(err.Error(), "context canceled") {
				t.Errorf("part stopped with: %v", err)
			}
		}
	})
	done := make(chan error, 1)
	go func() { done <- producer.Run(ctx, env, l, producer.Options{RateLimit: 1e6, RateBurst: 1e6}) }()
	waits = append(waits, func() error { return <-done })
	if pipeline {
		url, wait, err := pspserver.Start(ctx, env)
		if err != nil {
			t.Fatalf("start psp: %v", err)
		}
		env.Config.PSPURL = url
		waits = append(waits, wait)
		parts := []struct {
			name  string
			start func(context.Context, *app.Env) (func() error, error)
		}{{"consumers", consumers.Start}}
		if err := stock.Seed(ctx, db.Pool); err != nil {
			t.Fatalf("stock the inventory: %v", err)
		}
		for _, p := range parts {
			w, err := p.start(ctx, env)
			if err != nil {
				t.Fatalf("start %s: %v", p.name, err)
			}
			waits = append(waits, w)
		}
	}
	creds, err := tenant.Create(ctx, db.Pool, "bench")
	if err != nil {
		t.Fatal(err)
	}
	return stack{url: "http://" + l.Addr().String(), apiKey: creds.APIKey, dbURL: db.URL}
}

func (s stack) args(action, out string, more ...string) []string {
	return append([]string{action, "--url", s.url, "--api-key", s.apiKey, "--database-url", s.dbURL, "--out", out}, more...)
}

func readResult(t *testing.T, dir string) Result {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "result.json"))
	if err != nil {
		t.Fatalf("result.json: %v", err)
	}
	var r Result
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("result.json: %v\n%s", err, b)
	}
	html, err := os.ReadFile(filepath.Join(dir, "chart.html"))
	if err != nil {
		t.Fatalf("chart.html: %v", err)
	}
	if !strings.Contains(string(html), "<svg") || !strings.Contains(string(html), "<polyline") || strings.Contains(string(html), "<script") || strings.Contains(string(html), "src=") {
		t.Fatalf("chart.html is not a self-contained SVG chart:\n%.2000s", html)
	}
	return r
}

// checkRun holds a run's result to what bench promises: requests sent,
// all 2xx, no duplicate, a throughput and ordered percentiles, a timeline.
func checkRun(t *testing.T, r Measurement, kind string) {
	t.Helper()
	if r.Kind != kind || r.Requests == 0 || r.OK != r.Requests || r.Non2xx != 0 || r.Duplicates != 0 {
		t.Fatalf("%s run: %+v", kind, r)
	}
	l := r.Latency
	if r.Throughput <= 0 || r.Seconds <= 0 || l.P50 <= 0 || l.P50 > l.P95 || l.P95 > l.P99 || l.P99 > l.Max*1.0001 {
		t.Fatalf("%s run: throughput %.1f over %.2fs, latency %+v", kind, r.Throughput, r.Seconds, l)
	}
	var ok int64
	for _, s := range r.Timeline {
		ok += s.OK
	}
	if len(r.Timeline) == 0 || ok != r.OK {
		t.Fatalf("%s run: timeline of %d seconds holds %d ok of %d", kind, len(r.Timeline), ok, r.OK)
	}
}

// TestAgainstARealStack runs intake, replay and baseline against a real
// intake on a real PostgreSQL and NATS, and checks their results.
func TestAgainstARealStack(t *testing.T) {
	s := startStack(t, false)
	cfg := offlineConfig(t)

	out := filepath.Join(t.TempDir(), "intake")
	stdout, stderr, err := invoke(t, nil, cfg, s.args("intake", out, "--duration", "2s", "--concurrency", "4")...)
	if err != nil {
		t.Fatalf("bench intake: %v\n%s\n%s", err, stdout, stderr)
	}
	if !strings.Contains(stderr, "intake      1s") || !strings.Contains(stdout, "p99 ms") {
		t.Fatalf("bench intake: want progress per second on stderr and a summary on stdout:\n%s\n%s", stderr, stdout)
	}
	r := readResult(t, out)
	if r.Action != "intake" || len(r.Runs) != 1 || len(r.Failures) != 0 || r.Settings.Concurrency != 4 {
		t.Fatalf("intake result: %+v", r)
	}
	checkRun(t, r.Runs[0], "intake")
	if r.Runs[0].OrdersInDB != r.Runs[0].OK || r.Runs[0].Concurrency != 4 {
		t.Fatalf("intake: %d accepted, %d orders in the database", r.Runs[0].OK, r.Runs[0].OrdersInDB)
	}
	// The stack runs in this process; its PostgreSQL is a process of its own.
	if c := r.Runs[0].CPU; runtime.GOOS == "linux" && (c == nil || c.ByGroup[CPULoadGenerator] <= 0 || c.ByGroup[CPUPostgres] <= 0 ||
		c.PerOK["machine"] <= 0 || c.Busy < c.ByGroup[CPULoadGenerator] || !strings.Contains(stdout, "cpu: machine")) {
		t.Fatalf("intake: want the processor time of the load generator and of PostgreSQL, got %+v\n%s", c, stdout)
	}
	if r.Runs[0].DB == nil || r.Runs[0].DB.PerOK == nil || !strings.Contains(stdout, "database: ") {
		t.Fatalf("intake: want the database's activity, got %+v\n%s", r.Runs[0].DB, stdout)
	}

	// Open-loop: 20 orders a second for 2 s are 40 orders, sent on schedule.
	out = filepath.Join(t.TempDir(), "intake-rate")
	if stdout, stderr, err := invoke(t, nil, cfg, s.args("intake", out, "--duration", "2s", "--concurrency", "4", "--rate", "20")...); err != nil {
		t.Fatalf("bench intake --rate 20: %v\n%s\n%s", err, stdout, stderr)
	}
	r = readResult(t, out)
	checkRun(t, r.Runs[0], "intake")
	if r.Settings.Rate != 20 || r.Runs[0].Requests != 40 || r.Runs[0].OK != 40 || r.Runs[0].OrdersInDB != 40 {
		t.Fatalf("intake --rate 20 for 2s: rate %d, %d requests, %d accepted, %d orders in the database; want 40 of each",
			r.Settings.Rate, r.Runs[0].Requests, r.Runs[0].OK, r.Runs[0].OrdersInDB)
	}

	out = filepath.Join(t.TempDir(), "replay")
	if stdout, stderr, err := invoke(t, nil, cfg, s.args("replay", out, "--users", "5", "--requests", "3")...); err != nil {
		t.Fatalf("bench replay: %v\n%s\n%s", err, stdout, stderr)
	}
	r = readResult(t, out)
	checkRun(t, r.Runs[0], "replay")
	rp := r.Runs[0]
	if rp.Requests != 15 || rp.OrdersInDB != 5 || rp.Extra["created"] != 5 || rp.Extra["replayed"] != 10 || rp.Extra["found_by_request_id"] != 5 || len(r.Failures) != 0 {
		t.Fatalf("replay 5×3: %+v", rp)
	}
	if c, p := rp.ByAnswer["created"], rp.ByAnswer["replayed"]; c.Max <= 0 || p.Max <= 0 || c.P50 > c.Max || p.P50 > p.Max || max(c.Max, p.Max) != rp.Latency.Max {
		t.Fatalf("replay 5×3, latency by answer: %+v, all: %+v", rp.ByAnswer, rp.Latency)
	}
	// Each user's requests one after another, on new connections.
	out = filepath.Join(t.TempDir(), "replay-sequential")
	if stdout, stderr, err := invoke(t, nil, cfg, s.args("replay", out, "--users", "4", "--requests", "3", "--burst=false", "--cold")...); err != nil {
		t.Fatalf("bench replay --burst=false --cold: %v\n%s\n%s", err, stdout, stderr)
	}
	r = readResult(t, out)
	checkRun(t, r.Runs[0], "replay")
	rp = r.Runs[0]
	if rp.Requests != 12 || rp.Concurrency != 4 || rp.OrdersInDB != 4 || rp.Extra["created"] != 4 || rp.Extra["replayed"] != 8 || len(r.Failures) != 0 {
		t.Fatalf("replay 4×3, one user's requests after another: %+v", rp)
	}

	out = filepath.Join(t.TempDir(), "baseline")
	if stdout, stderr, err := invoke(t, nil, cfg, s.args("baseline", out, "--duration", "1s", "--concurrency", "4")...); err != nil {
		t.Fatalf("bench baseline: %v\n%s\n%s", err, stdout, stderr)
	}
	r = readResult(t, out)
	checkRun(t, r.Runs[0], "baseline")
	if r.Runs[0].OrdersInDB != r.Runs[0].OK {
		t.Fatalf("baseline: %d committed, %d rows", r.Runs[0].OK, r.Runs[0].OrdersInDB)
	}
	var scratch int
	if err := testenv.Pool(t, s.dbURL).QueryRow(t.Context(), `SELECT count(*) FROM pg_tables WHERE tablename LIKE 'bench%'`).Scan(&scratch); err != nil || scratch != 0 {
		t.Fatalf("baseline left %d scratch tables (%v)", scratch, err)
	}
}

// TestFailuresFailTheCommand: answers outside 2xx make bench exit non-zero,
// with the result still written. A wrong API key answers 401, and 429 once
// the intake limits the address that keeps sending unknown keys.
func TestFailuresFailTheCommand(t *testing.T) {
	s := startStack(t, false)
	s.apiKey = "op_not_a_key"
	out := filepath.Join(t.TempDir(), "intake")
	stdout, _, err := invoke(t, nil, offlineConfig(t), s.args("intake", out, "--duration", "1s", "--concurrency", "2")...)
	if err == nil || !strings.Contains(err.Error(), "requests failed") || !strings.Contains(stdout, "FAILED") {
		t.Fatalf("bench intake with a wrong key: want a failure, got %v\n%s", err, stdout)
	}
	r := readResult(t, out)
	codes := r.Runs[0].StatusCodes
	if r.Runs[0].Non2xx == 0 || codes["401"] == 0 || codes["401"]+codes["429"] != int(r.Runs[0].Requests) || len(r.Failures) == 0 {
		t.Fatalf("result of a failed run: %+v", r)
	}
}

// TestEndToEndAndCompare runs e2e and a one-round compare against the
// intake with the pipeline behind it.
func TestEndToEndAndCompare(t *testing.T) {
	s := startStack(t, true)
	cfg := offlineConfig(t)
	out := filepath.Join(t.TempDir(), "e2e")
	stdout, stderr, err := invoke(t, nil, cfg, s.args("e2e", out, "--duration", "1s", "--concurrency", "2", "--drain", "2m")...)
	if err != nil {
		t.Fatalf("bench e2e: %v\n%s\n%s", err, stdout, stderr)
	}
	r := readResult(t, out)
	e := r.E2E
	if e == nil || e.Accepted == 0 || e.Terminal != e.Accepted || e.Open != 0 || e.CompletionRate <= 0 || e.IntakeRate <= 0 || len(e.Timeline) == 0 {
		t.Fatalf("e2e result: %+v", e)
	}
	if c := e.ToState["confirmed"]; e.ByStatus["confirmed"] != e.Accepted || c.P50 <= 0 || c.P99 < c.P50 || e.ToState["reserved"].P50 > c.P50 {
		t.Fatalf("e2e: want every order confirmed with latencies to each state: %+v", e)
	}

	out = filepath.Join(t.TempDir(), "compare")
	stdout, stderr, err = invoke(t, nil, cfg, s.args("compare", out, "--duration", "1s", "--concurrency", "2", "--rounds", "1")...)
	if err != nil {
		t.Fatalf("bench compare: %v\n%s\n%s", err, stdout, stderr)
	}
	r = readResult(t, out)
	c := r.Compare
	if c == nil || len(r.Runs) != 2 || r.Runs[0].Kind != "baseline" || r.Runs[1].Kind != "intake" || c.BaselineMedian != r.Runs[0].Throughput ||
		c.IntakeMedian != r.Runs[1].Throughput || c.Ratio <= 0 || !strings.Contains(stdout, "ratio") {
		t.Fatalf("compare result: %+v\n%s", r, stdout)
	}
	if b, i := r.Runs[0].CPU, r.Runs[1].CPU; b != nil && i != nil && (c.BaselineMachineUS != b.PerOK["machine"] || c.IntakeMachineUS != i.PerOK["machine"] ||
		c.CostRatio != c.BaselineMachineUS/c.IntakeMachineUS || !strings.Contains(stdout, "cost ratio")) {
		t.Fatalf("compare, machine per answer: %+v\n%s", c, stdout)
	}
}

// Tooling (bench, chaos, the dev and test environments, the stand-in) is
// not product: no part may depend on it.
func TestProductDoesNotImportTooling(t *testing.T) {
	// The parts' packages, but not consumers/pipetest: a test harness that
	// only tests import (the depguard rules exempt it for the same reason).
	list, err := exec.CommandContext(t.Context(), "go", "list", "orderpipe/producer/...", "orderpipe/consumers/...", "orderpipe/compensator/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, list)
	}
	var product []string
	for _, p := range strings.Fields(string(list)) {
		if !strings.HasSuffix(p, "/pipetest") {
			product = append(product, p)
		}
	}
	out, err := exec.CommandContext(t.Context(), "go", append([]string{"list", "-deps"}, product...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	for _, p := range strings.Fields(string(out)) {
		if strings.HasPrefix(p, "orderpipe/shared/tooling") {
			t.Errorf("the product depends on %s", p)
		}
	}
}

// TestReplayCountsRetriesByCause: a replay says why its calls were
// retried. A proxy in front of the intake answers the first create
// requests with 502, 503, 429 and a dropped connection; the client retries
// each, the replay still ends with every order once, and the result counts
// the attempts by what they got (shed load apart from failures).
func TestReplayCountsRetriesByCause(t *testing.T) {
	s := startStack(t, false)
	target, err := url.Parse(s.url)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	// The drop comes first, while every connection is new (--cold).
	faults := []int{0, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusTooManyRequests, http.StatusBadGateway}
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		fault := -1
		if r.Method == http.MethodPost && len(faults) > 0 {
			fault, faults = faults[0], faults[1:]
		}
		mu.Unlock()
		switch fault {
		case -1:
			proxy.ServeHTTP(w, r)
		case 0: // the connection drops before an answer
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				_ = conn.Close()
			}
		default:
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(fault)
		}
	}))
	defer srv.Close()
	s.url = srv.URL

	// --cold: on a connection it reused, net/http sends a request with an
	// Idempotency-Key again by itself when the server drops it, and the
	// client would never see the dropped connection.
	out := filepath.Join(t.TempDir(), "replay")
	stdout, stderr, err := invoke(t, nil, offlineConfig(t), s.args("replay", out, "--users", "3", "--requests", "2", "--cold")...)
	if err != nil {
		t.Fatalf("bench replay: %v\n%s\n%s", err, stdout, stderr)
	}
	r := readResult(t, out)
	checkRun(t, r.Runs[0], "replay")
	x := r.Runs[0].Extra
	if r.Runs[0].OrdersInDB != 3 || x["retries"] != 5 || x[attempts429] != 1 || x[attempts503] != 1 || x[attemptsOther5xx] != 2 || x[attemptsConnError] != 1 || x[attemptsOther] != 0 {
		t.Fatalf("replay through faults: %+v", x)
	}
	if !strings.Contains(stdout, "2 shed (429: 1, 503: 1), 3 failed (other 5xx: 2, other answers: 0, connection errors: 1)") {
		t.Fatalf("summary does not give the causes of the retries:\n%s", stdout)
	}
}

package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"orderpipe/shared/postgres"
)

// Result is what one `orderpipe bench` invocation measured; it is written
// to result.json.
type Result struct {
	Action   string    `json:"action"`
	Settings Settings  `json:"settings"`
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished"`
	// Machine is where the load generator ran.
	Machine Machine `json:"machine"`
	// Runs in the order they ran.
	Runs []Measurement `json:"runs"`
	// Compare summarises compare's rounds; E2E the pipeline's side.
	Compare *Comparison `json:"compare,omitempty"`
	E2E     *E2E        `json:"e2e,omitempty"`
	// Failures lists what makes the run fail (non-2xx, duplicates, a
	// wrong order count); empty when it passed.
	Failures []string `json:"failures"`
}

// Machine describes the load generator's machine.
type Machine struct {
	GOOS      string `json:"goos"`
	GOARCH    string `json:"goarch"`
	NumCPU    int    `json:"num_cpu"`
	GoVersion string `json:"go_version"`
}

// Comparison is compare's summary: medians over the rounds.
type Comparison struct {
	Rounds int `json:"rounds"`
	// BaselineMedian and IntakeMedian are the medians of the rounds'
	// throughput (per second); Ratio is intake / baseline.
	BaselineMedian float64 `json:"baseline_median_per_s"`
	IntakeMedian   float64 `json:"intake_median_per_s"`
	Ratio          float64 `json:"ratio"`
	// Medians over the rounds of each run's latency percentiles, ms.
	BaselineP50 float64 `json:"baseline_p50_ms"`
	BaselineP99 float64 `json:"baseline_p99_ms"`
	IntakeP50   float64 `json:"intake_p50_ms"`
	IntakeP99   float64 `json:"intake_p99_ms"`
	// BaselineMachineUS and IntakeMachineUS are the medians over the
	// rounds of the whole machine's processor time per answer, in µs
	// (Linux; 0 elsewhere). CostRatio is baseline / intake: the ratio the
	// intake would reach if both kept the machine equally busy. It moves
	// less from run to run than Ratio, which also follows how busy each
	// kept the machine.
	BaselineMachineUS float64 `json:"baseline_machine_us_per_ok,omitempty"`
	IntakeMachineUS   float64 `json:"intake_machine_us_per_ok,omitempty"`
	CostRatio         float64 `json:"cost_ratio,omitempty"`
}

// Run runs the action of s against the stack, prints progress to progress
// and the summary to out, writes result.json and chart.html to s.Out, and
// fails when any request failed or any order was duplicated.
func Run(ctx context.Context, s Settings, out, progress io.Writer) error {
	res := &Result{Action: s.Action, Settings: s, Started: time.Now().UTC(), Failures: []string{},
		Machine: Machine{GOOS: runtime.GOOS, GOARCH: runtime.GOARCH, NumCPU: runtime.NumCPU(), GoVersion: runtime.Version()}}
	if err := os.MkdirAll(s.Out, 0o755); err != nil {
		return fmt.Errorf("create the output folder: %w", err)
	}
	var pool *pgxpool.Pool
	if s.DatabaseURL != "" {
		var err error
		if pool, err = postgres.Open(ctx, s.DatabaseURL); err != nil {
			return err
		}
		defer pool.Close()
	}
	fmt.Fprintf(progress, "bench %s against %s (results in %s)\n", s.Action, target(s), s.Out)
	runErr := run(ctx, s, pool, res, progress)
	res.Finished = time.Now().UTC()
	for _, r := range res.Runs {
		res.Failures = append(res.Failures, r.failures()...)
	}
	if res.E2E != nil && res.E2E.Open > 0 {
		res.Failures = append(res.Failures, fmt.Sprintf("e2e: %d of %d accepted orders not terminal after %s", res.E2E.Open, res.E2E.Accepted, s.Drain))
	}
	printSummary(out, res)
	if err := writeResult(s.Out, res); err != nil {
		return errors.Join(runErr, err)
	}
	fmt.Fprintf(out, "\nresult: %s\nchart:  %s\n", filepath.Join(s.Out, "result.json"), filepath.Join(s.Out, "chart.html"))
	if runErr != nil {
		return runErr
	}
	if len(res.Failures) > 0 {
		return fmt.Errorf("bench %s failed: %d problem(s), first: %s", s.Action, len(res.Failures), res.Failures[0])
	}
	return nil
}

func target(s Settings) string {
	if s.Action == "baseline" {
		return "the stack's PostgreSQL"
	}
	return s.URL
}

func run(ctx context.Context, s Settings, pool *pgxpool.Pool, res *Result, progress io.Writer) error {
	switch s.Action {
	case "intake":
		r, _, err := runIntake(ctx, s, pool, progress, 0)
		res.Runs = append(res.Runs, r)
		return err
	case "replay":
		r, err := runReplay(ctx, s, pool, progress)
		res.Runs = append(res.Runs, r)
		return err
	case "baseline":
		r, err := runBaseline(ctx, s, progress, 0)
		res.Runs = append(res.Runs, r)
		return err
	case "e2e":
		r, e, err := runE2E(ctx, s, pool, progress)
		res.Runs, res.E2E = append(res.Runs, r), e
		return err
	case "compare":
		return runCompare(ctx, s, pool, res, progress)
	}
	return fmt.Errorf("unknown bench action %q", s.Action)
}

// runCompare alternates baseline and intake runs, s.Rounds of each, and
// summarises their medians. With s.Settle, each round starts only once the
// orders of the earlier intake rounds are terminal (or s.Drain passed).
func runCompare(ctx context.Context, s Settings, pool *pgxpool.Pool, res *Result, progress io.Writer) error {
	var ids []string
	settle := func() error {
		if !s.Settle || len(ids) == 0 {
			return nil
		}
		open, took, err := waitTerminal(ctx, pool, ids, s.Drain, progress)
		if err != nil {
			return err
		}
		fmt.Fprintf(progress, "settled  %d orders terminal in %s (%d still open)\n", int64(len(ids))-open, took.Round(time.Millisecond), open)
		return nil
	}
	var base, intake, bp50, bp99, ip50, ip99, bcpu, icpu []float64
	machine := func(m Measurement) []float64 {
		if m.CPU == nil || m.CPU.PerOK["machine"] <= 0 {
			return nil
		}
		return []float64{m.CPU.PerOK["machine"]}
	}
	for round := 1; round <= s.Rounds; round++ {
		if err := settle(); err != nil {
			return err
		}
		b, err := runBaseline(ctx, s, progress, round)
		res.Runs = append(res.Runs, b)
		if err != nil {
			return err
		}
		base, bp50, bp99 = append(base, b.Throughput), append(bp50, b.Latency.P50), append(bp99, b.Latency.P99)
		bcpu = append(bcpu, machine(b)...)
		if err := settle(); err != nil {
			return err
		}
		r, orders, err := runIntake(ctx, s, pool, progress, round)
		res.Runs = append(res.Runs, r)
		if err != nil {
			return err
		}
		for _, o := range orders {
			ids = append(ids, o.orderID)
		}
		intake, ip50, ip99 = append(intake, r.Throughput), append(ip50, r.Latency.P50), append(ip99, r.Latency.P99)
		icpu = append(icpu, machine(r)...)
		fmt.Fprintf(progress, "round %d of %d: baseline %.0f/s, intake %.0f/s (%.3f×)\n", round, s.Rounds, b.Throughput, r.Throughput, ratio(r.Throughput, b.Throughput))
	}
	c := &Comparison{Rounds: s.Rounds, BaselineMedian: median(base), IntakeMedian: median(intake),
		BaselineP50: median(bp50), BaselineP99: median(bp99), IntakeP50: median(ip50), IntakeP99: median(ip99)}
	c.Ratio = ratio(c.IntakeMedian, c.BaselineMedian)
	if len(bcpu) == s.Rounds && len(icpu) == s.Rounds {
		c.BaselineMachineUS, c.IntakeMachineUS = median(bcpu), median(icpu)
		c.CostRatio = ratio(c.BaselineMachineUS, c.IntakeMachineUS)
	}
	res.Compare = c
	return nil
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// failures says what is wrong with a run: every request must succeed and
// no order may exist twice; replay must leave exactly one order per user.
func (r Measurement) failures() []string {
	var out []string
	name := r.Kind
	if r.Round > 0 {
		name = fmt.Sprintf("%s round %d", r.Kind, r.Round)
	}
	if r.Requests == 0 {
		out = append(out, name+": no request was sent")
	}
	if r.Non2xx > 0 {
		out = append(out, fmt.Sprintf("%s: %d of %d requests failed (status codes %v; e.g. %v)", name, r.Non2xx, r.Requests, r.StatusCodes, r.Errors))
	}
	if r.Duplicates > 0 {
		out = append(out, fmt.Sprintf("%s: %d duplicate orders", name, r.Duplicates))
	}
	switch {
	case r.Kind == "replay" && r.OrdersInDB >= 0 && r.OrdersInDB != r.Extra["users"]:
		out = append(out, fmt.Sprintf("%s: %d orders in the database for %d users, want exactly %d", name, r.OrdersInDB, r.Extra["users"], r.Extra["users"]))
	case r.Kind == "replay" && r.Extra["found_by_request_id"] != r.Extra["users"]:
		out = append(out, fmt.Sprintf("%s: GET /v1/orders?request_id= found %d orders for %d users", name, r.Extra["found_by_request_id"], r.Extra["users"]))
	case r.Kind == "baseline" && r.OrdersInDB >= 0 && r.OrdersInDB != r.OK:
		out = append(out, fmt.Sprintf("%s: %d inserts committed but %d rows in the table", name, r.OK, r.OrdersInDB))
	}
	return out
}

func printSummary(w io.Writer, res *Result) {
	fmt.Fprintf(w, "\n%-18s %9s %9s %8s %5s %9s %8s %8s %8s %8s\n", "run", "requests", "ok/s", "non-2xx", "dups", "mean ms", "p50 ms", "p95 ms", "p99 ms", "max ms")
	for _, r := range res.Runs {
		name := r.Kind
		if r.Round > 0 {
			name = fmt.Sprintf("%s #%d", r.Kind, r.Round)
		}
		fmt.Fprintf(w, "%-18s %9d %9.1f %8d %5d %9.2f %8.2f %8.2f %8.2f %8.2f\n", name, r.Requests, r.Throughput, r.Non2xx, r.Duplicates,
			r.Latency.Mean, r.Latency.P50, r.Latency.P95, r.Latency.P99, r.Latency.Max)
		if r.CPU != nil {
			fmt.Fprintf(w, "  %s\n", r.CPU)
		}
		if r.DB != nil {
			fmt.Fprintf(w, "  %s\n", r.DB)
			for _, l := range r.DB.StatementLines() {
				fmt.Fprintf(w, "  %s\n", l)
			}
		}
		if r.Kind == "replay" {
			fmt.Fprintf(w, "  replay: %d users × %d requests: %d created, %d replayed, %d retries; %d found by request_id; orders in the database: %s\n",
				r.Extra["users"], r.Extra["requests_per_user"], r.Extra["created"], r.Extra["replayed"], r.Extra["retries"], r.Extra["found_by_request_id"], dbCount(r.OrdersInDB))
			fmt.Fprintf(w, "  attempts without a 2xx: %d shed (429: %d, 503: %d), %d failed (other 5xx: %d, other answers: %d, connection errors: %d)\n",
				r.Extra[attempts429]+r.Extra[attempts503], r.Extra[attempts429], r.Extra[attempts503],
				r.Extra[attemptsOther5xx]+r.Extra[attemptsOther]+r.Extra[attemptsConnError], r.Extra[attemptsOther5xx], r.Extra[attemptsOther], r.Extra[attemptsConnError])
			for _, a := range []string{"created", "replayed"} {
				if l, ok := r.ByAnswer[a]; ok {
					fmt.Fprintf(w, "  answered %-8s p50 %8.2f ms  p95 %8.2f ms  p99 %8.2f ms  max %8.2f ms\n", a, l.P50, l.P95, l.P99, l.Max)
				}
			}
		}
	}
	if c := res.Compare; c != nil {
		fmt.Fprintf(w, "\ncompare, medians of %d rounds: baseline %.1f inserts/s (p50 %.2f ms, p99 %.2f ms), intake %.1f orders/s (p50 %.2f ms, p99 %.2f ms): ratio %.3f×\n",
			c.Rounds, c.BaselineMedian, c.BaselineP50, c.BaselineP99, c.IntakeMedian, c.IntakeP50, c.IntakeP99, c.Ratio)
		if c.CostRatio > 0 {
			fmt.Fprintf(w, "machine per answer, medians: baseline %.0f µs, intake %.0f µs: cost ratio %.3f× (the ratio with the machine equally busy for both)\n",
				c.BaselineMachineUS, c.IntakeMachineUS, c.CostRatio)
		}
	}
	if e := res.E2E; e != nil {
		fmt.Fprintf(w, "\ne2e: %d accepted at %.1f/s; %d terminal %v, %d open; completion %.1f orders/s end to end; %d open when the load stopped, drained in %.1fs\n",
			e.Accepted, e.IntakeRate, e.Terminal, e.ByStatus, e.Open, e.CompletionRate, e.OpenAtLoadEnd, e.DrainSeconds)
		for _, st := range []string{"reserved", "paid", "confirmed", "rejected", "cancelled"} {
			if l, ok := e.ToState[st]; ok {
				fmt.Fprintf(w, "  accepted → %-9s p50 %8.1f ms  p95 %8.1f ms  p99 %8.1f ms  max %8.1f ms\n", st, l.P50, l.P95, l.P99, l.Max)
			}
		}
	}
	if len(res.Failures) > 0 {
		fmt.Fprintln(w, "\nFAILED:")
		for _, f := range res.Failures {
			fmt.Fprintln(w, "  "+f)
		}
	}
}

func dbCount(n int64) string {
	if n < 0 {
		return "not checked (no database URL)"
	}
	return fmt.Sprint(n)
}

func writeResult(dir string, res *Result) error {
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return fmt.Errorf("encode the result: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "result.json"), append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write the result: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "chart.html"), chartHTML(res), 0o644); err != nil {
		return fmt.Errorf("write the chart: %w", err)
	}
	return nil
}

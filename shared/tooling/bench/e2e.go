package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"sort"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	vegeta "github.com/tsenart/vegeta/v12/lib"
)

// E2E is what happened to the orders an intake run got accepted, read from
// the database's order_events afterwards. Times are the database's: an
// order is accepted when its first event (processing) is written.
type E2E struct {
	// Accepted orders (202) during the load.
	Accepted int64 `json:"accepted"`
	// Terminal of them reached a final state within the drain bound;
	// ByStatus splits them; Open never did.
	Terminal int64            `json:"terminal"`
	ByStatus map[string]int64 `json:"by_status"`
	Open     int64            `json:"open"`
	// IntakeRate is accepted orders per second of the load.
	IntakeRate float64 `json:"intake_rate_per_s"`
	// CompletionRate is terminal orders per second, from the first
	// acceptance to the last terminal event.
	CompletionRate float64 `json:"completion_rate_per_s"`
	// OpenAtLoadEnd is how many accepted orders were not terminal when
	// the load stopped; DrainSeconds how long they took to finish after.
	OpenAtLoadEnd int64   `json:"open_at_load_end"`
	DrainSeconds  float64 `json:"drain_seconds"`
	// ToState is the latency from acceptance to each state, milliseconds.
	ToState map[string]Latency `json:"to_state_ms"`
	// Timeline counts acceptances and terminal events per second since
	// the first acceptance.
	Timeline []E2ESecond `json:"timeline"`
}

// E2ESecond is one second of the pipeline's life during an e2e run.
type E2ESecond struct {
	T        int   `json:"t"`
	Accepted int64 `json:"accepted"`
	Terminal int64 `json:"terminal"`
}

var terminal = []string{"confirmed", "rejected", "cancelled"}

// countTerminal counts the orders among ids in a terminal state.
func countTerminal(ctx context.Context, pool *pgxpool.Pool, ids []string) (int64, error) {
	var n int64
	err := pool.QueryRow(ctx, `SELECT count(*) FROM orders WHERE order_id = ANY($1::uuid[]) AND status = ANY($2)`, ids, terminal).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count terminal orders: %w", err)
	}
	return n, nil
}

// waitTerminal polls until every order in ids is terminal or bound
// passed, printing progress each second. It reports how many stayed open.
func waitTerminal(ctx context.Context, pool *pgxpool.Pool, ids []string, bound time.Duration, progress io.Writer) (open int64, took time.Duration, err error) {
	t0 := time.Now()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	lastPrint := t0
	for {
		done, err := countTerminal(ctx, pool, ids)
		if err != nil {
			return 0, 0, err
		}
		open = int64(len(ids)) - done
		if open == 0 || time.Since(t0) > bound {
			return open, time.Since(t0), nil
		}
		if time.Since(lastPrint) >= time.Second {
			lastPrint = time.Now()
			fmt.Fprintf(progress, "drain    %4ds  %7d of %d orders terminal\n", int(time.Since(t0).Seconds()), done, len(ids))
		}
		select {
		case <-ctx.Done():
			return open, time.Since(t0), ctx.Err()
		case <-tick.C:
		}
	}
}

// runE2E loads the intake like runIntake, then waits until the accepted
// orders are terminal and reads their history.
func runE2E(ctx context.Context, s Settings, pool *pgxpool.Pool, progress io.Writer) (Measurement, *E2E, error) {
	run, orders, err := runIntake(ctx, s, pool, progress, 0)
	if err != nil {
		return run, nil, err
	}
	e := &E2E{Accepted: int64(len(orders)), ByStatus: map[string]int64{}, ToState: map[string]Latency{}}
	if len(orders) == 0 {
		return run, e, nil
	}
	ids := make([]string, len(orders))
	for i, o := range orders {
		ids[i] = o.orderID
	}
	done, err := countTerminal(ctx, pool, ids)
	if err != nil {
		return run, e, err
	}
	e.OpenAtLoadEnd = e.Accepted - done
	open, took, err := waitTerminal(ctx, pool, ids, s.Drain, progress)
	if err != nil {
		return run, e, err
	}
	e.Open, e.DrainSeconds = open, took.Seconds()

	rows, err := pool.Query(ctx, `
		SELECT e.status, e.occurred_at, p.occurred_at
		FROM order_events e JOIN order_events p ON p.order_id = e.order_id AND p.seq = 1
		WHERE e.order_id = ANY($1::uuid[])`, ids)
	if err != nil {
		return run, e, fmt.Errorf("read the orders' events: %w", err)
	}
	type event struct {
		status   string
		at, from time.Time
	}
	var events []event
	for rows.Next() {
		var ev event
		if err := rows.Scan(&ev.status, &ev.at, &ev.from); err != nil {
			rows.Close()
			return run, e, fmt.Errorf("read the orders' events: %w", err)
		}
		events = append(events, ev)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return run, e, fmt.Errorf("read the orders' events: %w", err)
	}
	var firstAccept, lastTerminal time.Time
	for _, ev := range events {
		if ev.status == "processing" && (firstAccept.IsZero() || ev.at.Before(firstAccept)) {
			firstAccept = ev.at
		}
	}
	lat := map[string]*vegeta.LatencyMetrics{}
	count := map[string]int64{}
	perSec := map[int]*E2ESecond{}
	sec := func(at time.Time) *E2ESecond {
		i := max(int(at.Sub(firstAccept)/time.Second), 0)
		if perSec[i] == nil {
			perSec[i] = &E2ESecond{T: i}
		}
		return perSec[i]
	}
	for _, ev := range events {
		if ev.status == "processing" {
			sec(ev.at).Accepted++
			continue
		}
		if lat[ev.status] == nil {
			lat[ev.status] = &vegeta.LatencyMetrics{}
		}
		lat[ev.status].Add(ev.at.Sub(ev.from))
		count[ev.status]++
		if isTerminal(ev.status) {
			e.Terminal++
			e.ByStatus[ev.status]++
			sec(ev.at).Terminal++
			if ev.at.After(lastTerminal) {
				lastTerminal = ev.at
			}
		}
	}
	for st, l := range lat {
		e.ToState[st] = summarize(l, count[st])
	}
	if span := lastTerminal.Sub(firstAccept).Seconds(); span > 0 {
		e.CompletionRate = float64(e.Terminal) / span
	}
	if run.Seconds > 0 {
		e.IntakeRate = float64(e.Accepted) / run.Seconds
	}
	keys := make([]int, 0, len(perSec))
	for k := range perSec {
		keys = append(keys, k)
	}
	sort.Ints(keys)
	if len(keys) > 0 {
		for i := 0; i <= keys[len(keys)-1]; i++ {
			if s := perSec[i]; s != nil {
				e.Timeline = append(e.Timeline, *s)
			} else {
				e.Timeline = append(e.Timeline, E2ESecond{T: i})
			}
		}
	}
	e.CompletionRate = math.Round(e.CompletionRate*100) / 100
	return run, e, nil
}

func isTerminal(status string) bool {
	for _, t := range terminal {
		if t == status {
			return true
		}
	}
	return false
}

package bench

import (
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	vegeta "github.com/tsenart/vegeta/v12/lib"
)

// Measurement is one measured run: a stretch of closed-loop load of one kind.
type Measurement struct {
	// Kind is intake, replay or baseline.
	Kind string `json:"kind"`
	// Round numbers compare's rounds from 1 (0 outside compare).
	Round int `json:"round,omitempty"`
	// Concurrency is the number of clients that ran at once.
	Concurrency int `json:"concurrency"`
	// Requests sent; OK of them answered 2xx (for baseline: committed).
	Requests int64 `json:"requests"`
	OK       int64 `json:"ok"`
	// Non2xx counts answers outside 2xx and transport errors.
	Non2xx int64 `json:"non_2xx"`
	// Duplicates counts orders that exist more than once for one
	// request_id, or a request_id that a unique request was answered
	// as a replay of. Anything but 0 is a failure.
	Duplicates int64 `json:"duplicates"`
	// StatusCodes counts the answers by HTTP status ("0": no answer).
	StatusCodes map[string]int `json:"status_codes"`
	// Errors holds up to ten distinct error texts.
	Errors []string `json:"errors,omitempty"`
	// Seconds is the wall time from the first request to the last answer.
	Seconds float64 `json:"seconds"`
	// Throughput is OK per second of that wall time.
	Throughput float64 `json:"throughput_per_s"`
	// Latency of every request (ok or not), in milliseconds.
	Latency Latency `json:"latency_ms"`
	// ByAnswer splits Latency by answer, for a replay: "created" (202,
	// the call that wrote a user's order) and "replayed" (200).
	ByAnswer map[string]Latency `json:"latency_by_answer_ms,omitempty"`
	// Timeline has one entry per second of the run.
	Timeline []Second `json:"timeline"`
	// OrdersInDB is how many orders the run's request_ids have in the
	// database afterwards (-1: not checked).
	OrdersInDB int64 `json:"orders_in_db"`
	// Extra holds per-kind facts (replay: users, created, replayed).
	Extra map[string]int64 `json:"extra,omitempty"`
	// CPU is the machine's processor time during the run, by process
	// group (Linux only).
	CPU *CPU `json:"cpu,omitempty"`
	// DB is what the stack's database did during the run (with a
	// database URL).
	DB *DBActivity `json:"database,omitempty"`
}

// Latency is a summary of latencies in milliseconds.
type Latency struct {
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P95  float64 `json:"p95"`
	P99  float64 `json:"p99"`
	Max  float64 `json:"max"`
}

// Second is one second of a run, by the time the answers arrived.
type Second struct {
	// T is the second since the run began (0 = the first).
	T int `json:"t"`
	// OK is the number of 2xx answers in that second; Failed the others.
	OK     int64 `json:"ok"`
	Failed int64 `json:"failed"`
	// P50 and P99 latency of the answers in that second, milliseconds.
	P50 float64 `json:"p50_ms"`
	P99 float64 `json:"p99_ms"`
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func summarize(l *vegeta.LatencyMetrics, n int64) Latency {
	if n == 0 {
		return Latency{}
	}
	return Latency{
		Mean: ms(time.Duration(float64(l.Total) / float64(n))),
		P50:  quantile(l, n, 0.50), P95: quantile(l, n, 0.95), P99: quantile(l, n, 0.99), Max: ms(l.Max),
	}
}

// quantile is l's q-quantile in milliseconds, 0 when it holds none (the
// estimator answers NaN then, which JSON cannot carry).
func quantile(l *vegeta.LatencyMetrics, n int64, q float64) float64 {
	if n == 0 {
		return 0
	}
	return ms(l.Quantile(q))
}

type second struct {
	ok, failed int64
	lat        vegeta.LatencyMetrics
}

// collector summarises one run. newCollector takes the first readings of
// the machine's processor time and (with a pool) of the database's
// counters; a run takes them before it starts its load, so that reading
// every process of /proc and querying PostgreSQL does not share the
// load's first moments (a replay's burst is over in a few hundred
// milliseconds, and its first hundred calls are its slowest).
type collector struct {
	kind        string
	concurrency int
	pool        *pgxpool.Pool
	cpu0        cpuReading
	haveCPU     bool
	db0         dbReading
	haveDB      bool
	began       time.Time
}

func newCollector(kind string, concurrency int, pool *pgxpool.Pool) *collector {
	c := &collector{kind: kind, concurrency: concurrency, pool: pool}
	c.cpu0, c.haveCPU = readCPU()
	c.db0, c.haveDB = readDB(pool)
	c.began = time.Now()
	return c
}

// collect reads results until the channel closes, printing a progress
// line per second to progress, and summarises them, with the machine's
// processor time and (with a pool) the database's activity since
// newCollector. each, when set, sees every result first (on the
// collecting goroutine).
func (c *collector) collect(results <-chan *vegeta.Result, progress io.Writer, each func(*vegeta.Result)) Measurement {
	kind, began := c.kind, c.began
	r := Measurement{Kind: kind, Concurrency: c.concurrency, StatusCodes: map[string]int{}, OrdersInDB: -1}
	var (
		lat          vegeta.LatencyMetrics
		secs         []*second
		first, last  time.Time
		errs         = map[string]bool{}
		ticker       = time.NewTicker(time.Second)
		printed      = 0
		printSeconds = func(upTo int) {
			for ; printed < upTo && printed < len(secs); printed++ {
				s := secs[printed]
				if s == nil {
					s = &second{}
				}
				fmt.Fprintf(progress, "%-8s %4ds  %7d ok/s  %5d failed  p50 %7.2fms  p99 %7.2fms\n",
					kind, printed+1, s.ok, s.failed, quantile(&s.lat, s.ok+s.failed, 0.5), quantile(&s.lat, s.ok+s.failed, 0.99))
			}
		}
	)
	defer ticker.Stop()
	for {
		select {
		case <-ticker.C:
			printSeconds(int(time.Since(began) / time.Second))
			continue
		case res, open := <-results:
			if !open {
				printSeconds(len(secs))
				goto done
			}
			if each != nil {
				each(res)
			}
			r.Requests++
			r.StatusCodes[fmt.Sprint(res.Code)]++
			lat.Add(res.Latency)
			if first.IsZero() || res.Timestamp.Before(first) {
				first = res.Timestamp
			}
			end := res.End()
			if end.After(last) {
				last = end
			}
			i := max(int(end.Sub(began)/time.Second), 0)
			for len(secs) <= i {
				secs = append(secs, &second{})
			}
			s := secs[i]
			if res.Code >= 200 && res.Code < 300 && res.Error == "" {
				r.OK++
				s.ok++
			} else {
				r.Non2xx++
				s.failed++
				msg := res.Error
				if msg == "" {
					msg = fmt.Sprintf("HTTP %d", res.Code)
				}
				if !errs[msg] && len(errs) < 10 {
					errs[msg] = true
					r.Errors = append(r.Errors, msg)
				}
			}
			s.lat.Add(res.Latency)
		}
	}
done:
	if cpu1, ok := readCPU(); c.haveCPU && ok {
		r.CPU = since(c.cpu0, cpu1, time.Since(began).Seconds(), r.OK)
	}
	if db1, ok := readDB(c.pool); c.haveDB && ok {
		r.DB = activity(c.db0, db1, r.OK)
	}
	if r.Requests > 0 {
		r.Seconds = last.Sub(first).Seconds()
		if r.Seconds > 0 {
			r.Throughput = float64(r.OK) / r.Seconds
		}
	}
	r.Latency = summarize(&lat, r.Requests)
	for i, s := range secs {
		r.Timeline = append(r.Timeline, Second{T: i, OK: s.ok, Failed: s.failed, P50: quantile(&s.lat, s.ok+s.failed, 0.5), P99: quantile(&s.lat, s.ok+s.failed, 0.99)})
	}
	return r
}

// median of xs (0 for none).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

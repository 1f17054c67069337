package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"orderpipe/shared/app"
)

// fault is one injected fault.
type fault struct {
	At     time.Time
	Kind   string
	Detail string
}

// faultLog records the faults, for the report and to explain a broken
// order.
type faultLog struct {
	mu     sync.Mutex
	faults []fault
}

func (l *faultLog) add(kind, format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.faults = append(l.faults, fault{At: time.Now(), Kind: kind, Detail: fmt.Sprintf(format, args...)})
}

// isFault reports whether a log entry of kind is an injected fault, not a
// fault drawn but not injected or a restart that failed.
func isFault(kind string) bool { return kind != notInjected && kind != restartFailed }

// injected counts the faults injected.
func (l *faultLog) injected() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, f := range l.faults {
		if isFault(f.Kind) {
			n++
		}
	}
	return n
}

// counts counts the log's entries by kind (injected faults, and the
// entries isFault tells apart).
func (l *faultLog) counts() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := map[string]int{}
	for _, f := range l.faults {
		m[f.Kind]++
	}
	return m
}

func (l *faultLog) between(from, to time.Time) []fault {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []fault
	for _, f := range l.faults {
		if !f.At.Before(from) && !f.At.After(to) {
			out = append(out, f)
		}
	}
	return out
}

// scheduler injects faults at random, from the seed: the same seed makes
// the same sequence of choices (what the system does in between is not
// deterministic, so the run is a replay of the schedule, not of the
// interleaving). Every random value comes from next, which reads nothing
// of the stack; inject, which looks at the stack's state, draws nothing.
type scheduler struct {
	s   *stack
	rng *rand.Rand
	// parts and nodes are how many processes kill -9 and NATS node stops
	// choose from: fixed for a run.
	parts, nodes int
	// pending restarts: a killed part comes back after a while.
	wg sync.WaitGroup
	// one NATS node down at most (R3 keeps a quorum), and the stream is
	// deleted at most twice a run.
	natsDown  bool
	deletions int
	mu        sync.Mutex
}

func newScheduler(s *stack, seed uint64) *scheduler {
	return &scheduler{s: s, rng: rand.New(rand.NewPCG(seed, 1)), parts: len(s.parts()), nodes: len(s.nodes)}
}

// parts are the processes kill -9 chooses from.
func (s *stack) parts() []*proc {
	return append(append(append([]*proc{}, s.producers...), s.consumers...), s.comp, s.psp)
}

func (sc *scheduler) dur(min, max time.Duration) time.Duration {
	return min + time.Duration(sc.rng.Int64N(int64(max-min)+1))
}

// kinds and their weights.
var faultKinds = []struct {
	name   string
	weight int
}{
	{"kill -9 part", 6},
	{"nats node stop", 3},
	{"stream deleted", 1},
	{"postgres restart", 1},
	{"provider faults", 3},
	{"duplicate deliveries", 3},
	{"forced compensator pass", 2},
	{"dead-letter replay", 2},
	{"network", 3},
}

func (sc *scheduler) pick() string {
	total := 0
	for _, k := range faultKinds {
		total += k.weight
	}
	n := sc.rng.IntN(total)
	for _, k := range faultKinds {
		if n < k.weight {
			return k.name
		}
		n -= k.weight
	}
	return faultKinds[0].name
}

// draw is one fault of the schedule: the wait before it, its kind, and
// every random value its injection uses.
type draw struct {
	wait time.Duration
	kind string
	// kill -9 part: which (an index of stack.parts); nats node stop: which
	// node, or the stream's leader, and whether by kill -9.
	part, node   int
	leader, hard bool
	// back: when a stopped part or node comes back, or the provider heals.
	back time.Duration
	// duplicate deliveries: how many events.
	events int
	// network: the added latency and the share of connections cut.
	latency     time.Duration
	cutPermille int64
}

// next draws the next fault of the schedule. It reads nothing of the
// stack: the same seed draws the same schedule, whatever the run did.
func (sc *scheduler) next() draw {
	d := draw{wait: sc.dur(500*time.Millisecond, 3*time.Second), kind: sc.pick()}
	switch d.kind {
	case "kill -9 part":
		d.part = sc.rng.IntN(sc.parts)
		d.back = sc.dur(300*time.Millisecond, 3*time.Second)
	case "nats node stop":
		d.node = sc.rng.IntN(sc.nodes)
		d.leader = sc.rng.IntN(2) == 0
		d.hard = sc.rng.IntN(2) == 0
		d.back = sc.dur(2*time.Second, 8*time.Second)
	case "provider faults":
		d.back = sc.dur(2*time.Second, 8*time.Second)
	case "duplicate deliveries":
		d.events = 5 + sc.rng.IntN(30)
	case "network":
		d.latency = sc.dur(0, 300*time.Millisecond)
		d.cutPermille = int64(sc.rng.IntN(200))
	}
	return d
}

// run injects faults until ctx ends, then waits for the pending restarts.
func (sc *scheduler) run(ctx context.Context) {
	for {
		d := sc.next()
		select {
		case <-ctx.Done():
			sc.wg.Wait()
			return
		case <-time.After(d.wait):
		}
		sc.inject(ctx, d)
	}
}

// later runs f after d (or at once when ctx ends), tracked by wg.
func (sc *scheduler) later(ctx context.Context, d time.Duration, f func()) {
	sc.wg.Add(1)
	go func() {
		defer sc.wg.Done()
		select {
		case <-time.After(d):
		case <-ctx.Done():
		}
		f()
	}()
}

// restart starts a process again the way a supervisor would (compose's
// restart: unless-stopped): a start that fails — a part that exits because
// PostgreSQL is restarting at that moment — is logged and tried again a
// second later, up to maxRestarts times.
func (sc *scheduler) restart(ctx context.Context, p *proc) {
	for try := 1; ; try++ {
		err := p.start(ctx)
		if err == nil {
			return
		}
		sc.s.log.add(restartFailed, "%s (try %d of %d): %v", p.name, try, maxRestarts, err)
		if try == maxRestarts || !p.exited() || !app.Sleep(ctx, time.Second) {
			return // a process that runs but is slow to get ready is left to itself
		}
		p.mu.Lock()
		p.cmd = nil // it exited: start it afresh
		p.mu.Unlock()
	}
}

// notInjected is the log's kind for a drawn fault that did not happen (the
// part was down already, the broker refused the deletion, …): the table of
// faults counts only what was done.
const notInjected = "not injected"

// restartFailed is the log's kind for a restart of a part that failed: the
// run's own trouble, not an injected fault.
const restartFailed = "restart failed"

// maxRestarts bounds the tries of one restart.
const maxRestarts = 10

// inject injects the drawn fault d, or logs why it did not (notInjected).
// It draws nothing: every random value is d's.
func (sc *scheduler) inject(ctx context.Context, d draw) {
	s := sc.s
	bg := context.WithoutCancel(ctx)
	kind := d.kind
	switch kind {
	case "kill -9 part":
		p, back := s.parts()[d.part], d.back
		if !p.running() {
			s.log.add(notInjected, "%s: %s is not running", kind, p.name)
			return
		}
		p.kill()
		s.log.add(kind, "%s killed with SIGKILL; back in %s", p.name, back.Round(time.Millisecond))
		sc.later(ctx, back, func() { sc.restart(bg, p) })
	case "nats node stop":
		i, leader, hard, back := d.node, d.leader, d.hard, d.back
		sc.mu.Lock()
		if sc.natsDown {
			sc.mu.Unlock()
			s.log.add(notInjected, "%s: a node is down already", kind)
			return
		}
		sc.natsDown = true
		sc.mu.Unlock()
		if leader {
			if l := sc.streamLeader(ctx); l >= 0 {
				i = l
			} else {
				leader = false
			}
		}
		n := s.nodes[i]
		if hard {
			n.kill()
		} else {
			n.stop(10 * time.Second)
		}
		s.log.add(kind, "%s stopped (leader of ORDERS: %v, kill -9: %v); back in %s", n.name, leader, hard, back.Round(time.Millisecond))
		sc.later(ctx, back, func() {
			sc.restart(bg, n)
			sc.mu.Lock()
			sc.natsDown = false
			sc.mu.Unlock()
		})
	case "stream deleted":
		if sc.deletions >= 2 {
			s.log.add(notInjected, "%s: twice already", kind)
			return
		}
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := s.js.DeleteStream(dctx, "ORDERS")
		cancel()
		if err != nil {
			s.log.add(notInjected, "%s: %v", kind, err)
			return
		}
		sc.deletions++
		s.log.add(kind, "ORDERS deleted")
	case "postgres restart":
		// A restart that fails may have stopped the server all the same:
		// it counts, with its error.
		err := s.pg.Restart(bg)
		s.log.add(kind, "PostgreSQL restarted (%v)", err)
	case "provider faults":
		back := d.back
		s.psp.kill()
		s.setProvider(true)
		err := s.psp.start(bg)
		s.log.add(kind, "provider: 400ms latency, 20%% 5xx, 10%% charged-then-no-answer, 10%% declines for %s (%v)", back.Round(time.Millisecond), err)
		sc.later(ctx, back, func() {
			s.psp.kill()
			s.setProvider(false)
			_ = s.psp.start(bg)
		})
	case "duplicate deliveries":
		n := d.events
		tag, err := s.pool.Exec(bg, `
			INSERT INTO outbox (msg_id, event, payload, headers, order_id)
			SELECT msg_id || ':dup' || id, event, payload, headers, order_id FROM outbox
			WHERE published_at IS NOT NULL AND msg_id NOT LIKE '%:dup%'
			ORDER BY id DESC LIMIT $1`, n)
		if err != nil || tag.RowsAffected() == 0 {
			s.log.add(notInjected, "%s: %d rows (%v)", kind, tag.RowsAffected(), err)
			return
		}
		s.log.add(kind, "%d published events put back in the outbox under new message ids", tag.RowsAffected())
	case "forced compensator pass":
		sc.wg.Add(1)
		go func() {
			defer sc.wg.Done()
			out, err := s.runOnce(bg, time.Minute, "compensator", "--once", "--force", "--stuck-after", "3s", "--max-attempts", "1")
			s.log.add(kind, "compensator --once --force --stuck-after 3s --max-attempts 1: %v %s", err, lastLine(out))
		}()
	case "dead-letter replay":
		rows, err := s.pool.Query(bg, `SELECT id FROM dead_letters WHERE replayed_at IS NULL ORDER BY id LIMIT 3`)
		if err != nil {
			return
		}
		var ids []int64
		for rows.Next() {
			var id int64
			if rows.Scan(&id) == nil {
				ids = append(ids, id)
			}
		}
		rows.Close()
		for _, id := range ids {
			out, err := s.runOnce(bg, 30*time.Second, "dlq", "replay", fmt.Sprint(id))
			s.log.add(kind, "dlq replay %d: %v %s", id, err, lastLine(out))
		}
	case "network":
		lat, cut := d.latency, d.cutPermille
		for _, p := range s.proxies {
			p.latency.Store(int64(lat))
			p.cutPermille.Store(cut)
		}
		s.log.add(kind, "client network: %s latency, %.1f%% of connections cut", lat.Round(time.Millisecond), float64(cut)/10)
	}
}

// streamLeader returns the index of the node leading ORDERS (-1: unknown).
func (sc *scheduler) streamLeader(ctx context.Context) int {
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	st, err := sc.s.js.Stream(cctx, "ORDERS")
	if err != nil {
		return -1
	}
	info := st.CachedInfo()
	if info.Cluster == nil {
		return -1
	}
	for i := range sc.s.nodes {
		if info.Cluster.Leader == fmt.Sprintf("n%d", i+1) {
			return i
		}
	}
	return -1
}

func lastLine(s string) string {
	for len(s) > 0 && (s[len(s)-1] == '\n' || s[len(s)-1] == ' ') {
		s = s[:len(s)-1]
	}
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == '\n' {
			return s[i+1:]
		}
	}
	return s
}

// Package chaos is orderpipe's randomized fault checker (`orderpipe chaos`)
// and its invariant checker (`orderpipe check`). It is tooling, not
// product.
//
// A run starts the real parts as separate `orderpipe` processes — two
// producers, two consumer processes (each with the webhook worker), the
// compensator daemon and the payment provider stand-in — against a real
// PostgreSQL and a three-node NATS cluster (`orderpipe natsnode`) holding
// the ORDERS stream at R3. Clients send orders through a network-delay
// proxy and retry each with the same request_id; a webhook receiver
// verifies every callback's signature. Meanwhile a scheduler seeded from
// the run's seed injects real faults: kill -9 of any part (then a
// restart), a NATS node stopped and started (the stream leader included),
// the stream deleted, PostgreSQL restarted, provider faults, duplicate
// deliveries, forced compensator passes and dead-letter replays. Then the
// run heals everything, waits for quiescence and checks every invariant on
// every order (Check). The same seed replays the same schedule.
package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"orderpipe/shared/natsjs"
	"orderpipe/shared/orderevent"
	"orderpipe/shared/tenant"
	"orderpipe/shared/tooling/localpg"
)

// Options configure a run.
type Options struct {
	// Seed drives every random choice (0: a random seed, printed first).
	Seed uint64
	// Duration is how long faults are injected (load runs as long).
	Duration time.Duration
	// Quiesce bounds the wait for every order to settle afterwards.
	Quiesce time.Duration
	// Clients is the number of concurrent clients.
	Clients int
	// Dir holds the run's data and logs ("": a new temporary folder,
	// removed after a run that held every invariant).
	Dir string
	// Bin is the orderpipe binary the parts run as ("": this executable).
	Bin string
	// Env is added to every child's environment (tests run the test
	// binary as orderpipe this way).
	Env []string
	// Out receives the progress and the report.
	Out io.Writer
}

func (o *Options) defaults() error {
	if o.Seed == 0 {
		o.Seed = rand.Uint64()
	}
	if o.Duration <= 0 {
		o.Duration = 60 * time.Second
	}
	if o.Quiesce <= 0 {
		o.Quiesce = 4 * time.Minute
	}
	if o.Clients <= 0 {
		o.Clients = 8
	}
	if o.Out == nil {
		o.Out = io.Discard
	}
	if o.Bin == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("find the orderpipe binary: %w", err)
		}
		o.Bin = exe
	}
	return nil
}

// Result is what a run did and found.
type Result struct {
	Seed   uint64         `json:"seed"`
	Orders int            `json:"orders"`
	Faults map[string]int `json:"faults"`
	Report Report         `json:"report"`
	// Problems are violations seen outside the database (the receiver,
	// the clients).
	Problems []string `json:"problems,omitempty"`
	Dir      string   `json:"dir"`
	// Network says what made the network faults: the proxy.
	Network string `json:"network"`
}

// OK reports whether every invariant held.
func (r Result) OK() bool { return r.Report.OK() && len(r.Problems) == 0 }

// skus and their initial stock.
var skus = []string{"SKU-1", "SKU-2", "SKU-3", "SKU-4", "SKU-5"}

const initialStock = 100000

// stack is the running system.
type stack struct {
	opts      Options
	dir       string
	pg        *localpg.Server
	dbURL     string
	pool      *pgxpool.Pool
	nodes     []*proc
	natsURL   string
	nc        *nats.Conn
	js        jetstream.JetStream
	psp       *proc
	pspAddr   string
	producers []*proc
	consumers []*proc
	comp      *proc
	proxies   []*proxy
	recv      *receiver
	creds     tenant.Credentials
	env       []string
	log       *faultLog
}

// freePort picks a free port below Linux's ephemeral range (32768 and
// up): a part restarted after kill -9 must get its port back, and a port
// from the ephemeral range may meanwhile be taken by one of the thousands
// of outgoing connections the run makes.
func freePort() (int, error) {
	for range 1000 {
		port := 20000 + rand.IntN(12000)
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		l.Close()
		return port, nil
	}
	return 0, errors.New("no free port between 20000 and 32000")
}

func freePorts(n int) ([]int, error) {
	out := make([]int, 0, n)
	seen := map[int]bool{}
	for len(out) < n {
		p, err := freePort()
		if err != nil {
			return nil, err
		}
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	return out, nil
}

func httpReady(addr string) func(context.Context) error {
	return func(ctx context.Context) error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/healthz", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%w: /healthz %d", errNotReady, resp.StatusCode)
		}
		return nil
	}
}

func tcpReady(addr string) func(context.Context) error {
	return func(context.Context) error {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err
	}
}

// Run makes one chaos run: start, load and faults for Duration, heal,
// quiesce, check, stop. The error is about the run itself (a part that
// cannot start); broken invariants are in the Result (OK).
func Run(ctx context.Context, opts Options) (res Result, err error) {
	if err := opts.defaults(); err != nil {
		return Result{}, err
	}
	fmt.Fprintf(opts.Out, "chaos seed %d (replay: CHAOS_SEED=%d make chaos)\n", opts.Seed, opts.Seed)
	res = Result{Seed: opts.Seed, Network: "in-process TCP proxy (latency, cut connections); tc/netem needs a network namespace of its own"}
	s := &stack{opts: opts, log: &faultLog{}}
	if s.dir = opts.Dir; s.dir == "" {
		if s.dir, err = os.MkdirTemp("", "orderpipe-chaos-"); err != nil {
			return res, err
		}
	} else if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return res, err
	}
	// PostgreSQL runs as the postgres account when we are root: it must
	// reach its data folder.
	if err := os.Chmod(s.dir, 0o755); err != nil {
		return res, err
	}
	res.Dir = s.dir
	defer func() {
		s.stop()
		if err == nil && res.OK() && opts.Dir == "" {
			_ = os.RemoveAll(s.dir)
			res.Dir = ""
		} else {
			fmt.Fprintf(opts.Out, "logs and data kept in %s\n", s.dir)
		}
	}()
	if err := s.start(ctx); err != nil {
		return res, err
	}
	fmt.Fprintf(opts.Out, "stack up: 3 NATS nodes (ORDERS at R3), PostgreSQL, psp, 2 producers, 2 consumers, compensator; %d clients for %s\n", opts.Clients, opts.Duration)

	targets := make([]string, len(s.proxies))
	for i, p := range s.proxies {
		targets[i] = p.addr()
	}
	ld := newLoad(targets, s.creds.APIKey, s.recv.url(), skus, opts.Seed)
	loadCtx, stopLoad := context.WithTimeout(ctx, opts.Duration)
	defer stopLoad()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); ld.run(loadCtx, opts.Clients, 90*time.Second) }()
	sched := newScheduler(s, opts.Seed)
	sched.run(loadCtx)
	fmt.Fprintf(opts.Out, "faults done (%d injected); healing and waiting for the clients to settle their orders\n", s.log.injected())
	if err := s.heal(ctx); err != nil {
		return res, err
	}
	wg.Wait()
	if err := s.quiesce(ctx, opts.Quiesce); err != nil {
		fmt.Fprintf(opts.Out, "not quiescent: %v\n", err)
	}
	accepted, refused, sent := ld.snapshot()
	acc := make(map[string]string, len(accepted))
	for rid, a := range accepted {
		acc[rid] = a.OrderID
	}
	var received map[string]string
	var copies int
	seen := func() map[string]string {
		var problems []string
		received, copies, problems = s.recv.seen()
		res.Problems = append(res.Problems, problems...)
		return received
	}
	// A client that ran out of time is not a broken promise (the checks
	// find out whether its order was taken); any refusal of a valid
	// request, or a repeat answered otherwise than the first time, is.
	for rid, why := range refused {
		if !strings.HasPrefix(why, gaveUp) {
			res.Problems = append(res.Problems, "request_id "+rid+": "+why)
		}
	}
	rep, err := Check(ctx, s.pool, CheckOptions{InitialStock: stockMap(), Accepted: acc, Sent: sent, Received: seen})
	if err != nil {
		return res, fmt.Errorf("check: %w", err)
	}
	res.Report, res.Orders, res.Faults = rep, rep.Orders, s.log.counts()
	fmt.Fprintf(opts.Out, "clients: %d orders accepted (%d tokens fetched), %d requests sent, %d retries, %d deliberate repeats, %d not settled; receiver: %d webhooks verified (%d repeated copies); proxy cut %d connections\n",
		len(accepted), ld.tokens.Load(), ld.sent.Load(), ld.retries.Load(), ld.replays.Load(), len(refused), len(received), copies, s.cuts())
	printRefusals(opts.Out, refused)
	s.printFaults(opts.Out)
	rep.Print(opts.Out)
	for _, p := range res.Problems {
		fmt.Fprintln(opts.Out, "  PROBLEM", p)
	}
	if !res.OK() {
		s.explain(ctx, opts.Out, rep.BrokenOrders())
	}
	return res, nil
}

func stockMap() map[string]int64 {
	m := map[string]int64{}
	for _, s := range skus {
		m[s] = initialStock
	}
	return m
}

func (s *stack) cuts() int64 {
	var n int64
	for _, p := range s.proxies {
		n += p.cuts.Load()
	}
	return n
}

func (s *stack) start(ctx context.Context) error {
	var err error
	s.pg, err = localpg.Start(ctx, localpg.Options{DataDir: filepath.Join(s.dir, "pg"), Durable: true,
		ExtraArgs: []string{"-c", "max_connections=300"}})
	if err != nil {
		return fmt.Errorf("start PostgreSQL: %w", err)
	}
	s.dbURL = s.pg.URL("postgres")
	s.env = append([]string{"DATABASE_URL=" + s.dbURL, "ORDERPIPE_STREAM_REPLICAS=3", "ORDERPIPE_ALLOW_PRIVATE_CALLBACKS=on",
		"ORDERPIPE_LOG_FORMAT=text", "ORDERPIPE_SHUTDOWN_TIMEOUT=5s"}, s.opts.Env...)
	if out, err := s.runOnce(ctx, 2*time.Minute, "migrate", "up"); err != nil {
		return fmt.Errorf("migrate: %w\n%s", err, out)
	}
	if s.pool, err = pgxpool.New(ctx, s.dbURL); err != nil {
		return err
	}
	for _, sku := range skus {
		if _, err := s.pool.Exec(ctx, `INSERT INTO inventory (sku, available) VALUES ($1, $2)
			ON CONFLICT (sku) DO UPDATE SET available = EXCLUDED.available`, sku, initialStock); err != nil {
			return err
		}
	}
	if s.creds, err = tenant.Create(ctx, s.pool, "chaos"); err != nil {
		return err
	}
	if err := s.startNATS(ctx); err != nil {
		return err
	}
	s.env = append(s.env, "NATS_URL="+s.natsURL)
	if s.recv, err = newReceiver(s.creds.WebhookSecret); err != nil {
		return err
	}
	ports, err := freePorts(7)
	if err != nil {
		return err
	}
	s.pspAddr = fmt.Sprintf("127.0.0.1:%d", ports[0])
	s.psp = s.part("psp", nil, "psp", "--addr", s.pspAddr)
	s.psp.ready = httpReady(s.pspAddr)
	s.setProvider(false)
	if err := s.psp.start(ctx); err != nil {
		return err
	}
	partEnv := []string{"PSP_URL=http://" + s.pspAddr, "ORDERPIPE_RATE_LIMIT=100000", "ORDERPIPE_RATE_BURST=100000",
		"ORDERPIPE_CONSUMER_ACK_WAIT=3s", "ORDERPIPE_CONSUMER_MAX_DELIVER=6", "ORDERPIPE_PSP_TIMEOUT=2s"}
	for i := range 2 {
		addr := fmt.Sprintf("127.0.0.1:%d", ports[1+i])
		p := s.part(fmt.Sprintf("producer-%d", i+1), append([]string{"HTTP_ADDR=" + addr}, partEnv...), "producer")
		p.ready = httpReady(addr)
		s.producers = append(s.producers, p)
		px, err := newProxy(addr, s.opts.Seed+uint64(i))
		if err != nil {
			return err
		}
		s.proxies = append(s.proxies, px)
	}
	for i := range 2 {
		addr := fmt.Sprintf("127.0.0.1:%d", ports[3+i])
		p := s.part(fmt.Sprintf("consumers-%d", i+1), append([]string{"HTTP_ADDR=" + addr}, partEnv...), "consumers")
		p.ready = httpReady(addr)
		s.consumers = append(s.consumers, p)
	}
	compAddr := fmt.Sprintf("127.0.0.1:%d", ports[5])
	// Deadlines far inside the consumers' horizon (hence --force): the
	// compensator races consumers that are still retrying, on purpose.
	s.comp = s.part("compensator", append([]string{"HTTP_ADDR=" + compAddr}, partEnv...),
		"compensator", "--force", "--stuck-after", "10s", "--interval", "2s", "--max-attempts", "3")
	s.comp.ready = httpReady(compAddr)
	for _, p := range append(append(append([]*proc{}, s.producers...), s.consumers...), s.comp) {
		if err := p.start(ctx); err != nil {
			return err
		}
	}
	return nil
}

func (s *stack) part(name string, env []string, args ...string) *proc {
	return newProc(s.dir, name, s.opts.Bin, args, append(append([]string{}, s.env...), env...))
}

// setProvider sets the stand-in's flags: healthy (5% declines) or faulty.
func (s *stack) setProvider(faulty bool) {
	args := []string{"psp", "--addr", s.pspAddr, "--latency", "5ms", "--decline-rate", "0.05", "--in-flight-timeout", "5s"}
	if faulty {
		args = []string{"psp", "--addr", s.pspAddr, "--latency", "400ms", "--decline-rate", "0.1", "--error-rate", "0.2",
			"--timeout-rate", "0.1", "--hang", "3s", "--in-flight-timeout", "5s"}
	}
	s.psp.args = args
}

func (s *stack) startNATS(ctx context.Context) error {
	client, err := freePorts(3)
	if err != nil {
		return err
	}
	cluster, err := freePorts(3)
	if err != nil {
		return err
	}
	var urls []string
	for i := range 3 {
		var routes []string
		for j := range 3 {
			if j != i {
				routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", cluster[j]))
			}
		}
		p := newProc(s.dir, fmt.Sprintf("nats-%d", i+1), s.opts.Bin, []string{"natsnode",
			"--name", fmt.Sprintf("n%d", i+1), "--port", fmt.Sprint(client[i]), "--cluster-port", fmt.Sprint(cluster[i]),
			"--routes", strings.Join(routes, ","), "--store", filepath.Join(s.dir, fmt.Sprintf("nats-%d", i+1))}, s.opts.Env)
		p.ready = tcpReady(fmt.Sprintf("127.0.0.1:%d", client[i]))
		s.nodes = append(s.nodes, p)
		urls = append(urls, fmt.Sprintf("nats://127.0.0.1:%d", client[i]))
	}
	for _, n := range s.nodes {
		if err := n.start(ctx); err != nil {
			return err
		}
	}
	s.natsURL = strings.Join(urls, ",")
	if s.nc, err = nats.Connect(s.natsURL, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond)); err != nil {
		return fmt.Errorf("connect to the NATS cluster: %w", err)
	}
	if s.js, err = jetstream.New(s.nc); err != nil {
		return err
	}
	// The cluster elects its meta leader first; until then the stream
	// cannot be created.
	deadline := time.Now().Add(60 * time.Second)
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := natsjs.EnsureStream(cctx, s.js, orderevent.DefaultTopology, 3)
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("create the ORDERS stream at R3: %w", err)
		}
		select {
		case <-time.After(250 * time.Millisecond):
		case <-ctx.Done():
		}
	}
}

// runOnce runs `orderpipe args…` to completion.
func (s *stack) runOnce(ctx context.Context, timeout time.Duration, args ...string) (string, error) {
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(cctx, s.opts.Bin, args...)
	cmd.Env = append(os.Environ(), s.env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (s *stack) all() []*proc {
	out := append([]*proc{}, s.nodes...)
	if s.psp != nil {
		out = append(out, s.psp)
	}
	out = append(out, s.producers...)
	out = append(out, s.consumers...)
	if s.comp != nil {
		out = append(out, s.comp)
	}
	return out
}

// heal ends every fault: every process up, the provider healthy, the
// network clean.
func (s *stack) heal(ctx context.Context) error {
	for _, p := range s.proxies {
		p.latency.Store(0)
		p.cutPermille.Store(0)
	}
	for _, n := range s.nodes {
		if !n.running() {
			n.kill()
			if err := n.start(ctx); err != nil {
				return err
			}
		}
	}
	if s.psp.running() {
		s.psp.kill()
	}
	s.setProvider(false)
	for _, p := range s.all() {
		if !p.running() {
			p.kill()
			if err := p.start(ctx); err != nil {
				return err
			}
		}
	}
	return nil
}

// quiesce waits until every order is terminal, nothing is pending in the
// outbox and every webhook is settled.
func (s *stack) quiesce(ctx context.Context, bound time.Duration) error {
	deadline := time.Now().Add(bound)
	var last string
	for {
		// Quiet means: every order terminal, nothing pending in the outbox,
		// every change with a settled webhook (a change whose event the
		// broker lost gets its webhook from the notifier's fill-in or the
		// compensator's re-notify, which takes a stuck deadline).
		// A token whose holder died after its order committed is settled
		// by the compensator's next pass after its lease.
		var open, pending, hooks, missing, tokens int
		err := s.pool.QueryRow(ctx, `SELECT
			(SELECT count(*) FROM orders WHERE status NOT IN ('confirmed', 'rejected', 'cancelled')),
			(SELECT count(*) FROM outbox WHERE published_at IS NULL),
			(SELECT count(*) FROM webhook_deliveries WHERE status = 'pending'),
			(SELECT count(*) FROM order_events e JOIN orders o USING (order_id)
			 WHERE o.callback_url IS NOT NULL AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.order_id = e.order_id AND d.seq = e.seq)),
			(SELECT count(*) FROM orders o JOIN idempotency_tokens t ON t.token = o.request_id WHERE t.state <> 'used')`).
			Scan(&open, &pending, &hooks, &missing, &tokens)
		if err == nil && open == 0 && pending == 0 && hooks == 0 && missing == 0 && tokens == 0 {
			fmt.Fprintln(s.opts.Out, "quiescent: every order terminal, outbox empty, every change's webhook settled, every token of an order used")
			return nil
		}
		last = fmt.Sprintf("%d open orders, %d pending events, %d pending webhooks, %d changes without a webhook, %d tokens of orders not used (err %v)",
			open, pending, hooks, missing, tokens, err)
		for _, p := range s.all() {
			if restarted, err := p.restartIfExited(ctx); restarted {
				fmt.Fprintf(s.opts.Out, "%s had exited on its own; restarted (%v)\n", p.name, err)
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return errors.New(last)
		}
		select {
		case <-time.After(time.Second):
		case <-ctx.Done():
		}
	}
}

// explain prints `orderpipe orders inspect` for the first broken orders and
// the faults around them.
func (s *stack) explain(ctx context.Context, w io.Writer, orders []string) {
	for i, id := range orders {
		if i == 3 {
			fmt.Fprintf(w, "… %d more broken orders\n", len(orders)-3)
			break
		}
		out, err := s.runOnce(ctx, time.Minute, "orders", "inspect", id)
		fmt.Fprintf(w, "\n---- orderpipe orders inspect %s (%v)\n%s", id, err, out)
		var created time.Time
		if err := s.pool.QueryRow(ctx, `SELECT created_at FROM orders WHERE order_id = $1`, id).Scan(&created); err == nil {
			fmt.Fprintf(w, "---- faults from 10s before the order was created until it ended:\n")
			var end time.Time
			_ = s.pool.QueryRow(ctx, `SELECT updated_at FROM orders WHERE order_id = $1`, id).Scan(&end)
			for _, f := range s.log.between(created.Add(-10*time.Second), end.Add(time.Second)) {
				fmt.Fprintf(w, "  %s %-18s %s\n", f.At.UTC().Format("15:04:05.000"), f.Kind, f.Detail)
			}
		}
	}
}

func (s *stack) printFaults(w io.Writer) {
	counts := s.log.counts()
	kinds := make([]string, 0, len(counts))
	for k := range counts {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	fmt.Fprintf(w, "%-30s %8s\n", "fault", "injected")
	for _, k := range kinds {
		if !isFault(k) {
			continue
		}
		fmt.Fprintf(w, "%-30s %8d\n", k, counts[k])
	}
	if n := counts[notInjected]; n > 0 {
		fmt.Fprintf(w, "(%d more drawn but not injected: the part was down already, the broker refused, …)\n", n)
	}
	// A restart that failed is the run's own trouble, not an injected
	// fault: say which and why, so that it can be looked into.
	for _, f := range s.log.between(time.Time{}, time.Now()) {
		if f.Kind == restartFailed {
			fmt.Fprintf(w, "  restart failed at %s: %s\n", f.At.UTC().Format("15:04:05.000"), f.Detail)
		}
	}
}

func (s *stack) stop() {
	for _, p := range s.proxies {
		p.close()
	}
	if s.recv != nil {
		s.recv.close()
	}
	var wg sync.WaitGroup
	for _, p := range s.all() {
		wg.Add(1)
		go func() { defer wg.Done(); p.stop(10 * time.Second) }()
	}
	wg.Wait()
	if s.nc != nil {
		s.nc.Close()
	}
	if s.pool != nil {
		s.pool.Close()
	}
	if s.pg != nil {
		_ = s.pg.Stop()
	}
}

// MarshalJSON-friendly summary for --json.
func (r Result) JSON() ([]byte, error) { return json.MarshalIndent(r, "", "  ") }

// printRefusals shows the most common reasons why clients did not settle
// an order (the checker decides whether the intake took it).
func printRefusals(w io.Writer, refused map[string]string) {
	byWhy := map[string]int{}
	for _, why := range refused {
		if i := strings.Index(why, "(last:"); i >= 0 {
			why = why[i:]
		}
		if len(why) > 120 {
			why = why[:120]
		}
		byWhy[why]++
	}
	type kv struct {
		why string
		n   int
	}
	var list []kv
	for k, v := range byWhy {
		list = append(list, kv{k, v})
	}
	sort.Slice(list, func(i, j int) bool { return list[i].n > list[j].n })
	for i, e := range list {
		if i == 5 {
			break
		}
		fmt.Fprintf(w, "  not settled ×%d: %s\n", e.n, e.why)
	}
}

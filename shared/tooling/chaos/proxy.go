package chaos

import (
	"context"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// proxy is the network-delay proxy between the clients and a producer: it
// stands in for tc/netem (which needs a network namespace of its own) by
// adding latency to every chunk in both directions and cutting a share of
// the connections at a random moment, so that a client sees its request
// time out or its connection drop after the server may have written the
// order.
type proxy struct {
	ln     net.Listener
	target string
	// latency and cutPermille are changed by the fault scheduler.
	latency     atomic.Int64 // nanoseconds
	cutPermille atomic.Int64
	rng         *rand.Rand
	rngMu       sync.Mutex
	wg          sync.WaitGroup
	mu          sync.Mutex
	conns       map[net.Conn]struct{}
	cuts        atomic.Int64
}

func newProxy(target string, seed uint64) (*proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &proxy{ln: ln, target: target, rng: rand.New(rand.NewPCG(seed, 77)), conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) float() float64 {
	p.rngMu.Lock()
	defer p.rngMu.Unlock()
	return p.rng.Float64()
}

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

func (p *proxy) track(c net.Conn, on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if on {
		p.conns[c] = struct{}{}
	} else {
		delete(p.conns, c)
	}
}

func (p *proxy) serve(in net.Conn) {
	defer p.wg.Done()
	defer in.Close()
	out, err := net.DialTimeout("tcp", p.target, 2*time.Second)
	if err != nil {
		return
	}
	defer out.Close()
	p.track(in, true)
	defer p.track(in, false)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if cut := p.cutPermille.Load(); cut > 0 && p.float()*1000 < float64(cut) {
		// Cut this connection after a random moment: before, during or
		// after the server's answer.
		after := time.Duration(p.float() * float64(200*time.Millisecond+2*time.Duration(p.latency.Load())))
		go func() {
			select {
			case <-time.After(after):
				p.cuts.Add(1)
				in.Close()
				out.Close()
			case <-ctx.Done():
			}
		}()
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); p.pipe(out, in); _ = out.(*net.TCPConn).CloseWrite() }()
	go func() { defer wg.Done(); p.pipe(in, out); in.Close() }()
	wg.Wait()
}

// pipe copies src to dst, delaying each chunk by the current latency.
func (p *proxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if d := time.Duration(p.latency.Load()); d > 0 {
				time.Sleep(d/2 + time.Duration(p.float()*float64(d)))
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil { // EOF or a cut: either way the copy ends
			return
		}
	}
}

func (p *proxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

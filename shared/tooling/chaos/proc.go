package chaos

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// proc is one `orderpipe <part>` child process that the run starts, kills
// with SIGKILL, restarts and stops. Its output goes to a log file of its
// own in the run's folder (appended across restarts).
type proc struct {
	name string
	bin  string
	args []string
	env  []string
	log  string
	// ready, if set, is polled after a start until it returns nil.
	ready func(ctx context.Context) error

	mu    sync.Mutex
	cmd   *exec.Cmd
	done  chan struct{}
	kills int
}

func (p *proc) start(ctx context.Context) error {
	p.mu.Lock()
	if p.cmd != nil {
		p.mu.Unlock()
		return nil
	}
	f, err := os.OpenFile(p.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		p.mu.Unlock()
		return fmt.Errorf("%s: log file: %w", p.name, err)
	}
	fmt.Fprintf(f, "\n==== %s start %s\n", time.Now().UTC().Format(time.RFC3339Nano), p.name)
	cmd := exec.Command(p.bin, p.args...)
	cmd.Env = append(os.Environ(), p.env...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		p.mu.Unlock()
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		f.Close()
		close(done)
	}()
	p.cmd, p.done = cmd, done
	p.mu.Unlock()
	if p.ready == nil {
		return nil
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		err := p.ready(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("%s exited during start-up: %w; its log ends: %s", p.name, err, logTail(p.log, 4))
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s not ready within 60s (see %s): %w", p.name, p.log, err)
		}
		select {
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
		}
	}
}

// kill sends SIGKILL to the process group and waits for it.
func (p *proc) kill() {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.cmd = nil
	if cmd != nil {
		p.kills++
	}
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-done
}

// stop asks the process to drain (SIGTERM) and kills it after grace.
func (p *proc) stop(grace time.Duration) {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.cmd = nil
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(grace):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
}

// state says whether the run started the process (and has not killed or
// stopped it since) and whether it has exited since.
func (p *proc) state() (started, exited bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return false, false
	}
	select {
	case <-p.done:
		return true, true
	default:
		return true, false
	}
}

func (p *proc) running() bool {
	started, exited := p.state()
	return started && !exited
}

// exited reports a process that died on its own (not killed by the run).
func (p *proc) exited() bool {
	_, exited := p.state()
	return exited
}

// restartIfExited starts again a process that died on its own; it returns
// whether it did.
func (p *proc) restartIfExited(ctx context.Context) (bool, error) {
	if !p.exited() {
		return false, nil
	}
	p.mu.Lock()
	p.cmd = nil
	p.mu.Unlock()
	return true, p.start(ctx)
}

func newProc(dir, name, bin string, args, env []string) *proc {
	return &proc{name: name, bin: bin, args: args, env: env, log: filepath.Join(dir, name+".log")}
}

var errNotReady = errors.New("not ready")

// logTail returns the last n lines of a part's log, joined with " | " (its
// folder is gone when the run ends, so the summary carries them).
func logTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

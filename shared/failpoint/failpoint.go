// Package failpoint lets tests stop a process at a named crash point, to
// show that a guarantee holds when the process dies exactly there.
//
// A failpoint is armed by the environment, read once by the binary at
// start with FromEnv (for a child process that a test starts and expects
// to die), or in-process by Enable (for a test that wants
// an error returned at that point):
//
//	ORDERPIPE_FAILPOINTS=intake.after-commit=exit,consumer.after-commit=exit
//
// "exit" ends the process with ExitCode at once, without running deferred
// functions or flushing anything, like a crash. "error" makes Inject return
// ErrInjected. An action may carry a count, "exit@3", to fire only at the
// third time the point is reached. In production nothing is armed and
// Inject costs one atomic load.
package failpoint

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"orderpipe/shared/config"
)

// EnvVar arms failpoints in a process.
var EnvVar = config.Register("ORDERPIPE_FAILPOINTS", "tests only: crash points to arm, e.g. intake.after-commit=exit", "none")

// ExitCode is the exit status of a process stopped by an "exit" failpoint.
const ExitCode = 86

// ErrInjected is returned by Inject at a point armed with "error".
var ErrInjected = errors.New("failpoint: injected error")

type action struct {
	kind  string // "exit" or "error"
	after int64  // fire when hits reaches this (1 = first time)
	hits  atomic.Int64
}

var (
	armed atomic.Bool
	mu    sync.RWMutex
	table = map[string]*action{}
)

// FromEnv arms the failpoints of ORDERPIPE_FAILPOINTS, if set. The binary
// calls it once at start (and refuses to start on an error); a library
// never does, so nothing arms a failpoint behind a program's back.
func FromEnv() error {
	v := os.Getenv(EnvVar)
	if v == "" {
		return nil
	}
	if err := Parse(v); err != nil {
		return fmt.Errorf("%s: %w", EnvVar, err)
	}
	return nil
}

// Parse arms the failpoints of a spec like "a=exit,b=error@2".
func Parse(spec string) error {
	for _, part := range strings.Split(spec, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, act, ok := strings.Cut(part, "=")
		if !ok || name == "" {
			return fmt.Errorf("want name=exit or name=error, got %q", part)
		}
		kind, nStr, hasN := strings.Cut(act, "@")
		n := int64(1)
		if hasN {
			v, err := strconv.ParseInt(nStr, 10, 64)
			if err != nil || v < 1 {
				return fmt.Errorf("bad count in %q", part)
			}
			n = v
		}
		if kind != "exit" && kind != "error" {
			return fmt.Errorf("unknown action %q in %q (want exit or error)", kind, part)
		}
		enable(name, kind, n)
	}
	return nil
}

func enable(name, kind string, after int64) {
	mu.Lock()
	defer mu.Unlock()
	table[name] = &action{kind: kind, after: after}
	armed.Store(true)
}

// Enable arms a failpoint in this process to return ErrInjected at the
// after-th hit (1 = the first); the returned function disarms it.
func Enable(name string, after int) (disable func()) {
	enable(name, "error", int64(after))
	return func() {
		mu.Lock()
		defer mu.Unlock()
		delete(table, name)
	}
}

// Inject marks a crash point. It returns nil unless the point is armed.
func Inject(name string) error {
	if !armed.Load() {
		return nil
	}
	mu.RLock()
	a := table[name]
	mu.RUnlock()
	if a == nil {
		return nil
	}
	if a.hits.Add(1) != a.after {
		return nil
	}
	if a.kind == "exit" {
		fmt.Fprintf(os.Stderr, "failpoint %s: exiting\n", name)
		os.Exit(ExitCode)
	}
	return fmt.Errorf("%s: %w", name, ErrInjected)
}

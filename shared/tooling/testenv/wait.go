package testenv

import (
	"context"
	"testing"
	"time"
)

// Context returns a context that ends after timeout, or when the test's
// cleanups start, whichever comes first: a bound on what a test waits for
// from a server.
func Context(t testing.TB, timeout time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	t.Cleanup(cancel)
	return ctx
}

// Receive returns the next value from ch, failing the test if none comes
// within timeout; what says what the test waits for ("the server to
// return").
func Receive[T any](t testing.TB, ch <-chan T, timeout time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(timeout):
		t.Fatalf("timed out after %s waiting for %s", timeout, what)
	}
	var zero T // not reached: Fatalf ends the test's goroutine
	return zero
}

package compensator_test

import (
	"bytes"
	"errors"
	"os/exec"
	"strings"
	"testing"

	"orderpipe/shared/failpoint"
	"orderpipe/shared/order"
	"orderpipe/shared/tooling/testenv"
)

// child runs `orderpipe compensator args...` as a child process (this test
// binary, see TestMain) with the given failpoints armed, and returns its
// exit code and output.
func (w *world) child(natsURL, failpoints string, args ...string) (int, string) {
	w.t.Helper()
	cmd := testenv.ChildCommand(args,
		"DATABASE_URL="+w.db.URL, "NATS_URL="+natsURL, "PSP_URL="+w.pspURL,
		failpoint.EnvVar+"="+failpoints, "ORDERPIPE_LOG_LEVEL=warn")
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, out.String()
	case errors.As(err, &ee):
		w.t.Logf("child exited %d; stderr:\n%s", ee.ExitCode(), errOut.String())
		return ee.ExitCode(), out.String()
	default:
		w.t.Fatal(err)
		return 0, ""
	}
}

// The compensator process is killed in the middle of a pass, then right
// after a batch committed (before its events went out), then run again:
// every order is acted on exactly once, and every event goes out.
func TestProcessKilledMidPassThenRunAgain(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	nats := testenv.OwnNATS(t) // the real process publishes on the production topology
	ids := w.newOrders(7, spec{status: order.StatusReserved})
	w.exec(`UPDATE orders SET updated_at = now() - interval '2 hours'`)
	w.unstamp()
	args := []string{"--once", "--stuck-after", "1h", "--batch-size", "2"}

	// Dies at the third order: the first batch (two orders) committed,
	// the second one's first order is rolled back with the connection.
	if code, _ := w.child(nats.URL(), "compensator.mid-pass=exit@3", args...); code != failpoint.ExitCode {
		t.Fatalf("first run exited %d, want %d", code, failpoint.ExitCode)
	}
	if n := w.int(`SELECT count(*) FROM compensator_actions`); n != 2 {
		t.Fatalf("actions after the first crash: %d", n)
	}
	// Dies after its first batch committed and before publishing.
	if code, _ := w.child(nats.URL(), "compensator.after-batch=exit", args...); code != failpoint.ExitCode {
		t.Fatalf("second run exited %d", code)
	}
	if n := w.int(`SELECT count(*) FROM compensator_actions`); n != 4 {
		t.Fatalf("actions after the second crash: %d", n)
	}
	w.wantPendingOutbox(2, "after the second crash")
	// Left for a while, then run again: the rest is done, and the events
	// of the crashed batch go out.
	w.exec(`UPDATE outbox SET created_at = now() - interval '1 minute' WHERE published_at IS NULL`)
	code, out := w.child(nats.URL(), "", args...)
	if code != 0 {
		t.Fatalf("third run exited %d:\n%s", code, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 || !strings.Contains(lines[3], "redriven 3, unwound 0") || !strings.Contains(lines[3], "outbox republished 2") {
		t.Fatalf("third run printed:\n%s", out)
	}
	for _, id := range ids {
		if n := w.int(`SELECT count(*) FROM compensator_actions WHERE order_id = $1`, id); n != 1 {
			t.Errorf("order %s acted on %d times", id, n)
		}
	}
	w.wantPendingOutbox(0, "at the end")
	// A fourth run finds nothing to do.
	if code, out := w.child(nats.URL(), "", args...); code != 0 || !strings.HasPrefix(out, "pass: stuck processing=0 reserved=0 paid=0; redriven 0") {
		t.Fatalf("fourth run: %d %s", code, out)
	}
}

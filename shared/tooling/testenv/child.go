package testenv

import (
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"orderpipe/shared/cli"
)

// childEnv marks a test binary that was started again as a command (see
// MainWith); its value is the command line, one argument per line.
const childEnv = "ORDERPIPE_TEST_CHILD"

// MainWith is Main for a package whose tests run cmd as a child process
// (ChildCommand, to kill it at a crash point): the test binary started
// again by ChildCommand runs cmd in-process exactly as the orderpipe
// binary would (cli.Execute) and exits with its status.
func MainWith(m *testing.M, cmd cli.Command) {
	if line, ok := os.LookupEnv(childEnv); ok {
		var args []string
		if line != "" {
			args = strings.Split(line, "\n")
		}
		os.Exit(cli.Execute(cmd, args, os.Stdout, os.Stderr))
	}
	Main(m)
}

// ChildCommand returns the command that runs this test binary as the
// package's command (MainWith) with args, in this process's environment
// plus env (NAME=value). It runs no test and dies with the test process.
func ChildCommand(args []string, env ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), childEnv+"="+strings.Join(args, "\n")), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

// KillAtEnd makes the end of the test kill cmd's process unless exited
// (closed once cmd.Wait returned) is closed already, and wait for exited;
// if the test failed, it logs output() as what's output.
func KillAtEnd(t testing.TB, cmd *exec.Cmd, exited <-chan struct{}, what string, output func() string) {
	t.Cleanup(func() {
		select {
		case <-exited:
		default:
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", what, output())
		}
	})
}

// WaitExited fails the test unless exited (closed once the child's
// cmd.Wait returned) is closed within timeout.
func WaitExited(t testing.TB, exited <-chan struct{}, timeout time.Duration, what string) {
	t.Helper()
	select {
	case <-exited:
	case <-time.After(timeout):
		t.Fatalf("%s still running after %s", what, timeout)
	}
}

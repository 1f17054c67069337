package testenv

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"testing"

	"orderpipe/shared/cli"
	"orderpipe/shared/config"
	"orderpipe/shared/failpoint"
)

// childEnv marks a test binary that was started again as a command (see
// MainWith); its value is the command line, one argument per line.
const childEnv = "ORDERPIPE_TEST_CHILD"

// MainWith is Main for a package whose tests run cmd as a child process
// (ChildCommand, to kill it at a crash point): the test binary started
// again by ChildCommand runs cmd in-process as the orderpipe binary
// would, configured by the environment, failpoints armed and SIGTERM
// handled, and exits with its status (2 for a bad command line or
// environment, 1 for an error).
func MainWith(m *testing.M, cmd cli.Command) {
	if line, ok := os.LookupEnv(childEnv); ok {
		os.Exit(runChild(cmd, line, os.Stdout, os.Stderr))
	}
	Main(m)
}

func runChild(cmd cli.Command, line string, stdout, stderr io.Writer) int {
	cfg, err := config.FromEnv()
	if err == nil {
		err = failpoint.FromEnv()
	}
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	fs := flag.NewFlagSet(cmd.Name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	if cmd.Setup != nil {
		cmd.Setup(fs)
	}
	var args []string
	if line != "" {
		args = strings.Split(line, "\n")
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := cmd.Run(ctx, cli.Invocation{Args: fs.Args(), Flags: fs, Stdout: stdout, Stderr: stderr, Config: cfg}); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	return 0
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

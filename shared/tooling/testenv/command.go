package testenv

import (
	"bytes"
	"context"
	"flag"
	"io"
	"sync"

	"orderpipe/shared/cli"
	"orderpipe/shared/config"
)

// RunCommand runs cmd in-process as cli.Execute would, but on cfg instead
// of the environment: its flags parsed from args (a bad one is returned as
// a cli.UsageError, nothing printed), then Run with ctx, writing to stdout
// and stderr (nil: discarded).
func RunCommand(ctx context.Context, cmd cli.Command, cfg config.Config, stdout, stderr io.Writer, args ...string) error {
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	fs := flag.NewFlagSet(cmd.Name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	if cmd.Setup != nil {
		cmd.Setup(fs)
	}
	if err := fs.Parse(args); err != nil {
		return cli.Usagef("%v", err)
	}
	return cmd.Run(ctx, cli.Invocation{Args: fs.Args(), Flags: fs, Stdout: stdout, Stderr: stderr, Config: cfg})
}

// Buffer is a bytes.Buffer that several goroutines may write and read at
// once: a log sink, or a child process's output. The zero value is ready.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Package cli describes orderpipe's subcommands so that main.go can list,
// document and dispatch them, and each part keeps its own flags.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgxpool"

	"orderpipe/shared/config"
	"orderpipe/shared/failpoint"
	"orderpipe/shared/postgres"
)

// Command is one `orderpipe <name>` subcommand.
type Command struct {
	// Name is the word after `orderpipe`.
	Name string
	// Summary is one line for `orderpipe help`.
	Summary string
	// Usage is the argument synopsis, e.g. "[--once] [--dry-run]".
	Usage string
	// Env lists the environment variables the command reads.
	Env []string
	// Flags declares the command's flags on fs and returns the function
	// that runs it with the remaining arguments. Nil when it takes none.
	Run func(ctx context.Context, inv Invocation) error
	// Setup declares flags before parsing (optional).
	Setup func(fs *flag.FlagSet)
}

// Invocation is what a command runs with.
type Invocation struct {
	Args   []string
	Flags  *flag.FlagSet
	Stdout io.Writer
	Stderr io.Writer
	Config config.Config
}

// PrintEnv writes the documented variables among names.
func PrintEnv(w io.Writer, names []string) {
	if len(names) == 0 {
		return
	}
	fmt.Fprintln(w, "\nEnvironment:")
	vars := map[string]config.Var{}
	for _, v := range config.Vars() {
		vars[v.Name] = v
	}
	for _, n := range names {
		v, ok := vars[n]
		if !ok {
			v = config.Var{Name: n}
		}
		def := ""
		if v.Default != "" {
			def = " (default: " + v.Default + ")"
		}
		fmt.Fprintf(w, "  %-34s %s%s\n", n, v.Meaning, def)
	}
}

// WithPool opens the PostgreSQL pool of inv's Config (DATABASE_URL), runs f
// with it and closes it: the body of a command that only needs the
// database, once its command line was checked.
func WithPool(ctx context.Context, inv Invocation, f func(*pgxpool.Pool) error) error {
	pool, err := postgres.OpenConfig(ctx, inv.Config)
	if err != nil {
		return err
	}
	defer pool.Close()
	return f(pool)
}

// Sub is one subcommand of a command, as tail is of `orderpipe events`.
type Sub struct {
	// Name is the word after the command's name.
	Name string
	// Run runs the subcommand; inv.Args are the arguments after Name.
	Run func(ctx context.Context, inv Invocation) error
}

// Subcommands returns the Run of a command made of subs: it runs the one
// that the first argument names. A missing or unknown subcommand is a
// UsageError that lists subs in their order.
func Subcommands(subs ...Sub) func(ctx context.Context, inv Invocation) error {
	names := make([]string, len(subs))
	for i, s := range subs {
		names[i] = s.Name
	}
	want := names[len(names)-1]
	if len(names) > 1 {
		want = strings.Join(names[:len(names)-1], ", ") + " or " + want
	}
	return func(ctx context.Context, inv Invocation) error {
		if len(inv.Args) == 0 {
			return Usagef("want a subcommand: %s", want)
		}
		for _, s := range subs {
			if s.Name == inv.Args[0] {
				inv.Args = inv.Args[1:]
				return s.Run(ctx, inv)
			}
		}
		return Usagef("unknown subcommand %q: want %s", inv.Args[0], want)
	}
}

// UsageError is returned for a bad command line; main prints the usage.
type UsageError struct{ Msg string }

func (e UsageError) Error() string { return e.Msg }

// Usagef returns a UsageError.
func Usagef(format string, args ...any) error {
	return UsageError{Msg: fmt.Sprintf(format, args...)}
}

// Common lists the variables every process reads.
var Common = []string{config.EnvDatabaseURL, config.EnvDBMaxConns.Name, config.EnvNATSURL, config.EnvLogFormat, config.EnvLogLevel}

// Join returns names and more as one list without repeats.
func Join(names []string, more ...string) []string {
	seen := map[string]bool{}
	var out []string
	for _, n := range append(append([]string{}, names...), more...) {
		if !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	return out
}

// Indent indents every line of s by two spaces.
func Indent(s string) string {
	return "  " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n  ")
}

// Execute runs cmd with its command-line arguments as the orderpipe binary
// does: failpoints armed from the environment, flags parsed (-h prints the
// usage), the Config read from the environment, SIGINT and SIGTERM ending
// ctx. It returns the exit status: 0, 1 for an error, 2 for a bad command
// line or environment (with the usage on stderr).
func Execute(cmd Command, args []string, stdout, stderr io.Writer) int {
	if err := failpoint.FromEnv(); err != nil {
		fmt.Fprintf(stderr, "orderpipe: %v\n", err)
		return 2
	}
	fs := flag.NewFlagSet("orderpipe "+cmd.Name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	printUsage := func() {
		fmt.Fprintf(fs.Output(), "usage: orderpipe %s %s\n\n%s\n", cmd.Name, cmd.Usage, cmd.Summary)
		hasFlags := false
		fs.VisitAll(func(*flag.Flag) { hasFlags = true })
		if hasFlags {
			fmt.Fprintln(fs.Output(), "\nFlags:")
			fs.PrintDefaults()
		}
		PrintEnv(fs.Output(), cmd.Env)
	}
	fs.Usage = func() {} // printed below, once, to the right stream
	if cmd.Setup != nil {
		cmd.Setup(fs)
	}
	if err := Parse(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(stdout)
			printUsage()
			return 0
		}
		fmt.Fprintf(stderr, "orderpipe %s: %v\n\n", cmd.Name, err)
		printUsage()
		return 2
	}
	cfg, err := config.FromEnv()
	if err != nil {
		fmt.Fprintf(stderr, "orderpipe %s: bad environment:\n%v\n", cmd.Name, err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err = cmd.Run(ctx, Invocation{Args: fs.Args(), Flags: fs, Stdout: stdout, Stderr: stderr, Config: cfg})
	var ue UsageError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp): // -h after an action (`clients create -h`)
		fs.SetOutput(stdout)
		printUsage()
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "orderpipe %s: %v\n\n", cmd.Name, err)
		printUsage()
		return 2
	default:
		fmt.Fprintf(stderr, "orderpipe %s: %v\n", cmd.Name, err)
		return 1
	}
}

// Parse parses args into fs as fs.Parse does, and is the one way orderpipe
// parses flags. It differs in three ways: a flag given twice is refused
// ("--limit given twice") in any form (-x 1, --x 1, --x=1, a boolean with
// or without a value), counting the flags set by an earlier Parse of fs
// (flags before an action and after it); every error but flag.ErrHelp,
// returned as is for -h, is a UsageError; and nothing is printed: fs's
// output and Usage are left unused, so the caller reports the error once.
func Parse(fs *flag.FlagSet, args []string) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var twice string
	values := map[*flag.Flag]flag.Value{}
	fs.VisitAll(func(f *flag.Flag) {
		values[f] = f.Value
		f.Value = onceValue{Value: f.Value, set: func(s string) error {
			if given[f.Name] {
				twice = f.Name
				return errGivenTwice
			}
			given[f.Name] = true
			return values[f].Set(s)
		}}
	})
	out, usage := fs.Output(), fs.Usage
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	err := fs.Parse(args)
	for f, v := range values { // the flags keep their types for the help
		f.Value = v
	}
	fs.SetOutput(out)
	fs.Usage = usage
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return err
	case twice != "":
		return Usagef("--%s given twice", twice)
	default:
		return Usagef("%v", err)
	}
}

var errGivenTwice = errors.New("given twice")

// onceValue is a flag's Value for the length of a Parse: set refuses a
// second value. It is a boolean flag if the Value is.
type onceValue struct {
	flag.Value
	set func(string) error
}

func (v onceValue) Set(s string) error { return v.set(s) }

func (v onceValue) IsBoolFlag() bool {
	b, ok := v.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

package cli_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"orderpipe/shared/cli"
	"orderpipe/shared/config"
	"orderpipe/shared/tooling/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func TestPrintEnvDocumentsEachVariable(t *testing.T) {
	var none bytes.Buffer
	cli.PrintEnv(&none, nil)
	if none.Len() != 0 {
		t.Fatalf("PrintEnv of no names wrote %q", none.String())
	}

	vars := config.Vars()
	if len(vars) == 0 {
		t.Fatal("config.Vars is empty")
	}
	names := []string{"ORDERPIPE_NOT_A_VARIABLE"}
	for _, v := range slices.Backward(vars) { // not in Vars' order: PrintEnv keeps the caller's
		names = append(names, v.Name)
	}
	var out bytes.Buffer
	cli.PrintEnv(&out, names)
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != len(names)+2 || lines[0] != "" || lines[1] != "Environment:" {
		t.Fatalf("PrintEnv output:\n%s\nwant a blank line, \"Environment:\" and one line per name (%d)", out.String(), len(names))
	}
	byName := map[string]config.Var{}
	for _, v := range vars {
		byName[v.Name] = v
	}
	for i, n := range names {
		line := lines[i+2]
		f := strings.Fields(line)
		if !strings.HasPrefix(line, "  ") || len(f) == 0 || f[0] != n {
			t.Errorf("line %d = %q, want variable %s", i, line, n)
			continue
		}
		v, ok := byName[n]
		if !ok {
			if strings.TrimSpace(line) != n {
				t.Errorf("undocumented %s: line %q, want the name alone", n, line)
			}
			continue
		}
		if v.Meaning == "" || !strings.Contains(line, v.Meaning) {
			t.Errorf("%s: line %q lacks its meaning %q", n, line, v.Meaning)
		}
		if def := "(default: " + v.Default + ")"; v.Default != "" && !strings.HasSuffix(line, def) {
			t.Errorf("%s: line %q does not end with %q", n, line, def)
		}
		if v.Default == "" && strings.Contains(line, "(default:") {
			t.Errorf("%s has no default, line %q shows one", n, line)
		}
	}
}

func TestPrintEnvCommon(t *testing.T) {
	var out bytes.Buffer
	cli.PrintEnv(&out, cli.Common)
	for _, n := range []string{config.EnvDatabaseURL, config.EnvNATSURL, config.EnvLogFormat, config.EnvLogLevel} {
		if !strings.Contains(out.String(), "  "+n+" ") {
			t.Errorf("PrintEnv(Common) lacks %s:\n%s", n, out.String())
		}
	}
	if !strings.Contains(out.String(), "PostgreSQL connection string (default: dev: the managed local server)") {
		t.Errorf("DATABASE_URL's meaning and default missing:\n%s", out.String())
	}
}

func TestUsagefReturnsAUsageError(t *testing.T) {
	err := cli.Usagef("unknown flag %q (%d)", "--x", 2)
	var ue cli.UsageError
	if !errors.As(err, &ue) {
		t.Fatalf("Usagef returned %T, want a cli.UsageError", err)
	}
	if want := `unknown flag "--x" (2)`; ue.Msg != want || err.Error() != want {
		t.Fatalf("message %q / %q, want %q", ue.Msg, err.Error(), want)
	}
	wrapped := fmt.Errorf("seed: %w", err)
	if !errors.As(wrapped, &ue) {
		t.Fatal("a wrapped UsageError is not found by errors.As")
	}
	if errors.As(errors.New("plain"), &ue) {
		t.Fatal("a plain error matched UsageError")
	}
}

func TestJoin(t *testing.T) {
	for _, tc := range []struct {
		names, more, want []string
	}{
		{nil, nil, nil},
		{[]string{"A"}, nil, []string{"A"}},
		{[]string{"A", "B", "A"}, []string{"B", "C", "A", "C"}, []string{"A", "B", "C"}},
		{nil, []string{"C", "B", "C"}, []string{"C", "B"}},
		{[]string{"B", "A"}, []string{"A", "B"}, []string{"B", "A"}},
	} {
		if got := cli.Join(tc.names, tc.more...); !slices.Equal(got, tc.want) {
			t.Errorf("Join(%v, %v) = %v, want %v", tc.names, tc.more, got, tc.want)
		}
	}
	// Join never writes into the caller's slice (cli.Common is shared by
	// every command).
	names := make([]string, 1, 4)
	names[0] = "A"
	_ = cli.Join(names, "B", "C")
	if spare := names[:3]; spare[1] != "" || spare[2] != "" {
		t.Fatalf("Join wrote into its argument's spare capacity: %q", spare)
	}
	common := slices.Clone(cli.Common)
	_ = cli.Join(cli.Common, "X")
	if !slices.Equal(common, cli.Common) {
		t.Fatalf("Join changed cli.Common: %v, was %v", cli.Common, common)
	}
}

func TestIndent(t *testing.T) {
	testenv.Mapping(t, "Indent", cli.Indent, map[string]string{
		"":           "  ",
		"a":          "  a",
		"a\nb":       "  a\n  b",
		"a\nb\n\n":   "  a\n  b",
		"a\n\nb":     "  a\n  \n  b",
		"  x\n  y\n": "    x\n    y",
	})
}

// Subcommands runs the named one with the arguments after its name; a
// missing or unknown name is a usage error listing the subcommands.
func TestSubcommands(t *testing.T) {
	var got []string
	sub := func(name string) cli.Sub {
		return cli.Sub{Name: name, Run: func(_ context.Context, inv cli.Invocation) error {
			got = append([]string{name}, inv.Args...)
			return nil
		}}
	}
	run := cli.Subcommands(sub("list"), sub("show"), sub("resend"))
	if err := run(t.Context(), cli.Invocation{Args: []string{"show", "a", "b"}}); err != nil || !slices.Equal(got, []string{"show", "a", "b"}) {
		t.Fatalf("show a b: ran %q, err %v", got, err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "want a subcommand: list, show or resend"},
		{[]string{"follow", "x"}, `unknown subcommand "follow": want list, show or resend`},
	} {
		err := run(t.Context(), cli.Invocation{Args: c.args})
		var ue cli.UsageError
		if !errors.As(err, &ue) || err.Error() != c.want {
			t.Errorf("%q: err %v, want the usage error %q", c.args, err, c.want)
		}
	}
	if err := cli.Subcommands(sub("tail"), sub("asyncapi"))(t.Context(), cli.Invocation{}); err == nil || err.Error() != "want a subcommand: tail or asyncapi" {
		t.Errorf("two subcommands: err %v", err)
	}
}

// flagSet returns a FlagSet with an int, a bool and a string flag whose
// output and Usage record whether anything was printed.
func flagSet(printed *bytes.Buffer) (*flag.FlagSet, *int, *bool) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(printed)
	fs.Usage = func() { printed.WriteString("usage called\n") }
	n := fs.Int("n", 0, "a number")
	b := fs.Bool("b", false, "a switch")
	fs.String("s", "", "a text")
	fs.Duration("d", time.Second, "a duration")
	return fs, n, b
}

// Parse refuses a flag given twice in any of the forms flag accepts
// (-x 1, --x 1, --x=1, and a boolean with or without a value), and in two
// Parse calls on one FlagSet (flags before and after an action); every
// other error is a UsageError too, -h is flag.ErrHelp, and nothing is
// printed.
func TestParse(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--n=1", "--n=2"}, "--n given twice"},
		{[]string{"-n", "1", "-n", "2"}, "--n given twice"},
		{[]string{"--n", "1", "--n", "2"}, "--n given twice"},
		{[]string{"-n=1", "--s", "x", "--n", "1"}, "--n given twice"},
		{[]string{"--b", "--b"}, "--b given twice"},
		{[]string{"--b=false", "-b"}, "--b given twice"},
		{[]string{"-b", "--n", "1", "--b=true"}, "--b given twice"},
		{[]string{"--s=", "--s="}, "--s given twice"},
		{[]string{"--nope"}, "flag provided but not defined: -nope"},
		{[]string{"--n", "many"}, `invalid value "many" for flag -n: parse error`},
		{[]string{"--n"}, "flag needs an argument: -n"},
	} {
		var printed bytes.Buffer
		fs, _, _ := flagSet(&printed)
		err := cli.Parse(fs, c.args)
		var ue cli.UsageError
		if !errors.As(err, &ue) || err.Error() != c.want {
			t.Errorf("%q: err %v, want the usage error %q", c.args, err, c.want)
		}
		if printed.Len() > 0 {
			t.Errorf("%q: printed %q", c.args, printed.String())
		}
	}

	var printed bytes.Buffer
	fs, n, b := flagSet(&printed)
	var before bytes.Buffer
	fs.SetOutput(&before)
	fs.PrintDefaults()
	fs.SetOutput(&printed)
	if err := cli.Parse(fs, []string{"--n=1", "list", "--n=2"}); err != nil || *n != 1 || !slices.Equal(fs.Args(), []string{"list", "--n=2"}) {
		t.Fatalf("flags before an action: err %v, n %d, args %q", err, *n, fs.Args())
	}
	// The action's own arguments, parsed again on the same FlagSet.
	if err := cli.Parse(fs, []string{"--b", "--n=2"}); err == nil || err.Error() != "--n given twice" {
		t.Fatalf("--n before and after the action: err %v", err)
	}
	if !*b {
		t.Fatalf("--b, given once, was not set")
	}
	if err := cli.Parse(fs, []string{"-h"}); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v, want flag.ErrHelp", err)
	}
	if printed.Len() > 0 {
		t.Fatalf("printed %q", printed.String())
	}
	// The flags keep their types: the help text is the same as before.
	var after bytes.Buffer
	fs.SetOutput(&after)
	fs.PrintDefaults()
	if after.String() != before.String() || !strings.Contains(after.String(), "-n int") {
		t.Fatalf("help after Parse:\n%s\nbefore:\n%s", after.String(), before.String())
	}
}

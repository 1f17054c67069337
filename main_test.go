package main

import (
	"bytes"
	"flag"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"

	"orderpipe/consumers"
	"orderpipe/consumers/webhook"
	"orderpipe/shared/config"
	"orderpipe/shared/failpoint"
	"orderpipe/shared/order"
	"orderpipe/shared/tooling/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// orderpipe runs the command line in-process and returns its exit code and
// what it printed.
func orderpipe(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// cleanEnv unsets every documented variable for the test, so that the
// machine's environment (a DATABASE_URL, a log level) cannot change what the
// command line does.
func cleanEnv(t *testing.T) {
	t.Helper()
	for _, v := range config.Vars() {
		t.Setenv(v.Name, "")
		os.Unsetenv(v.Name)
	}
}

// The commands that issue 2 and the parts' issues promise; each part adds
// itself to commands() as it lands.
var wantCommands = []string{"dev", "migrate", "producer", "consumers", "compensator", "psp", "clients"}

func TestHelpListsEveryCommandAndVariable(t *testing.T) {
	cleanEnv(t)
	for _, args := range [][]string{nil, {"help"}, {"-h"}, {"--help"}, {"help", "help"}, {"help", "-h"}, {"-h", "-h"}, {"--help", "help"}} {
		code, out, errOut := orderpipe(t, args...)
		if code != 0 || errOut != "" {
			t.Fatalf("orderpipe %v: exit %d, stderr %q", args, code, errOut)
		}
		for _, c := range commands() {
			if !strings.Contains(out, "\n  "+c.Name+" ") || !strings.Contains(out, c.Summary) {
				t.Errorf("orderpipe %v does not list %s with its summary:\n%s", args, c.Name, out)
			}
		}
		for _, v := range config.Vars() {
			if !strings.Contains(out, v.Name) || v.Meaning == "" || !strings.Contains(out, v.Meaning) {
				t.Errorf("orderpipe %v does not document %s (meaning %q)", args, v.Name, v.Meaning)
			}
		}
	}
	names := map[string]bool{}
	for _, c := range commands() {
		if names[c.Name] {
			t.Errorf("command %s is listed twice", c.Name)
		}
		names[c.Name] = true
		if c.Summary == "" || c.Run == nil {
			t.Errorf("command %s lacks a summary or a Run", c.Name)
		}
	}
	for _, want := range wantCommands {
		if !names[want] {
			t.Errorf("command %s is not in commands() yet", want)
		}
	}
}

func TestEveryCommandDescribesItself(t *testing.T) {
	cleanEnv(t)
	documented := map[string]bool{}
	for _, v := range config.Vars() {
		documented[v.Name] = true
	}
	for _, c := range commands() {
		for _, args := range [][]string{{c.Name, "-h"}, {c.Name, "--help"}, {"help", c.Name}} {
			code, out, errOut := orderpipe(t, args...)
			if code != 0 {
				t.Errorf("orderpipe %s: exit %d, stderr:\n%s", strings.Join(args, " "), code, errOut)
				continue
			}
			if !strings.HasPrefix(out, "usage: orderpipe "+c.Name) || !strings.Contains(out, c.Summary) {
				t.Errorf("orderpipe %s: want the usage line and summary, got:\n%s", strings.Join(args, " "), out)
			}
			if len(c.Env) > 0 && !strings.Contains(out, "\nEnvironment:\n") {
				t.Errorf("orderpipe %s does not list its environment:\n%s", strings.Join(args, " "), out)
			}
			for _, name := range c.Env {
				if !strings.Contains(out, "  "+name+" ") {
					t.Errorf("orderpipe %s does not print its variable %s:\n%s", strings.Join(args, " "), name, out)
				}
			}
		}
		for _, name := range c.Env {
			if !documented[name] {
				t.Errorf("command %s reads %s, which is not registered with config.Register (so `help` cannot explain it)", c.Name, name)
			}
		}
	}
}

// TestHelpAfterAnAction: -h after a command's action prints the usage and
// exits 0, as -h before it does.
func TestHelpAfterAnAction(t *testing.T) {
	cleanEnv(t)
	for _, args := range [][]string{{"clients", "create", "-h"}, {"dlq", "list", "-h"}, {"bench", "intake", "-h"}, {"events", "tail", "-h"}, {"webhooks", "list", "-h"}, {"orders", "stats", "-h"}} {
		code, out, errOut := orderpipe(t, args...)
		if code != 0 || !strings.HasPrefix(out, "usage: orderpipe "+args[0]) {
			t.Errorf("orderpipe %s: exit %d, want 0 and the usage on stdout; stdout %q stderr %q", strings.Join(args, " "), code, out, errOut)
		}
	}
}

func TestUnknownCommand(t *testing.T) {
	cleanEnv(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"frobnicate"}, "unknown command"},
		{[]string{"Migrate"}, "unknown command"},
		{[]string{"--verbose"}, "unknown command"},
		{[]string{""}, "unknown command"},
		{[]string{"help", "frobnicate"}, "unknown command"},
		{[]string{"help", "migrate", "extra", "junk"}, `help takes one command, got "migrate extra junk"`},
		{[]string{"--help", "migrate", "up"}, `help takes one command, got "migrate up"`},
	} {
		code, out, errOut := orderpipe(t, c.args...)
		if code != 2 {
			t.Errorf("orderpipe %q: exit %d, want 2", c.args, code)
		}
		if out != "" || !strings.Contains(errOut, c.want) || !strings.Contains(errOut, "Commands:") {
			t.Errorf("orderpipe %q: want %q and the command list on stderr; stdout %q stderr %q", c.args, c.want, out, errOut)
		}
	}
}

func TestBadFlags(t *testing.T) {
	cleanEnv(t)
	for _, c := range commands() {
		for _, args := range [][]string{{c.Name, "--no-such-flag"}, {c.Name, "-no-such-flag=1"}, {c.Name, "---"}} {
			code, out, errOut := orderpipe(t, args...)
			if code != 2 {
				t.Errorf("orderpipe %s: exit %d, want 2 (stderr %q)", strings.Join(args, " "), code, errOut)
			}
			if out != "" || !strings.Contains(errOut, "usage: orderpipe "+c.Name) {
				t.Errorf("orderpipe %s: want the usage on stderr and nothing on stdout; stdout %q stderr %q", strings.Join(args, " "), out, errOut)
			}
		}
	}
	// A flag given twice, in any command that has flags: its first flag,
	// repeated. -h comes last so that a build that let the repetition
	// through prints the help instead of running the command.
	for _, c := range commands() {
		if c.Setup == nil {
			continue
		}
		fs := flag.NewFlagSet(c.Name, flag.ContinueOnError)
		c.Setup(fs)
		var arg, name string
		fs.VisitAll(func(f *flag.Flag) {
			if name != "" {
				return
			}
			name, arg = f.Name, "--"+f.Name+"="+f.DefValue
			if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
				arg = "--" + f.Name
			}
		})
		args := []string{c.Name, arg, arg, "-h"}
		code, out, errOut := orderpipe(t, args...)
		if code != 2 || out != "" || !strings.Contains(errOut, "--"+name+" given twice") || !strings.Contains(errOut, "usage: orderpipe "+c.Name) {
			t.Errorf("orderpipe %s: exit %d, stdout %q, stderr %q; want 2 and %q with the usage", strings.Join(args, " "), code, out, errOut, "--"+name+" given twice")
		}
	}
	// The flags that follow an action or a subcommand, and a flag given
	// both before and after its action. The servers refuse at once, so a
	// build that let the repetition through fails fast.
	closed := strconv.Itoa(testenv.ClosedPort(t))
	t.Setenv(config.EnvDatabaseURL, "postgres://postgres@127.0.0.1:"+closed+"/x?sslmode=disable&connect_timeout=2")
	t.Setenv(config.EnvNATSURL, "nats://127.0.0.1:"+closed)
	t.Setenv(config.EnvDataDir, t.TempDir()) // no dev.env
	id := uuid.NewString()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"dlq", "list", "--limit", "0", "--limit", "5"}, "--limit given twice"},
		{[]string{"dlq", "--limit", "5", "list", "--limit", "5"}, "--limit given twice"},
		{[]string{"dlq", "list", "--json", "--json=false"}, "--json given twice"},
		{[]string{"clients", "set-rate-limit", "--id", id, "--rate-limit", "50", "--rate-limit", "0"}, "--rate-limit given twice"},
		{[]string{"clients", "--name", "a", "create", "--name", "b"}, "--name given twice"},
		{[]string{"bench", "intake", "--concurrency", "1", "--concurrency=2"}, "--concurrency given twice"},
		{[]string{"bench", "--duration", "1s", "baseline", "--duration", "1s"}, "--duration given twice"},
		{[]string{"events", "tail", "--count", "1", "--count", "2"}, "--count given twice"},
		{[]string{"events", "tail", "--json", "--json"}, "--json given twice"},
		{[]string{"webhooks", "list", "--order", id, "--order", id}, "--order given twice"},
		{[]string{"orders", "stats", "--stuck-after", "1m", "--stuck-after=2m"}, "--stuck-after given twice"},
		{[]string{"compensator", "--once", "--dry-run", "--once"}, "--once given twice"},
		{[]string{"psp", "--hang", "1s", "-hang", "2s"}, "--hang given twice"},
	} {
		code, out, errOut := orderpipe(t, c.args...)
		if code != 2 || out != "" || !strings.Contains(errOut, c.want) {
			t.Errorf("orderpipe %s: exit %d, stdout %q, stderr %q; want 2 and %q", strings.Join(c.args, " "), code, out, errOut, c.want)
		}
	}
	// A flag with a malformed value.
	code, _, errOut := orderpipe(t, "probe", "--timeout", "soon")
	if code != 2 || !strings.Contains(errOut, "invalid value") {
		t.Errorf("probe --timeout soon: exit %d, stderr %q", code, errOut)
	}
	// dev runs only parts it has, each once, and says which it has.
	for _, args := range [][]string{{"dev", "producr"}, {"dev", "producer", "producer"}} {
		code, _, errOut := orderpipe(t, args...)
		if code != 2 || !strings.Contains(errOut, "part") || !strings.Contains(errOut, "usage: orderpipe dev") {
			t.Errorf("orderpipe %v: exit %d, stderr %q; want 2 naming the parts", args, code, errOut)
		}
	}
	if _, _, errOut := orderpipe(t, "dev", "producr"); !strings.Contains(errOut, "producer, psp, consumers, compensator, webhooks") {
		t.Errorf("dev producr: the error should list the parts: %q", errOut)
	}
}

func TestBadEnvironment(t *testing.T) {
	for _, tc := range []struct{ name, value string }{
		{config.EnvLogLevel, "loud"},
		{config.EnvLogFormat, "xml"},
		{config.EnvStreamReplicas, "2"},
		{config.EnvStreamReplicas, "three"},
		{config.EnvShutdownTimeout, "-5s"},
		{config.EnvShutdownTimeout, "forever"},
		{config.EnvAllowPrivateCallbacks, "maybe"},
		{config.EnvPSPURL, "psp:8090"},
		{config.EnvPSPURL, "localhost:8090"},
		{config.EnvPSPURL, "ftp://x"},
		{config.EnvPSPURL, "http://"},
	} {
		t.Run(tc.name+"="+tc.value, func(t *testing.T) {
			cleanEnv(t)
			// Servers that refuse at once: a command that let the value
			// through fails on them quickly instead of starting.
			closed := strconv.Itoa(testenv.ClosedPort(t))
			t.Setenv(config.EnvDatabaseURL, "postgres://postgres@127.0.0.1:"+closed+"/x?sslmode=disable&connect_timeout=2")
			t.Setenv(config.EnvNATSURL, "nats://127.0.0.1:"+closed)
			t.Setenv(tc.name, tc.value)
			for _, cmd := range []string{"migrate", "dev", "probe", "consumers", "compensator"} {
				args := []string{cmd}
				if cmd == "migrate" {
					args = append(args, "status")
				}
				code, out, errOut := orderpipe(t, args...)
				if code != 2 {
					t.Errorf("orderpipe %v with %s=%s: exit %d, want 2 (stderr %q)", args, tc.name, tc.value, code, errOut)
				}
				if out != "" || !strings.Contains(errOut, "bad environment") || !strings.Contains(errOut, tc.name) || !strings.Contains(errOut, tc.value) {
					t.Errorf("orderpipe %v with %s=%s: want a message naming the variable and value on stderr; stdout %q stderr %q", args, tc.name, tc.value, out, errOut)
				}
			}
		})
	}
}

// `orderpipe consumers` reads and checks its own settings, the webhook
// worker's too, before it connects to anything: a bad value is exit 2
// naming it, not a connection error. -h lists them.
func TestConsumersCheckTheirSettingsFirst(t *testing.T) {
	cleanEnv(t)
	_, help, _ := orderpipe(t, "consumers", "-h")
	for _, n := range []string{webhook.EnvConcurrency.Name, webhook.EnvPerClient.Name, webhook.EnvTimeout.Name, consumers.EnvWorkers.Name} {
		if !strings.Contains(help, "  "+n+" ") {
			t.Errorf("consumers -h does not list %s:\n%s", n, help)
		}
	}
	for _, tc := range []struct{ name, value string }{
		{webhook.EnvTimeout.Name, "soon"},
		{webhook.EnvTimeout.Name, "0"},
		{webhook.EnvConcurrency.Name, "0"},
		{webhook.EnvPerClient.Name, "33"}, // more than ORDERPIPE_WEBHOOK_CONCURRENCY's 32
		{consumers.EnvWorkers.Name, "0"},
	} {
		t.Run(tc.name+"="+tc.value, func(t *testing.T) {
			cleanEnv(t)
			closed := strconv.Itoa(testenv.ClosedPort(t))
			t.Setenv(config.EnvDatabaseURL, "postgres://postgres@127.0.0.1:"+closed+"/x?sslmode=disable&connect_timeout=2")
			t.Setenv(config.EnvNATSURL, "nats://127.0.0.1:"+closed)
			t.Setenv(config.EnvPSPURL, "http://127.0.0.1:"+closed)
			t.Setenv(tc.name, tc.value)
			code, out, errOut := orderpipe(t, "consumers")
			if code != 2 || out != "" || !strings.Contains(errOut, tc.name) || !strings.Contains(errOut, tc.value) || strings.Contains(errOut, "connect to PostgreSQL") || strings.Contains(errOut, "dial") {
				t.Errorf("exit %d, stdout %q, stderr %q; want 2 naming %s=%s before any connection", code, out, errOut, tc.name, tc.value)
			}
		})
	}
}

// A malformed ORDERPIPE_FAILPOINTS stops the binary at start with exit 2,
// naming the variable; no library exits the process on it.
func TestBadFailpoints(t *testing.T) {
	cleanEnv(t)
	t.Setenv(failpoint.EnvVar, "intake.after-commit=boom")
	code, out, errOut := orderpipe(t, "migrate", "status")
	if code != 2 || out != "" || !strings.Contains(errOut, failpoint.EnvVar) || !strings.Contains(errOut, "boom") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

func TestMigrateCommandLine(t *testing.T) {
	cleanEnv(t)
	// Bad command lines are refused before any connection is tried.
	for _, args := range [][]string{{"migrate"}, {"migrate", "sideways"}, {"migrate", "up", "down"}, {"migrate", ""}, {"migrate", "UP"}} {
		code, out, errOut := orderpipe(t, args...)
		if code != 2 {
			t.Errorf("orderpipe %q: exit %d, want 2 (stderr %q)", args, code, errOut)
		}
		if out != "" || !strings.Contains(errOut, "usage: orderpipe migrate") {
			t.Errorf("orderpipe %q: want the usage on stderr; stdout %q stderr %q", args, out, errOut)
		}
	}
	// A good command line without a database says what to set.
	code, _, errOut := orderpipe(t, "migrate", "status")
	if code != 1 || !strings.Contains(errOut, "DATABASE_URL") {
		t.Errorf("migrate status without DATABASE_URL: exit %d, stderr %q", code, errOut)
	}
}

func TestMigrateAgainstARealDatabase(t *testing.T) {
	cleanEnv(t)
	db := testenv.EmptyDB(t)
	t.Setenv(config.EnvDatabaseURL, db.URL)

	code, out, errOut := orderpipe(t, "migrate", "status")
	if code != 0 || !strings.Contains(out, "pending") || strings.Contains(out, "applied") {
		t.Fatalf("migrate status on an empty database: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = orderpipe(t, "migrate", "up")
	if code != 0 || !strings.Contains(out, "migrate up: done") || strings.Contains(out, "pending") {
		t.Fatalf("migrate up: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = orderpipe(t, "migrate", "up")
	if code != 0 {
		t.Fatalf("a second migrate up: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = orderpipe(t, "migrate", "down")
	if code != 0 || strings.Count(out, "pending") != 1 {
		t.Fatalf("migrate down: want exactly the newest pending; exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = orderpipe(t, "migrate", "reset")
	if code != 0 || strings.Contains(out, "applied") {
		t.Fatalf("migrate reset: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = orderpipe(t, "migrate", "up")
	if code != 0 || strings.Contains(out, "pending") {
		t.Fatalf("migrate up after reset: exit %d\n%s%s", code, out, errOut)
	}
}

func TestMigrateUnreachableDatabase(t *testing.T) {
	cleanEnv(t)
	t.Setenv(config.EnvDatabaseURL, "postgres://postgres@127.0.0.1:"+strconv.Itoa(testenv.ClosedPort(t))+"/x?sslmode=disable&connect_timeout=2")
	code, out, errOut := orderpipe(t, "migrate", "up")
	if code != 1 || out != "" || !strings.Contains(errOut, "connect to PostgreSQL") {
		t.Fatalf("migrate up with nothing listening: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

func TestProbe(t *testing.T) {
	cleanEnv(t)
	var status atomic.Int32
	status.Store(http.StatusOK)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(int(status.Load()))
	}))
	defer srv.Close()

	code, out, errOut := orderpipe(t, "probe", srv.URL+"/healthz")
	if code != 0 || !strings.Contains(out, "200") {
		t.Fatalf("probe of a healthy server: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	// Without a URL it asks its own HTTP_ADDR's /healthz.
	t.Setenv(config.EnvHTTPAddr, srv.Listener.Addr().String())
	if code, _, errOut := orderpipe(t, "probe"); code != 0 {
		t.Fatalf("probe of HTTP_ADDR: exit %d, stderr %q", code, errOut)
	}
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	t.Setenv(config.EnvHTTPAddr, ":"+port)
	if code, _, errOut := orderpipe(t, "probe"); code != 0 {
		t.Fatalf("probe of HTTP_ADDR :%s: exit %d, stderr %q", port, code, errOut)
	}

	status.Store(http.StatusServiceUnavailable)
	if code, _, errOut := orderpipe(t, "probe", "--timeout", "2s", srv.URL+"/healthz"); code != 1 || !strings.Contains(errOut, "503") {
		t.Fatalf("probe of an unhealthy server: exit %d, stderr %q", code, errOut)
	}
	if code, _, errOut := orderpipe(t, "probe", "http://127.0.0.1:"+strconv.Itoa(testenv.ClosedPort(t))+"/healthz"); code != 1 || !strings.Contains(errOut, "refused") {
		t.Fatalf("probe of a closed port: exit %d, stderr %q", code, errOut)
	}
	for _, args := range [][]string{
		{"probe", "not a url"}, {"probe", "ftp://x/healthz"}, {"probe", "http:///healthz"},
		{"probe", srv.URL, srv.URL}, {"probe", "--timeout", "0s", srv.URL}, {"probe", "--timeout", "-1s", srv.URL},
	} {
		if code, _, errOut := orderpipe(t, args...); code != 2 || !strings.Contains(errOut, "usage: orderpipe probe") {
			t.Errorf("orderpipe %q: exit %d, want 2 with usage; stderr %q", args, code, errOut)
		}
	}
}

func TestHealthURL(t *testing.T) {
	t.Parallel()
	testenv.Mapping(t, "healthURL", healthURL, map[string]string{
		":8080":          "http://127.0.0.1:8080/healthz",
		"0.0.0.0:9090":   "http://127.0.0.1:9090/healthz",
		"[::]:9090":      "http://127.0.0.1:9090/healthz",
		"10.0.0.5:8081":  "http://10.0.0.5:8081/healthz",
		"[::1]:8081":     "http://[::1]:8081/healthz",
		"localhost:8080": "http://localhost:8080/healthz",
	})
}

// FuzzHealthURL: whatever HTTP_ADDR holds, probe's default target is an
// http URL of /healthz, and a valid host:port keeps its port.
func FuzzHealthURL(f *testing.F) {
	for _, seed := range []string{":8080", "0.0.0.0:1", "[::]:9090", "[::1]:80", "host", "", "[", "a:b:c", "%zz:1"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, addr string) {
		got := healthURL(addr)
		if !strings.HasPrefix(got, "http://") || !strings.HasSuffix(got, "/healthz") {
			t.Fatalf("healthURL(%q) = %q", addr, got)
		}
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return
		}
		if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 || strconv.Itoa(n) != port {
			return // not a port: probe refuses the URL as a usage error
		}
		if net.ParseIP(host) == nil && strings.Trim(host, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-") != "" {
			return // not a host name either
		}
		u, err := url.Parse(got)
		if err != nil {
			t.Fatalf("healthURL(%q) = %q does not parse: %v", addr, got, err)
		}
		if u.Port() != port {
			t.Fatalf("healthURL(%q) = %q: port %q, want %q", addr, got, u.Port(), port)
		}
	})
}

// readFile returns the text of the repository's file name.
func readFile(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestReadmeStateDiagram holds the README's state diagram against the state
// machine in shared/order: the same moves, no more, no fewer; the initial
// state and the final ones as the code has them.
func TestReadmeStateDiagram(t *testing.T) {
	t.Parallel()
	text := readFile(t, "README.md")
	i := strings.Index(text, "```mermaid\nstateDiagram-v2\n")
	if i < 0 {
		t.Fatal("README.md has no ```mermaid stateDiagram-v2 block")
	}
	block, _, ok := strings.Cut(text[i+len("```mermaid\nstateDiagram-v2\n"):], "```")
	if !ok {
		t.Fatal("README.md's state diagram is not closed")
	}
	if !strings.Contains(text, "```mermaid\nflowchart") {
		t.Error("README.md has no Mermaid diagram of the flow")
	}
	drawn := map[[2]string]bool{}
	for _, line := range strings.Split(block, "\n") {
		edge, _, _ := strings.Cut(strings.TrimSpace(line), ":")
		from, to, ok := strings.Cut(edge, "-->")
		if !ok {
			continue
		}
		drawn[[2]string{strings.TrimSpace(from), strings.TrimSpace(to)}] = true
	}
	for _, from := range order.Statuses() {
		for _, to := range order.Statuses() {
			if got, want := drawn[[2]string{string(from), string(to)}], order.CanMove(from, to); got != want {
				t.Errorf("README state diagram: %s --> %s drawn=%v, but order.CanMove=%v", from, to, got, want)
			}
		}
		if got, want := drawn[[2]string{string(from), "[*]"}], from.Terminal(); got != want {
			t.Errorf("README state diagram: %s final=%v, but Terminal()=%v", from, got, want)
		}
		if got, want := drawn[[2]string{"[*]", string(from)}], from == order.StatusProcessing; got != want {
			t.Errorf("README state diagram: [*] --> %s drawn=%v, want %v", from, got, want)
		}
	}
}

// TestDevChecksThePartsSettingsFirst: dev refuses a bad value of any part's
// own setting (exit 2, naming it) before it starts anything. Before, it
// started PostgreSQL, NATS and the parts before the one that read it, and
// failed there.
func TestDevChecksThePartsSettingsFirst(t *testing.T) {
	for _, tc := range []struct{ name, value string }{
		{"ORDERPIPE_INTAKE_TIMEOUT", "soon"},
		{"ORDERPIPE_DEV_PSP_LATENCY", "slow"},
		{"ORDERPIPE_CONSUMER_WORKERS", "many"},
		{"ORDERPIPE_CONSUMER_MAX_DELIVER", "1"},
		{"ORDERPIPE_PSP_TIMEOUT", "-1s"},
		{"ORDERPIPE_WEBHOOK_CONCURRENCY", "0"},
	} {
		t.Run(tc.name+"="+tc.value, func(t *testing.T) {
			cleanEnv(t)
			dir := t.TempDir()
			t.Setenv(config.EnvDataDir, dir)
			t.Setenv(tc.name, tc.value)
			code, out, errOut := orderpipe(t, "dev")
			if code != 2 || out != "" || !strings.Contains(errOut, "bad environment") || !strings.Contains(errOut, tc.name) || !strings.Contains(errOut, tc.value) {
				t.Errorf("dev with %s=%s: exit %d, stdout %q, stderr %q; want 2 and a message naming the variable and value", tc.name, tc.value, code, out, errOut)
			}
			if entries, _ := os.ReadDir(dir); len(entries) > 0 {
				t.Errorf("dev with %s=%s started something first: %s holds %v", tc.name, tc.value, dir, entries)
			}
		})
	}
}

// TestHelpListsWhatThePartsRead: `producer -h` lists every variable the
// intake reads (ORDERPIPE_TOKEN_TTL was missing), `mcp -h` those its
// intake service reads, and `dev -h` those of every part it runs (it
// listed its own and the common ones only).
func TestHelpListsWhatThePartsRead(t *testing.T) {
	cleanEnv(t)
	for cmd, vars := range map[string][]string{
		"producer": {"ORDERPIPE_INTAKE_TIMEOUT", "ORDERPIPE_RATE_LIMIT", "ORDERPIPE_TOKEN_TTL"},
		"mcp":      {"ORDERPIPE_API_KEY", "ORDERPIPE_INTAKE_TIMEOUT", "ORDERPIPE_TOKEN_TTL"},
		"dev": {"ORDERPIPE_INTAKE_TIMEOUT", "ORDERPIPE_TOKEN_TTL", "ORDERPIPE_DEV_PSP_LATENCY", "ORDERPIPE_PSP_TIMEOUT",
			"ORDERPIPE_CONSUMER_WORKERS", "ORDERPIPE_CONSUMER_MAX_DELIVER", "ORDERPIPE_WEBHOOK_CONCURRENCY", "ORDERPIPE_WEBHOOK_TIMEOUT"},
	} {
		code, out, _ := orderpipe(t, cmd, "-h")
		if code != 0 {
			t.Fatalf("%s -h: exit %d", cmd, code)
		}
		for _, v := range vars {
			if !strings.Contains(out, "\n  "+v+" ") {
				t.Errorf("%s -h does not list %s", cmd, v)
			}
		}
	}
}

// TestMCPChecksTheIntakesSettingsFirst: `orderpipe mcp` refuses a bad
// intake setting (exit 2, naming it) before it connects. Before, it
// connected first and failed after (exit 1), here on the closed port.
func TestMCPChecksTheIntakesSettingsFirst(t *testing.T) {
	cleanEnv(t)
	closed := strconv.Itoa(testenv.ClosedPort(t))
	t.Setenv(config.EnvDatabaseURL, "postgres://postgres@127.0.0.1:"+closed+"/x?sslmode=disable&connect_timeout=2")
	t.Setenv(config.EnvNATSURL, "nats://127.0.0.1:"+closed)
	t.Setenv("ORDERPIPE_API_KEY", "opk_whatever")
	for _, tc := range []struct{ name, value string }{
		{"ORDERPIPE_INTAKE_TIMEOUT", "soon"},
		{"ORDERPIPE_TOKEN_TTL", "0s"},
	} {
		t.Setenv(tc.name, tc.value)
		code, out, errOut := orderpipe(t, "mcp")
		if code != 2 || out != "" || !strings.Contains(errOut, "bad environment") || !strings.Contains(errOut, tc.name) || !strings.Contains(errOut, tc.value) {
			t.Errorf("mcp with %s=%s: exit %d, stdout %q, stderr %q; want 2 and a message naming the variable and value", tc.name, tc.value, code, out, errOut)
		}
		os.Unsetenv(tc.name)
	}
}

// TestPartsCheckThePaymentTimeoutFirst: `consumers` and `compensator`
// refuse a bad ORDERPIPE_PSP_TIMEOUT before they connect, naming it, as
// dev does. Before, both read it when they built the provider's client,
// after connecting: here they failed on the closed port instead.
func TestPartsCheckThePaymentTimeoutFirst(t *testing.T) {
	cleanEnv(t)
	closed := strconv.Itoa(testenv.ClosedPort(t))
	t.Setenv(config.EnvDatabaseURL, "postgres://postgres@127.0.0.1:"+closed+"/x?sslmode=disable&connect_timeout=2")
	t.Setenv(config.EnvNATSURL, "nats://127.0.0.1:"+closed)
	t.Setenv(config.EnvPSPURL, "http://127.0.0.1:"+closed)
	t.Setenv("ORDERPIPE_PSP_TIMEOUT", "-1s")
	for _, cmd := range []string{"consumers", "compensator"} {
		code, out, errOut := orderpipe(t, cmd)
		if code == 0 || out != "" || !strings.Contains(errOut, "ORDERPIPE_PSP_TIMEOUT") || !strings.Contains(errOut, "-1s") {
			t.Errorf("%s with ORDERPIPE_PSP_TIMEOUT=-1s: exit %d, stdout %q, stderr %q; want a failure naming the variable and value", cmd, code, out, errOut)
		}
	}
}

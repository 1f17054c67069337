package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	composecli "github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/nats-io/nats-server/v2/server"

	"orderpipe/shared/cli"
	"orderpipe/shared/config"
)

// No Docker engine runs where the tests do, so compose.yaml is checked by
// parsing it with the compose-spec library (the one `docker compose` uses)
// and holding it against the code: the commands in commands(), the
// variables in config.Vars() (package main imports every part, so every
// part's registrations have run), and each command's own Env list.

// loadCompose parses a compose file as `docker compose` would, with the
// project name set and ${VAR:-default} interpolated from env (none: the
// defaults are what is checked), never from the test process's own.
func loadCompose(t *testing.T, path string, env ...string) *types.Project {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	opts, err := composecli.NewProjectOptions([]string{path},
		composecli.WithName("orderpipe"),
		composecli.WithWorkingDirectory(wd),
		composecli.WithEnv(env),
		composecli.WithInterpolation(true),
	)
	if err != nil {
		t.Fatalf("compose options: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	p, err := opts.LoadProject(ctx)
	if err != nil {
		t.Fatalf("parse %s: %v", path, err)
	}
	return p
}

// thirdParty are the services that run someone else's image; their
// environment is that image's, not orderpipe's.
var thirdParty = map[string]bool{"postgres": true, "nats": true}

// Process-wide variables that every orderpipe command reads whether or not
// its Env list names them: the logger's, the stream's (every command that
// talks to NATS provisions the stream) and the drain bound (every command
// that serves HTTP drains on SIGTERM).
func implicitEnv(cmd cli.Command) []string {
	out := []string{config.EnvLogFormat, config.EnvLogLevel}
	if slices.Contains(cmd.Env, config.EnvNATSURL) {
		out = append(out, config.EnvStreamReplicas)
	}
	if slices.Contains(cmd.Env, config.EnvHTTPAddr) {
		out = append(out, config.EnvShutdownTimeout)
	}
	return out
}

func findCommand(name string) (cli.Command, bool) {
	for _, c := range commands() {
		if c.Name == name {
			return c, true
		}
	}
	return cli.Command{}, false
}

// parseArgs parses args (after the command's name) with the command's flags.
func parseArgs(cmd cli.Command, args []string) (*flag.FlagSet, error) {
	fs := flag.NewFlagSet(cmd.Name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	if cmd.Setup != nil {
		cmd.Setup(fs)
	}
	return fs, fs.Parse(args)
}

// listenAddr is where a service's part serves HTTP: its --addr flag when
// the command has one, else HTTP_ADDR when the command reads it.
func listenAddr(cmd cli.Command, s types.ServiceConfig) string {
	if fs, err := parseArgs(cmd, s.Command[1:]); err == nil {
		if f := fs.Lookup("addr"); f != nil {
			return f.Value.String()
		}
	}
	if slices.Contains(cmd.Env, config.EnvHTTPAddr) {
		if v := s.Environment[config.EnvHTTPAddr]; v != nil {
			return *v
		}
		return ":8080"
	}
	return ""
}

// oneShot reports whether a service runs once and exits (compose must not
// restart it, and others wait for it to complete).
func oneShot(s types.ServiceConfig) bool {
	return s.Restart == types.RestartPolicyNo
}

// checkCompose returns every way in which the project disagrees with the
// code or with the rules for depends_on and healthchecks.
func checkCompose(p *types.Project) []string {
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	registered := map[string]bool{}
	for _, v := range config.Vars() {
		registered[v.Name] = true
	}

	for _, want := range []string{"postgres", "nats", "migrate", "producer", "consumers", "compensator", "psp"} {
		if _, ok := p.Services[want]; !ok {
			bad("service %s is missing", want)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(p.Services)) {
		s := p.Services[name]

		// Every dependency waits for health or for a one-shot's success.
		for dep, d := range s.DependsOn {
			target, ok := p.Services[dep]
			switch {
			case !ok:
				bad("%s depends on unknown service %s", name, dep)
			case d.Condition == types.ServiceConditionHealthy:
				if target.HealthCheck == nil || target.HealthCheck.Disable || len(target.HealthCheck.Test) == 0 {
					bad("%s waits for %s to be healthy, but %s has no healthcheck", name, dep, dep)
				}
			case d.Condition == types.ServiceConditionCompletedSuccessfully:
				if !oneShot(target) {
					bad("%s waits for %s to complete, but %s is not one-shot (restart: \"no\")", name, dep, dep)
				}
			default:
				bad("%s depends on %s with condition %q: want service_healthy or service_completed_successfully", name, dep, d.Condition)
			}
		}

		if oneShot(s) {
			if s.Deploy != nil && s.Deploy.Replicas != nil && *s.Deploy.Replicas != 1 {
				bad("one-shot %s must run once, has %d replicas", name, *s.Deploy.Replicas)
			}
		} else if s.HealthCheck == nil || s.HealthCheck.Disable || len(s.HealthCheck.Test) == 0 {
			bad("long-running service %s has no healthcheck", name)
		}

		if thirdParty[name] {
			continue
		}

		// An orderpipe process: a real subcommand with flags it knows.
		if s.Build == nil && !strings.HasPrefix(s.Image, "orderpipe") {
			bad("%s is neither a known third-party service nor built from the Dockerfile", name)
			continue
		}
		if len(s.Entrypoint) > 0 {
			bad("%s overrides the image's entrypoint (orderpipe)", name)
		}
		if len(s.Command) == 0 {
			bad("%s has no command (an orderpipe subcommand)", name)
			continue
		}
		cmd, ok := findCommand(s.Command[0])
		if !ok {
			bad("%s runs `orderpipe %s`, which is not a command of commands()", name, s.Command[0])
			continue
		}
		if _, err := parseArgs(cmd, s.Command[1:]); err != nil {
			bad("%s: `orderpipe %s`: %v", name, strings.Join(s.Command, " "), err)
		}

		// Its environment names only what the code reads.
		if len(s.EnvFiles) > 0 {
			bad("%s uses env_file; list its variables under environment so they can be checked", name)
		}
		allowed := append(append([]string{}, cmd.Env...), implicitEnv(cmd)...)
		for _, k := range slices.Sorted(maps.Keys(s.Environment)) {
			v := s.Environment[k]
			switch {
			case !registered[k]:
				bad("%s sets %s, which no part of orderpipe reads (not in config.Vars())", name, k)
			case !slices.Contains(allowed, k):
				bad("%s sets %s, which `orderpipe %s` does not read (its Env: %v)", name, k, cmd.Name, cmd.Env)
			case v == nil:
				bad("%s passes %s through from the host; give it a value (or a ${VAR:-default})", name, k)
			}
		}
		for _, need := range []string{config.EnvDatabaseURL, config.EnvPSPURL} {
			if slices.Contains(cmd.Env, need) && s.Environment[need] == nil {
				bad("%s runs `orderpipe %s`, which needs %s, but does not set it", name, cmd.Name, need)
			}
		}

		if oneShot(s) {
			continue
		}
		// A long-running part: reachable from the other containers, health
		// asked where it listens, waits for the schema, drains within the
		// grace period compose gives it.
		listen := listenAddr(cmd, s)
		if host, _, err := net.SplitHostPort(listen); err != nil {
			bad("%s: cannot tell where `orderpipe %s` listens (%q): %v", name, cmd.Name, listen, err)
		} else if host != "" && host != "0.0.0.0" && host != "::" {
			bad("%s listens on %s, which other containers cannot reach", name, listen)
		}
		hc := s.HealthCheck
		if hc != nil && len(hc.Test) >= 3 && hc.Test[0] == "CMD" && hc.Test[1] == "orderpipe" {
			probe, ok := findCommand(hc.Test[2])
			if !ok {
				bad("%s's healthcheck runs `orderpipe %s`, not a command", name, hc.Test[2])
			} else if fs, err := parseArgs(probe, hc.Test[3:]); err != nil {
				bad("%s's healthcheck: %v", name, err)
			} else {
				target := ""
				if fs.NArg() > 0 {
					target = fs.Arg(0)
				} else if v := s.Environment[config.EnvHTTPAddr]; v != nil {
					target = healthURL(*v)
				} else {
					target = healthURL(":8080")
				}
				u, err := url.Parse(target)
				_, port, _ := net.SplitHostPort(listen)
				if err != nil || u.Port() != port || u.Path != "/healthz" {
					bad("%s's healthcheck asks %s, but the part serves /healthz on %s", name, target, listen)
				}
			}
		} else if hc != nil {
			bad("%s's healthcheck should be [CMD, orderpipe, probe ...] (the image has no shell tools), got %v", name, hc.Test)
		}
		if s.Restart == "" {
			bad("%s has no restart policy", name)
		}
		if dep, ok := s.DependsOn["migrate"]; !ok || dep.Condition != types.ServiceConditionCompletedSuccessfully {
			bad("%s does not wait for migrate to complete", name)
		}
		if s.Environment[config.EnvNATSURL] != nil {
			if _, ok := s.DependsOn["nats"]; !ok {
				bad("%s talks to NATS but does not wait for it", name)
			}
		}
		if u := s.Environment[config.EnvPSPURL]; u != nil && strings.Contains(*u, "//psp:") {
			if _, ok := s.DependsOn["psp"]; !ok {
				bad("%s calls the psp service but does not wait for it", name)
			}
		}
		if v := s.Environment[config.EnvShutdownTimeout]; v != nil {
			drain, err := time.ParseDuration(*v)
			if err == nil && (s.StopGracePeriod == nil || time.Duration(*s.StopGracePeriod) <= drain) {
				bad("%s drains for %s on SIGTERM but compose kills it after stop_grace_period %v", name, drain, s.StopGracePeriod)
			}
		}
	}
	return problems
}

func TestComposeMatchesTheCode(t *testing.T) {
	p := loadCompose(t, "compose.yaml")
	for _, problem := range checkCompose(p) {
		t.Error(problem)
	}

	migrate := p.Services["migrate"]
	if strings.Join(migrate.Command, " ") != "migrate up" || !oneShot(migrate) {
		t.Errorf("migrate must be the one-shot `orderpipe migrate up`, got %v restart=%q", migrate.Command, migrate.Restart)
	}
	for _, name := range []string{"producer", "consumers", "compensator", "psp"} {
		if d, ok := p.Services[name].DependsOn["migrate"]; !ok || d.Condition != types.ServiceConditionCompletedSuccessfully {
			t.Errorf("%s must wait for migrate with service_completed_successfully", name)
		}
		if d, ok := p.Services[name].DependsOn["postgres"]; !ok || d.Condition != types.ServiceConditionHealthy {
			t.Errorf("%s must wait for postgres with service_healthy", name)
		}
	}
	for name, want := range map[string]int{"producer": 2, "consumers": 2} {
		s := p.Services[name]
		if s.Deploy == nil || s.Deploy.Replicas == nil || *s.Deploy.Replicas != want {
			t.Errorf("%s: want deploy.replicas %d", name, want)
		}
	}

	pg := p.Services["postgres"]
	if !strings.HasPrefix(pg.Image, "postgres:") || pg.HealthCheck == nil || !slices.Contains(pg.HealthCheck.Test, "pg_isready") {
		t.Errorf("postgres: want the official image with a pg_isready healthcheck, got %s %v", pg.Image, pg.HealthCheck)
	}
	n := p.Services["nats"]
	if !strings.HasPrefix(n.Image, "nats:") || n.HealthCheck == nil ||
		!strings.Contains(strings.Join(n.HealthCheck.Test, " "), ":8222/healthz?js-enabled-only=true") {
		t.Errorf("nats: want the official image, healthy once JetStream is (monitoring port 8222), got %s %v", n.Image, n.HealthCheck)
	}
	mounted := false
	for _, v := range n.Volumes {
		if filepath.Base(v.Source) == "nats.conf" && filepath.Base(filepath.Dir(v.Source)) == "deploy" && slices.Contains(n.Command, v.Target) {
			mounted = true
		}
	}
	if !mounted {
		t.Errorf("nats must run with deploy/nats.conf mounted and passed with -c; volumes %v command %v", n.Volumes, n.Command)
	}
	// A single NATS server cannot hold a stream of 3 replicas.
	for name, s := range p.Services {
		if r := s.Environment[config.EnvStreamReplicas]; r != nil && *r != "1" {
			t.Errorf("%s asks for %s=%s, but compose runs one NATS server", name, config.EnvStreamReplicas, *r)
		}
	}
}

func TestComposeInterpolation(t *testing.T) {
	t.Parallel()
	p := loadCompose(t, "compose.yaml", "POSTGRES_PASSWORD=s3cret", "ORDERPIPE_LOG_LEVEL=debug", "ORDERPIPE_TAG=v1.2.3")
	if p.Name != "orderpipe" {
		t.Errorf("project name %q", p.Name)
	}
	for _, name := range []string{"migrate", "producer", "consumers", "compensator", "psp"} {
		s := p.Services[name]
		if u := s.Environment[config.EnvDatabaseURL]; u == nil || !strings.Contains(*u, ":s3cret@postgres:5432/") {
			t.Errorf("%s: DATABASE_URL does not carry POSTGRES_PASSWORD: %v", name, u)
		}
		if s.Image != "orderpipe:v1.2.3" {
			t.Errorf("%s: image %q, want orderpipe:${ORDERPIPE_TAG}", name, s.Image)
		}
	}
	if v := p.Services["producer"].Environment[config.EnvLogLevel]; v == nil || *v != "debug" {
		t.Errorf("producer: ORDERPIPE_LOG_LEVEL not taken from the environment: %v", v)
	}
	if v := p.Services["postgres"].Environment["POSTGRES_PASSWORD"]; v == nil || *v != "s3cret" {
		t.Errorf("postgres: POSTGRES_PASSWORD = %v", v)
	}
}

// TestComposeEnvironmentValues feeds each orderpipe service's environment
// to the same validation the processes run at start.
func TestComposeEnvironmentValues(t *testing.T) {
	p := loadCompose(t, "compose.yaml")
	for _, name := range slices.Sorted(maps.Keys(p.Services)) {
		s := p.Services[name]
		if thirdParty[name] {
			continue
		}
		t.Run(name, func(t *testing.T) {
			for _, v := range config.Vars() {
				t.Setenv(v.Name, "") // restored when the subtest ends
				os.Unsetenv(v.Name)
			}
			for k, v := range s.Environment {
				if v != nil {
					t.Setenv(k, *v)
				}
			}
			if _, err := config.FromEnv(); err != nil {
				t.Errorf("the environment compose gives %s does not validate:\n%v", name, err)
			}
		})
	}
}

// TestComposeCheckCatchesDrift proves that checkCompose notices each kind of
// drift, by breaking a copy of compose.yaml on purpose.
func TestComposeCheckCatchesDrift(t *testing.T) {
	t.Parallel()
	orig, err := os.ReadFile("compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, old, new, want string
	}{
		{"unknown variable", "  ORDERPIPE_LOG_FORMAT: json\n  ORDERPIPE_LOG_LEVEL",
			"  ORDERPIPE_LOG_FORMAT: json\n  ORDERPIPE_NO_SUCH_SETTING: \"1\"\n  ORDERPIPE_LOG_LEVEL", "ORDERPIPE_NO_SUCH_SETTING, which no part of orderpipe reads"},
		{"variable the command does not read", "      DATABASE_URL: *database-url\n    depends_on:", "      ORDERPIPE_DATA_DIR: /tmp\n      DATABASE_URL: *database-url\n    depends_on:", "migrate sets ORDERPIPE_DATA_DIR, which `orderpipe migrate` does not read"},
		{"unknown command", `command: ["migrate", "up"]`, `command: ["migrations", "up"]`, "not a command of commands()"},
		{"unknown flag", `command: ["migrate", "up"]`, `command: ["migrate", "--fast", "up"]`, "flag provided but not defined"},
		{"bare depends_on", "    depends_on:\n      postgres:\n        condition: service_healthy\n    restart: \"no\"",
			"    depends_on:\n      - postgres\n    restart: \"no\"", "condition \"service_started\""},
		{"missing healthcheck", "    healthcheck:\n      test: [\"CMD\", \"pg_isready\", \"-U\", \"orderpipe\", \"-d\", \"orderpipe\"]\n      interval: 5s\n      timeout: 5s\n      start_period: 30s\n      retries: 10\n", "",
			"long-running service postgres has no healthcheck"},
		{"migrate not one-shot", "    restart: \"no\"", "    restart: always", "not one-shot"},
		{"grace shorter than drain", "  stop_grace_period: 30s", "  stop_grace_period: 5s", "compose kills it after stop_grace_period"},
		{"part listening on loopback", `command: ["psp", "--addr", ":8080"]`, `command: ["psp"]`, "which other containers cannot reach"},
		{"healthcheck on the wrong port", `test: ["CMD", "orderpipe", "probe", "http://127.0.0.1:8080/healthz"]`, `test: ["CMD", "orderpipe", "probe", "http://127.0.0.1:8090/healthz"]`, "psp's healthcheck asks http://127.0.0.1:8090/healthz, but the part serves /healthz on :8080"},
		{"healthcheck probe with a bad flag", `test: ["CMD", "orderpipe", "probe"]`, `test: ["CMD", "orderpipe", "probe", "--nope"]`, "healthcheck: flag provided but not defined"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			text := string(orig)
			if !strings.Contains(text, tc.old) {
				t.Fatalf("compose.yaml no longer contains %q; update this test", tc.old)
			}
			path := filepath.Join(t.TempDir(), "compose.yaml")
			if err := os.WriteFile(path, []byte(strings.Replace(text, tc.old, tc.new, 1)), 0o600); err != nil {
				t.Fatal(err)
			}
			problems := checkCompose(loadCompose(t, path))
			if !strings.Contains(strings.Join(problems, "\n"), tc.want) {
				t.Fatalf("the check did not report %q; it reported:\n%s", tc.want, strings.Join(problems, "\n"))
			}
		})
	}
}

func TestNATSConfigs(t *testing.T) {
	opts, err := server.ProcessConfigFile("deploy/nats.conf")
	if err != nil {
		t.Fatalf("deploy/nats.conf does not parse: %v", err)
	}
	if !opts.JetStream || opts.StoreDir == "" || opts.HTTPPort != 8222 || opts.MaxPayload <= 0 {
		t.Errorf("deploy/nats.conf: want JetStream with a store dir, monitoring on 8222 and max_payload; got js=%v store=%q http=%d max_payload=%d",
			opts.JetStream, opts.StoreDir, opts.HTTPPort, opts.MaxPayload)
	}
	// The fsync choice is explicit, never the 2-minute default by omission.
	if !opts.SyncAlways && (opts.SyncInterval <= 0 || opts.SyncInterval >= 2*time.Minute) {
		t.Errorf("deploy/nats.conf: sync_interval %s is the default's risk; choose always or a short interval", opts.SyncInterval)
	}
	text, _ := os.ReadFile("deploy/nats.conf")
	if !strings.Contains(string(text), "sync_interval:") || !strings.Contains(string(text), "Why") {
		t.Error("deploy/nats.conf must state its sync_interval and the reason for it")
	}

	t.Setenv("NATS_SERVER_NAME", "nats-1")
	c, err := server.ProcessConfigFile("deploy/nats-cluster.conf")
	if err != nil {
		t.Fatalf("deploy/nats-cluster.conf does not parse: %v", err)
	}
	if c.ServerName != "nats-1" || c.Cluster.Name == "" || len(c.Routes) != 3 || !c.JetStream || c.HTTPPort != 8222 {
		t.Errorf("deploy/nats-cluster.conf: want a named 3-route JetStream cluster; got name=%q cluster=%q routes=%d js=%v",
			c.ServerName, c.Cluster.Name, len(c.Routes), c.JetStream)
	}
	if c.SyncAlways != opts.SyncAlways || c.SyncInterval != opts.SyncInterval {
		t.Errorf("the cluster's fsync choice (%v/%s) differs from deploy/nats.conf's (%v/%s)", c.SyncAlways, c.SyncInterval, opts.SyncAlways, opts.SyncInterval)
	}
}

func TestDockerfile(t *testing.T) {
	t.Parallel()
	text := readFile(t, "Dockerfile")
	for _, want := range []string{
		"FROM golang:1.26 AS build",
		"--mount=type=cache,target=/go/pkg/mod",
		"CGO_ENABLED=0 go build -trimpath",
		`ENTRYPOINT ["orderpipe"]`,
		`CMD ["orderpipe", "probe"]`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("Dockerfile lacks %q", want)
		}
	}
	if strings.Count(text, "\nFROM ") < 1 || !strings.HasPrefix(text[strings.LastIndex(text, "\nFROM "):], "\nFROM debian:") {
		t.Error("Dockerfile: want a multi-stage build whose last stage is a slim runtime")
	}
	user := ""
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "USER ") {
			user = strings.TrimSpace(strings.TrimPrefix(line, "USER "))
		}
	}
	if user == "" || user == "root" || strings.HasPrefix(user, "0:") || user == "0" {
		t.Errorf("Dockerfile: the runtime must not run as root (USER %q)", user)
	}
}

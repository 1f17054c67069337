// Package localpg runs a PostgreSQL server from the machine's own binaries
// in a data folder: `orderpipe dev` keeps one in $ORDERPIPE_DATA_DIR/pg and
// the test helper starts a throwaway one per test binary.
//
// PostgreSQL refuses to run as root, so when the caller is root the data
// folder is handed to the `postgres` account (the one Debian's package
// creates) and initdb and postgres run as that account. The server listens
// on 127.0.0.1 only, with trust authentication, and gets a parent-death
// signal so that it does not outlive the process that started it.
package localpg

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Options configure a server.
type Options struct {
	// DataDir is the cluster's folder; initdb runs when it holds no cluster.
	DataDir string
	// Port to listen on; 0 picks a free one.
	Port int
	// Durable keeps fsync on. Tests turn it off for speed.
	Durable bool
	// ExtraArgs are passed to postgres as-is (e.g. "-c", "max_connections=300").
	ExtraArgs []string
}

// Server is a running PostgreSQL.
type Server struct {
	opts    Options
	binDir  string
	cred    *syscall.Credential
	cmd     *exec.Cmd
	logPath string
	port    int
	done    chan struct{}
	waitErr error
	mu      sync.Mutex // guards cmd, done, waitErr
}

// BinDir finds the directory with initdb and postgres: $PG_BIN_DIR, then
// PATH, then Debian's /usr/lib/postgresql/<newest>/bin.
func BinDir() (string, error) {
	if d := os.Getenv("PG_BIN_DIR"); d != "" {
		return d, nil
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if q, err := exec.LookPath("postgres"); err == nil && filepath.Dir(p) == filepath.Dir(q) {
			return filepath.Dir(p), nil
		}
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	sort.Slice(matches, func(i, j int) bool { return pgMajor(matches[i]) > pgMajor(matches[j]) })
	if len(matches) > 0 {
		return filepath.Dir(matches[0]), nil
	}
	return "", errors.New("PostgreSQL server binaries (initdb, postgres) not found: install the Debian package postgresql (apt-get install postgresql) or set PG_BIN_DIR")
}

func pgMajor(p string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(p))))
	return n
}

// Start initialises the cluster if needed and starts the server; it returns
// when the server accepts connections, or with the server log on failure.
func Start(ctx context.Context, opts Options) (*Server, error) {
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	dataDir, err := filepath.Abs(opts.DataDir)
	if err != nil {
		return nil, fmt.Errorf("resolve data dir: %w", err)
	}
	opts.DataDir = dataDir
	s := &Server{opts: opts, binDir: bin}
	if os.Geteuid() == 0 {
		if s.cred, err = postgresCredential(); err != nil {
			return nil, err
		}
	}
	if err := s.initdb(ctx); err != nil {
		return nil, err
	}
	port := opts.Port
	if port == 0 {
		if port, err = freePort(); err != nil {
			return nil, err
		}
	}
	s.port = port
	if err := s.start(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

func postgresCredential() (*syscall.Credential, error) {
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root, and PostgreSQL refuses to run as root: need the unprivileged `postgres` account (created by Debian's postgresql package): %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// chownTree hands a folder to the postgres account and checks that the
// account can reach it through every parent folder.
func (s *Server) chownTree(dir string) error {
	if s.cred == nil {
		return nil
	}
	err := filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, int(s.cred.Uid), int(s.cred.Gid))
	})
	if err != nil {
		return fmt.Errorf("hand %s to the postgres account: %w", dir, err)
	}
	for p := filepath.Dir(dir); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("the postgres account cannot reach %s: folder %s is not searchable by others (chmod o+x %s, or set ORDERPIPE_DATA_DIR elsewhere)", dir, p, p)
		}
		if p == filepath.Dir(p) {
			return nil
		}
	}
}

func (s *Server) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(s.binDir, name), args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred, Setpgid: true}
	cmd.Env = append(os.Environ(), "LC_ALL=C", "TZ=UTC")
	return cmd
}

func (s *Server) initdb(ctx context.Context) error {
	if _, err := os.Stat(filepath.Join(s.opts.DataDir, "PG_VERSION")); err == nil {
		return s.chownTree(s.opts.DataDir)
	}
	if err := os.MkdirAll(s.opts.DataDir, 0o700); err != nil {
		return fmt.Errorf("create data dir: %w", err)
	}
	if err := s.chownTree(s.opts.DataDir); err != nil {
		return err
	}
	args := []string{"-D", s.opts.DataDir, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C"}
	if !s.opts.Durable {
		args = append(args, "--no-sync")
	}
	cmd := s.command(ctx, "initdb", args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("initdb %s: %w\n%s", s.opts.DataDir, err, out)
	}
	return nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (s *Server) start(ctx context.Context) error {
	s.logPath = filepath.Join(s.opts.DataDir, "server.log")
	logf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("open server log: %w", err)
	}
	if s.cred != nil {
		_ = os.Chown(s.logPath, int(s.cred.Uid), int(s.cred.Gid))
	}
	// A stale pid file of a server killed with -9 would stop the start.
	s.removeStalePid()
	args := []string{"-D", s.opts.DataDir, "-p", strconv.Itoa(s.port),
		"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=",
		"-c", "max_connections=400", "-c", "shared_buffers=64MB"}
	if !s.opts.Durable {
		args = append(args, "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")
	}
	args = append(args, s.opts.ExtraArgs...)
	cmd := exec.Command(filepath.Join(s.binDir, "postgres"), args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred, Setpgid: true, Pdeathsig: syscall.SIGQUIT}
	cmd.Env = append(os.Environ(), "LC_ALL=C", "TZ=UTC")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start postgres: %w", err)
	}
	s.mu.Lock()
	s.cmd = cmd
	done := make(chan struct{})
	s.done = done
	s.mu.Unlock()
	go func() {
		err := cmd.Wait()
		s.mu.Lock()
		s.waitErr = err
		s.mu.Unlock()
		logf.Close()
		close(done)
	}()
	deadline := time.Now().Add(60 * time.Second)
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := pgx.Connect(cctx, s.URL("postgres"))
		cancel()
		if err == nil {
			conn.Close(context.Background())
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("postgres exited during start-up; server log:\n%s", s.Log())
		case <-ctx.Done():
			_ = s.Stop()
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = s.Stop()
			return fmt.Errorf("postgres did not accept connections within 60s (%w); server log:\n%s", err, s.Log())
		}
	}
}

func (s *Server) removeStalePid() {
	pidFile := filepath.Join(s.opts.DataDir, "postmaster.pid")
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	if err != nil || pid <= 0 {
		return
	}
	if syscall.Kill(pid, 0) == nil {
		return // alive: postgres itself will refuse with a clear message
	}
	_ = os.Remove(pidFile)
}

// Pid is the process id of the postmaster (0 before it started). Its
// process group has the same id: every backend belongs to it.
func (s *Server) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil || s.cmd.Process == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Port is the TCP port the server listens on (127.0.0.1).
func (s *Server) Port() int { return s.port }

// URL returns a connection string for the named database.
func (s *Server) URL(database string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", s.port, database)
}

// Log returns the server log so far.
func (s *Server) Log() string {
	b, err := os.ReadFile(s.logPath)
	if err != nil {
		return fmt.Sprintf("(no server log: %v)", err)
	}
	return string(bytes.TrimSpace(b))
}

// Done is closed when the server process has exited.
func (s *Server) Done() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.done
}

// Stop shuts the server down (fast shutdown: SIGINT, then SIGQUIT after 10s,
// then SIGKILL) and waits for it to exit. It is safe to call more than once.
func (s *Server) Stop() error {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return nil
	}
	for _, step := range []struct {
		sig  syscall.Signal
		wait time.Duration
	}{{syscall.SIGINT, 10 * time.Second}, {syscall.SIGQUIT, 5 * time.Second}, {syscall.SIGKILL, 5 * time.Second}} {
		select {
		case <-done:
			return nil
		default:
		}
		_ = cmd.Process.Signal(step.sig)
		select {
		case <-done:
			return nil
		case <-time.After(step.wait):
		}
	}
	return errors.New("postgres did not exit after SIGKILL")
}

// Restart stops the server and starts it again on the same port and data.
func (s *Server) Restart(ctx context.Context) error {
	if err := s.Stop(); err != nil {
		return err
	}
	return s.start(ctx)
}

// Package pyroscopetest runs a real Grafana Pyroscope server for tests and
// reads profiles back from it.
//
// Start builds the server with scripts/pyroscope.sh (once per machine; the
// binary is cached), runs it single-process with local storage in the
// test's temp dir, every listener and advertised address on 127.0.0.1, and
// stops it when the test ends. Query helpers call the querier's connect
// JSON API and return samples per function.
package pyroscopetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// BuildTimeout bounds the cold build of the server (about 4 minutes on 2
// cores).
const BuildTimeout = 15 * time.Minute

// Server is a running (or stopped) Pyroscope server owned by one test.
type Server struct {
	t       testing.TB
	dataDir string
	logPath string
	http    int
	grpc    int
	gossip  int

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

var (
	buildOnce sync.Once
	buildBin  string
	buildErr  error
	buildOut  string
)

// RepoRoot is the rbscope checkout holding this package (the directory
// with go.mod, walking up from the working directory).
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("find repo root: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "scripts", "pyroscope.sh")); err == nil {
			if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
				return dir, nil
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("find repo root: no go.mod with scripts/pyroscope.sh above the working directory")
		}
		dir = parent
	}
}

// Build builds (or finds in the cache) the Pyroscope binary and returns its
// path.
func Build() (string, error) {
	buildOnce.Do(func() {
		root, err := RepoRoot()
		if err != nil {
			buildErr = err
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), BuildTimeout)
		defer cancel()
		cmd := exec.CommandContext(ctx, filepath.Join(root, "scripts", "pyroscope.sh"), "build")
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			buildOut = stderr.String()
			buildErr = fmt.Errorf("build pyroscope: %w: %s", err, tail(buildOut, 2000))
			return
		}
		buildBin = strings.TrimSpace(stdout.String())
	})
	return buildBin, buildErr
}

// networkFailure says whether a build failed for lack of network (the Go
// module proxy unreachable), the one reason to skip rather than fail.
func networkFailure(out string) bool {
	for _, s := range []string{"dial tcp", "no such host", "connection refused", "i/o timeout",
		"network is unreachable", "TLS handshake timeout", "proxy.golang.org"} {
		if strings.Contains(out, s) && strings.Contains(out, "go: ") {
			return true
		}
	}
	return false
}

// Start builds the server if needed, starts it and waits until it is
// ready. The server is stopped when the test ends. A build that fails for
// lack of network skips the test; any other failure fails it.
func Start(t testing.TB) *Server {
	t.Helper()
	s := Prepare(t)
	if err := s.start(); err != nil {
		t.Fatal(err)
	}
	return s
}

// Prepare builds the server if needed and picks its ports and data dir
// without starting it (URL is already valid): for clients that start
// before their server. Run starts it.
func Prepare(t testing.TB) *Server {
	t.Helper()
	if _, err := Build(); err != nil {
		if networkFailure(buildOut) {
			t.Skipf("cannot build Pyroscope without the Go module proxy: %v", err)
		}
		t.Fatal(err)
	}
	dir := t.TempDir()
	s := &Server{t: t, dataDir: filepath.Join(dir, "data"), logPath: filepath.Join(dir, "pyroscope.log")}
	ports, err := freePorts(3)
	if err != nil {
		t.Fatal(err)
	}
	s.http, s.grpc, s.gossip = ports[0], ports[1], ports[2]
	t.Cleanup(func() {
		s.Stop()
		if t.Failed() {
			if b, err := os.ReadFile(s.logPath); err == nil {
				t.Logf("pyroscope log (tail):\n%s", tail(string(b), 4000))
			}
		}
	})
	return s
}

func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("pick a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// Args are the server's command-line arguments, from scripts/pyroscope.sh.
func (s *Server) args() ([]string, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	out, err := exec.Command(filepath.Join(root, "scripts", "pyroscope.sh"), "args",
		"--http-port", strconv.Itoa(s.http), "--grpc-port", strconv.Itoa(s.grpc),
		"--memberlist-port", strconv.Itoa(s.gossip), "--data", s.dataDir).Output()
	if err != nil {
		return nil, fmt.Errorf("pyroscope.sh args: %w", err)
	}
	return strings.Fields(string(out)), nil
}

func (s *Server) start() error {
	bin, err := Build()
	if err != nil {
		return err
	}
	args, err := s.args()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(s.dataDir, 0o755); err != nil {
		return fmt.Errorf("create data dir: %w", err)
	}
	logf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("open log: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command(bin, args...)
	cmd.Dir = s.dataDir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start pyroscope: %w", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
	deadline := time.Now().Add(90 * time.Second)
	client := &http.Client{Timeout: 2 * time.Second}
	for {
		select {
		case <-done:
			b, _ := os.ReadFile(s.logPath)
			return fmt.Errorf("pyroscope exited while starting: %s", tail(string(b), 2000))
		default:
		}
		resp, err := client.Get(s.URL() + "/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pyroscope not ready after 90s (last: %v)", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// URL is the server's base URL ("http://127.0.0.1:PORT").
func (s *Server) URL() string { return "http://127.0.0.1:" + strconv.Itoa(s.http) }

// Pid is the server process's id, 0 when stopped.
func (s *Server) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Stop shuts the server down gracefully (SIGTERM: it flushes what it
// holds to its data dir), killing it after 30s. Stopping a stopped server
// does nothing.
func (s *Server) Stop() {
	s.stop(syscall.SIGTERM)
}

// Kill kills the server at once (SIGKILL): what it held only in memory is
// lost, as in a crash.
func (s *Server) Kill() {
	s.stop(syscall.SIGKILL)
}

func (s *Server) stop(sig syscall.Signal) {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd, s.done = nil, nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// Restart stops the server if it runs and starts it again on the same
// ports with the same data.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	if err := s.start(); err != nil {
		s.t.Fatal(err)
	}
}

// Run starts a prepared or stopped server (same ports, same data) and
// waits until it is ready.
func (s *Server) Run() error {
	if s.Pid() != 0 {
		return errors.New("pyroscope is running")
	}
	return s.start()
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}

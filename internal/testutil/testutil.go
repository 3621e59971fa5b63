// Package testutil starts real Ruby processes for rbscope's tests and
// finds the repository's and the shared test data.
package testutil

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// RepoRoot returns the directory holding go.mod.
func RepoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("go.mod not found above the test directory")
		}
		dir = parent
	}
}

// SharedDir returns ../shared beside the repository (the project's shared
// data, read in place), skipping the test when it is absent.
func SharedDir(t testing.TB) string {
	t.Helper()
	d := filepath.Join(RepoRoot(t), "..", "shared")
	if _, err := os.Stat(d); err != nil {
		t.Skipf("shared data not found at %s", d)
	}
	return d
}

// Ruby returns the path of the ruby interpreter, skipping when none.
func Ruby(t testing.TB) string {
	t.Helper()
	p, err := exec.LookPath("ruby")
	if err != nil {
		t.Skip("ruby is not installed (scripts/install-deps.sh installs it)")
	}
	return p
}

// Proc is a Ruby process started by a test.
type Proc struct {
	Cmd *exec.Cmd
	Pid int
	// Lines are the lines the script printed before "ready".
	Lines []string
	out   *bufio.Reader
}

// StartRuby runs `ruby script args...` (script relative to
// testdata/ruby unless absolute), waits until it prints a line "ready"
// (up to 20 s), and kills it when the test ends.
func StartRuby(t testing.TB, script string, args ...string) *Proc {
	t.Helper()
	if !filepath.IsAbs(script) {
		script = filepath.Join(RepoRoot(t), "testdata", "ruby", script)
	}
	cmd := exec.Command(Ruby(t), append([]string{script}, args...)...)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start ruby: %v", err)
	}
	p := &Proc{Cmd: cmd, Pid: cmd.Process.Pid, out: bufio.NewReader(stdout)}
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
	})
	done := make(chan error, 1)
	go func() {
		for {
			line, err := p.out.ReadString('\n')
			if err != nil {
				done <- err
				return
			}
			line = strings.TrimRight(line, "\n")
			if line == "ready" {
				done <- nil
				return
			}
			p.Lines = append(p.Lines, line)
		}
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("ruby %s exited before it was ready: %v", script, err)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("ruby %s did not print ready within 20s", script)
	}
	go io.Copy(io.Discard, p.out)
	return p
}

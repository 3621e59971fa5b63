// Package testutil starts real Ruby processes for rbscope's tests and
// finds the repository's and the shared test data.
package testutil

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
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
		Missing(t, "shared data at %s (../shared beside the repository)", d)
	}
	return d
}

// Ruby returns the path of Debian's ruby interpreter (see SystemRuby).
func Ruby(t testing.TB) string {
	t.Helper()
	return SystemRuby(t).Exe
}

// Proc is a Ruby process started by a test.
type Proc struct {
	Cmd *exec.Cmd
	Pid int
	// Lines are the lines the script printed before "ready".
	Lines []string
	out   *bufio.Reader
}

// StartRuby runs Debian's Ruby on script (see RubyUnderTest.Start).
func StartRuby(t testing.TB, script string, args ...string) *Proc {
	t.Helper()
	return SystemRuby(t).Start(t, script, args...)
}

package testutil

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Script is a Ruby process a test drives through its standard streams:
// lines it prints arrive on Lines (closed when its output ends), and
// handshakes go to Stdin.
type Script struct {
	Cmd   *exec.Cmd
	Pid   int
	Stdin io.WriteCloser
	Lines <-chan string
}

// StartScript starts cmd (made by RubyUnderTest.Command, its Env and
// SysProcAttr set as the test needs) in a process group of its own with
// its standard input and output piped, its standard error to the test's
// unless set; the group is killed when the test ends.
func StartScript(t testing.TB, cmd *exec.Cmd) *Script {
	t.Helper()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout := startGroup(t, cmd, fmt.Sprint(cmd.Args))
	lines := make(chan string, 64)
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 16<<20)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	return &Script{Cmd: cmd, Pid: cmd.Process.Pid, Stdin: stdin, Lines: lines}
}

// startGroup starts cmd in a process group of its own, its standard
// error to the test's unless set, and returns its standard output; the
// group is killed when the test ends. what names it in a failure.
func startGroup(t testing.TB, cmd *exec.Cmd, what string) io.ReadCloser {
	t.Helper()
	if cmd.Stderr == nil {
		cmd.Stderr = os.Stderr
	}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", what, err)
	}
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
	})
	return stdout
}

// scriptWait bounds each Expect.
const scriptWait = 60 * time.Second

// ExpectPrefix waits for a line that starts with prefix (other lines are
// skipped) and returns it; the test fails when the script ends or 60 s
// pass first.
func (s *Script) ExpectPrefix(t testing.TB, prefix string) string {
	t.Helper()
	deadline := time.After(scriptWait)
	for {
		select {
		case l, ok := <-s.Lines:
			if !ok {
				t.Fatalf("%v ended before printing %q", s.Cmd.Args, prefix)
			}
			if strings.HasPrefix(l, prefix) {
				return l
			}
		case <-deadline:
			t.Fatalf("%v did not print %q within %v", s.Cmd.Args, prefix, scriptWait)
		}
	}
}

// Expect waits for a line equal to want (see ExpectPrefix).
func (s *Script) Expect(t testing.TB, want string) {
	t.Helper()
	for {
		if l := s.ExpectPrefix(t, want); l == want {
			return
		}
	}
}

// ExpectInt waits for a line "<prefix>N" and returns N.
func (s *Script) ExpectInt(t testing.TB, prefix string) int64 {
	t.Helper()
	l := s.ExpectPrefix(t, prefix)
	n, err := strconv.ParseInt(strings.TrimPrefix(l, prefix), 10, 64)
	if err != nil {
		t.Fatalf("line %q: %v", l, err)
	}
	return n
}

// Send writes line and a newline to the script's standard input.
func (s *Script) Send(t testing.TB, line string) {
	t.Helper()
	if _, err := io.WriteString(s.Stdin, line+"\n"); err != nil {
		t.Fatalf("write to %v: %v", s.Cmd.Args, err)
	}
}

package alloc

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const libruby = "/usr/lib/x86_64-linux-gnu/libruby-3.1.so.3.1"

// needBPF skips unless the test can attach uprobes.
func needBPF(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("attaching uprobes needs root (CAP_SYS_ADMIN)")
	}
	if _, err := exec.LookPath("ruby"); err != nil {
		t.Skip("ruby not installed")
	}
	if _, err := os.Stat("/sys/bus/event_source/devices/uprobe"); err != nil {
		t.Skip("kernel has no uprobe PMU")
	}
}

// rubyProc is a Ruby script driven by stdin handshakes.
type rubyProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader
}

func startRuby(t *testing.T, args ...string) *rubyProc {
	t.Helper()
	cmd := exec.Command("ruby", args...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	return &rubyProc{cmd: cmd, stdin: stdin, out: bufio.NewReader(stdout)}
}

// expect reads stdout lines until one equal to want, within 60s.
func (p *rubyProc) expect(t *testing.T, want string) {
	t.Helper()
	ch := make(chan error, 1)
	go func() {
		for {
			line, err := p.out.ReadString('\n')
			if err != nil {
				ch <- fmt.Errorf("waiting for %q: %w", want, err)
				return
			}
			if strings.TrimSpace(line) == want {
				ch <- nil
				return
			}
		}
	}()
	select {
	case err := <-ch:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("timed out waiting for %q", want)
	}
}

func (p *rubyProc) send(t *testing.T) {
	t.Helper()
	if _, err := io.WriteString(p.stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
}

func script(t *testing.T, name string) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func attachOrSkip(t *testing.T, pid int, opts Options) *Tracker {
	t.Helper()
	tr, err := Attach(pid, opts)
	if errors.Is(err, ErrPermission) || errors.Is(err, ErrNoBPF) || errors.Is(err, ErrNoUprobes) {
		t.Skipf("cannot attach here: %v", err)
	}
	if err != nil {
		t.Fatalf("Attach: %v", err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr
}

func classCount(r *Report, class string) uint64 {
	for _, c := range r.ByClass {
		if c.Class == class {
			return c.Count
		}
	}
	return 0
}

func siteCount(r *Report, class, path string, line int) uint64 {
	for _, s := range r.BySite {
		if s.Class == class && s.Path == path && s.Line == line {
			return s.Count
		}
	}
	return 0
}

func TestExactCounts(t *testing.T) {
	needBPF(t)
	const n = 3000
	path := script(t, "alloc.rb")
	p := startRuby(t, path, fmt.Sprint(n))
	p.expect(t, "ready")
	tr := attachOrSkip(t, p.cmd.Process.Pid, Options{})
	p.send(t)
	p.expect(t, "done")
	r, err := tr.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if r.Estimated || r.Mode != "usdt" {
		t.Errorf("estimated=%v mode=%q", r.Estimated, r.Mode)
	}
	for _, c := range []struct {
		class string
		line  int
		want  uint64
	}{
		{"Widget", 10, n},
		{"Gadget", 11, 2 * n},
		{"Outer::Inner", 12, n / 2},
	} {
		if got := classCount(r, c.class); got != c.want {
			t.Errorf("class %s: %d allocations, want %d", c.class, got, c.want)
		}
		if got := siteCount(r, c.class, path, c.line); got != c.want {
			t.Errorf("%s:%d:%s: %d allocations, want %d", path, c.line, c.class, got, c.want)
		}
	}
	for _, c := range []struct {
		class string
		line  int
		want  uint64
	}{
		{"Array", 13, n},
		{"String", 14, n},
		{"Hash", 15, n / 4},
	} {
		if got := siteCount(r, c.class, path, c.line); got != c.want {
			t.Errorf("%s:%d:%s: %d allocations, want %d", path, c.line, c.class, got, c.want)
		}
	}
	if t.Failed() {
		for i, s := range r.BySite {
			if i < 30 {
				t.Logf("%d %s:%d:%s", s.Count, s.Path, s.Line, s.Class)
			}
		}
	}
}

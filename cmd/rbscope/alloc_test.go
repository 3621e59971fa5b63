package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/alloc"
	"github.com/rbscope/rbscope/internal/target"
	"github.com/rbscope/rbscope/internal/testutil"
)

// allocNeedRoot skips unless uprobes can be attached here.
func allocNeedRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		testutil.Missing(t, "rbscope alloc needs root (CAP_SYS_ADMIN)")
	}
	if _, err := exec.LookPath("ruby"); err != nil {
		testutil.Missing(t, "ruby not installed")
	}
	if _, err := os.Stat("/sys/bus/event_source/devices/uprobe"); err != nil {
		testutil.Missing(t, "kernel has no uprobe PMU")
	}
}

// allocRuby runs one of internal/alloc's handshake scripts.
type allocRuby struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
}

func startAllocRuby(t *testing.T, cred *syscall.Credential, name string, args ...string) *allocRuby {
	t.Helper()
	path, err := filepath.Abs(filepath.Join("..", "..", "internal", "alloc", "testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ruby", append([]string{path}, args...)...)
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	p := &allocRuby{cmd: cmd, stdin: stdin, lines: make(chan string, 16)}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
	}()
	return p
}

func (p *allocRuby) expect(t *testing.T, want string) {
	t.Helper()
	deadline := time.After(60 * time.Second)
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				t.Fatalf("script ended before printing %q", want)
			}
			if l == want {
				return
			}
		case <-deadline:
			t.Fatalf("timed out waiting for %q", want)
		}
	}
}

// objectSemaphore reads object__create's semaphore in pid.
func objectSemaphore(t *testing.T, pid int) uint16 {
	t.Helper()
	tg, err := target.OpenLive(pid)
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	plan, err := alloc.PlanFor(tg, false)
	if err != nil {
		t.Fatal(err)
	}
	v, err := alloc.ReadSemaphore(pid, plan, alloc.KindObject)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// waitSemaphore polls until object__create's semaphore in pid is want.
func waitSemaphore(t *testing.T, pid int, want uint16, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		got := objectSemaphore(t, pid)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("semaphore of process %d is %d after %v, want %d", pid, got, within, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestAllocTargetExits: the target allocates and exits while rbscope
// alloc runs; the report of what it saw is printed and rbscope exits 0.
func TestAllocTargetExits(t *testing.T) {
	allocNeedRoot(t)
	const n = 2500
	p := startAllocRuby(t, nil, "exits.rb", strconv.Itoa(n))
	p.expect(t, "ready")
	pid := p.cmd.Process.Pid
	cmd := exec.Command(binPath, "alloc", "--pid", strconv.Itoa(pid), "--format", "json")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	waitSemaphore(t, pid, 1, 30*time.Second)
	io.WriteString(p.stdin, "go\n")
	p.expect(t, "done")
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("rbscope alloc: %v\n%s", err, errb.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("rbscope alloc did not stop after the target exited")
	}
	if !strings.Contains(errb.String(), fmt.Sprintf("process %d exited", pid)) {
		t.Errorf("stderr does not say the process exited:\n%s", errb.String())
	}
	var doc struct {
		Pid       int     `json:"pid"`
		Duration  float64 `json:"duration_s"`
		Estimated bool    `json:"estimated"`
		ByClass   []struct {
			Class string `json:"class"`
			Count int    `json:"count"`
		} `json:"by_class"`
		BySite []struct {
			Class string `json:"class"`
			Path  string `json:"path"`
			Line  int    `json:"line"`
			Count int    `json:"count"`
		} `json:"by_site"`
	}
	if err := json.Unmarshal(out.Bytes(), &doc); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out.String())
	}
	if doc.Pid != pid || doc.Estimated || doc.Duration <= 0 {
		t.Errorf("pid %d estimated %v duration %v", doc.Pid, doc.Estimated, doc.Duration)
	}
	found := false
	for _, s := range doc.BySite {
		if s.Class == "Leaver" {
			found = true
			if s.Count != n || s.Line != 7 || !strings.HasSuffix(s.Path, "/internal/alloc/testdata/exits.rb") {
				t.Errorf("Leaver site %+v, want %d at exits.rb:7", s, n)
			}
		}
	}
	if !found {
		t.Errorf("no Leaver in %s", out.String())
	}
}

// TestAllocSIGKILLReleasesSemaphore: when rbscope alloc is killed outright
// the kernel drops its links, and with them the probes' semaphores.
func TestAllocSIGKILLReleasesSemaphore(t *testing.T) {
	allocNeedRoot(t)
	p := startAllocRuby(t, nil, "alloc.rb", "10")
	p.expect(t, "ready")
	pid := p.cmd.Process.Pid
	if got := objectSemaphore(t, pid); got != 0 {
		t.Fatalf("semaphore %d before attaching", got)
	}
	cmd := exec.Command(binPath, "alloc", "--pid", strconv.Itoa(pid), "--silent")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	waitSemaphore(t, pid, 1, 30*time.Second)
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	waitSemaphore(t, pid, 0, 10*time.Second)
}

// TestAllocSIGTERM: SIGTERM stops rbscope alloc cleanly with a report.
func TestAllocSIGTERM(t *testing.T) {
	allocNeedRoot(t)
	p := startAllocRuby(t, nil, "alloc.rb", "1000")
	p.expect(t, "ready")
	pid := p.cmd.Process.Pid
	cmd := exec.Command(binPath, "alloc", "--pid", strconv.Itoa(pid), "--by", "class")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	waitSemaphore(t, pid, 1, 30*time.Second)
	io.WriteString(p.stdin, "go\n")
	p.expect(t, "done")
	time.Sleep(1200 * time.Millisecond) // at least one live line
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("rbscope alloc after SIGTERM: %v\n%s", err, errb.String())
	}
	if !strings.Contains(out.String(), " 1000            0  Widget\n") {
		t.Errorf("report by class lacks 1000 Widgets:\n%s", out.String())
	}
	// stderr is not a terminal: plain periodic lines.
	if !strings.Contains(errb.String(), "allocations") || strings.Contains(errb.String(), "\x1b[") {
		t.Errorf("live lines on a pipe:\n%q", errb.String())
	}
	if got := objectSemaphore(t, pid); got != 0 {
		t.Errorf("semaphore %d after SIGTERM", got)
	}
}

// TestAllocNotRoot: without CAP_SYS_ADMIN the error says what to do.
func TestAllocNotRoot(t *testing.T) {
	allocNeedRoot(t) // root is needed to switch to another user
	nobody := &syscall.Credential{Uid: 65534, Gid: 65534}
	p := startAllocRuby(t, nobody, "alloc.rb", "10")
	p.expect(t, "ready")
	if err := os.Chmod(filepath.Dir(binPath), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(binPath, "alloc", "--pid", strconv.Itoa(p.cmd.Process.Pid), "--duration", "1s")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: nobody}
	var errb bytes.Buffer
	cmd.Stderr = &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	oneLineError(t, errb.String(), code, "needs CAP_SYS_ADMIN: run as root")
}

func TestAllocBadFlags(t *testing.T) {
	_, stderr, code := run(t, "alloc")
	oneLineError(t, stderr, code, "--pid is required")
	_, stderr, code = run(t, "alloc", "--pid", "1", "--format", "svg")
	oneLineError(t, stderr, code, `unknown --format "svg"`)
	_, stderr, code = run(t, "alloc", "--pid", "1", "--duty-cycle", "2")
	oneLineError(t, stderr, code, "--duty-cycle 2 is not between 0 and 1")
}

// TestAllocLiveView draws the terminal view twice: the second draw moves
// the cursor back over the first, and rates are per second since the last
// draw.
func TestAllocLiveView(t *testing.T) {
	var b bytes.Buffer
	v := newLiveView(&b, true, false)
	r1 := &alloc.Report{Pid: 7, Duration: time.Second,
		ByClass: []alloc.ClassCount{{Class: "Widget", Count: 100}},
		BySite:  []alloc.SiteCount{{Class: "Widget", Path: "/app.rb", Line: 3, Count: 100}}}
	r2 := &alloc.Report{Pid: 7, Duration: 3 * time.Second,
		ByClass: []alloc.ClassCount{{Class: "Widget", Count: 500}, {Class: "String", Count: 40}},
		BySite:  []alloc.SiteCount{{Class: "Widget", Path: "/app.rb", Line: 3, Count: 500}, {Class: "String", Path: "", Line: 0, Count: 40}}}
	v.draw(r1, nil)
	first := b.String()
	if strings.Contains(first, "\x1b[") {
		t.Errorf("first draw moves the cursor: %q", first)
	}
	if !strings.Contains(first, "         100        100  Widget\n") || !strings.Contains(first, "/app.rb:3:Widget") {
		t.Errorf("first draw:\n%s", first)
	}
	b.Reset()
	v.draw(r2, r1)
	second := b.String()
	// 5 lines drawn before: header, class header, 1 class, site header, 1 site.
	if !strings.HasPrefix(second, "\x1b[5A\x1b[J") {
		t.Errorf("second draw does not redraw in place: %q", second)
	}
	// Widget: 400 more in 2 s = 200/s; String: 40 new = 20/s.
	for _, want := range []string{"         500        200  Widget\n", "          40         20  String\n", "(unknown):0:String", "540 allocations", "220/s"} {
		if !strings.Contains(second, want) {
			t.Errorf("second draw lacks %q:\n%s", want, second)
		}
	}
	// Not a terminal: one plain line per draw.
	b.Reset()
	plain := newLiveView(&b, false, false)
	plain.draw(r2, r1)
	if got := b.String(); got != "rbscope alloc: 3s 540 allocations, 220/s; top: Widget 500, String 40\n" {
		t.Errorf("plain line %q", got)
	}
	b.Reset()
	newLiveView(&b, false, true).draw(r2, r1)
	if b.Len() != 0 {
		t.Errorf("--silent drew %q", b.String())
	}
}

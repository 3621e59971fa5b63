package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/pprof/profile"

	"github.com/rbscope/rbscope/internal/alloc"
	"github.com/rbscope/rbscope/internal/pyroscopetest"
	"github.com/rbscope/rbscope/internal/target"
	"github.com/rbscope/rbscope/internal/testutil"
)

// allocNeedRoot stops the test (testutil.Missing) unless uprobes can be
// attached here.
func allocNeedRoot(t *testing.T) {
	t.Helper()
	testutil.NeedRoot(t)
	if _, err := os.Stat("/sys/bus/event_source/devices/uprobe"); err != nil {
		testutil.Missing(t, "a kernel with uprobes (CONFIG_UPROBE_EVENTS)")
	}
}

// startAllocRuby runs one of internal/alloc's handshake scripts on rb, as
// user cred when not nil.
func startAllocRuby(t *testing.T, rb testutil.RubyUnderTest, cred *syscall.Credential, name string, args ...string) *testutil.Script {
	t.Helper()
	path := filepath.Join(testutil.RepoRoot(t), "internal", "alloc", "testdata", name)
	cmd := rb.Command(append([]string{path}, args...)...)
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	return testutil.StartScript(t, cmd)
}

// objectPlan is alloc's plan for pid.
func objectPlan(t *testing.T, pid int) *alloc.Plan {
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
	return plan
}

// objectSemaphore reads object__create's semaphore in pid.
func objectSemaphore(t *testing.T, pid int) uint16 {
	t.Helper()
	v, err := alloc.ReadSemaphore(pid, objectPlan(t, pid), alloc.KindObject)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// objectSites is what object__create's semaphore reads in pid while
// attached: one per site naming it (Plan.SemaphoreSites).
func objectSites(t *testing.T, pid int) uint16 {
	t.Helper()
	plan := objectPlan(t, pid)
	n := plan.SemaphoreSites(alloc.KindObject)
	if n == 0 {
		t.Fatalf("no object__create site with a semaphore in %s", plan.Binary)
	}
	return uint16(n)
}

// attachedWriter collects rbscope alloc's stderr and closes attached
// when the notice that counting has begun arrives. The notice, not the
// probes' semaphore, is the boundary: the kernel raises the semaphore
// before it writes the breakpoint, and alloc opens its counting gate only
// once every site is attached, so an allocation let through on the
// semaphore alone may go uncounted (CI: 3423999 of 3424000 Widgets).
type attachedWriter struct {
	mu       sync.Mutex
	buf      bytes.Buffer
	attached chan struct{}
	seen     bool
}

func newAttachedWriter() *attachedWriter {
	return &attachedWriter{attached: make(chan struct{})}
}

func (w *attachedWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(b)
	if !w.seen && strings.Contains(w.buf.String(), "rbscope alloc: attached to ") {
		w.seen = true
		close(w.attached)
	}
	return len(b), nil
}

func (w *attachedWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// wait returns once alloc has said it is counting.
func (w *attachedWriter) wait(t *testing.T, within time.Duration) {
	t.Helper()
	select {
	case <-w.attached:
	case <-time.After(within):
		t.Fatalf("rbscope alloc did not say it was attached within %v:\n%s", within, w.String())
	}
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
			t.Fatalf("semaphore of process %d is %d after %v, want %d; processes holding perf events or BPF links: %s",
				pid, got, within, want, perfHolders())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// perfHolders lists the processes with perf event or BPF link file
// descriptors (uprobes are held by those), for a failure's message.
func perfHolders() string {
	var out []string
	fds, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	seen := map[string]int{}
	for _, fd := range fds {
		l, err := os.Readlink(fd)
		if err != nil || !(strings.Contains(l, "perf_event") || strings.Contains(l, "bpf-link")) {
			continue
		}
		pid := strings.Split(fd, "/")[2]
		if seen[pid] == 0 {
			comm, _ := os.ReadFile("/proc/" + pid + "/comm")
			out = append(out, pid+" ("+strings.TrimSpace(string(comm))+")")
		}
		seen[pid]++
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, ", ")
}

// TestAllocTargetExits: the target allocates and exits while rbscope
// alloc runs; the report of what it saw is printed and rbscope exits 0.
func TestAllocTargetExits(t *testing.T) {
	allocNeedRoot(t)
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		const n = 2500
		p := startAllocRuby(t, rb, nil, "exits.rb", strconv.Itoa(n))
		p.Expect(t, "ready")
		pid := p.Pid
		cmd := exec.Command(binPath, "alloc", "--pid", strconv.Itoa(pid), "--format", "json", "--exact")
		cmd.Env = rb.ProfilerEnv(t)
		var out bytes.Buffer
		errb := newAttachedWriter()
		cmd.Stdout, cmd.Stderr = &out, errb
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		errb.wait(t, 30*time.Second)
		p.Send(t, "go")
		p.Expect(t, "done")
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
	})
}

// TestAllocSIGKILLReleasesSemaphore: when rbscope alloc is killed outright
// the kernel drops its links, and with them the probes' semaphores.
func TestAllocSIGKILLReleasesSemaphore(t *testing.T) {
	allocNeedRoot(t)
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		p := startAllocRuby(t, rb, nil, "alloc.rb", "10")
		p.Expect(t, "ready")
		pid := p.Pid
		if got := objectSemaphore(t, pid); got != 0 {
			t.Fatalf("semaphore %d before attaching", got)
		}
		cmd := exec.Command(binPath, "alloc", "--pid", strconv.Itoa(pid), "--silent", "--exact")
		cmd.Env = rb.ProfilerEnv(t)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		// The kernel raises a semaphore once per uprobe that names it:
		// Ruby 3.4 has two object__create sites sharing one.
		waitSemaphore(t, pid, objectSites(t, pid), 30*time.Second)
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
		waitSemaphore(t, pid, 0, 10*time.Second)
	})
}

// TestAllocSIGTERM: SIGTERM stops rbscope alloc cleanly with a report.
func TestAllocSIGTERM(t *testing.T) {
	allocNeedRoot(t)
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		p := startAllocRuby(t, rb, nil, "alloc.rb", "1000")
		p.Expect(t, "ready")
		pid := p.Pid
		cmd := exec.Command(binPath, "alloc", "--pid", strconv.Itoa(pid), "--by", "class", "--exact")
		cmd.Env = rb.ProfilerEnv(t)
		var out bytes.Buffer
		errb := newAttachedWriter()
		cmd.Stdout, cmd.Stderr = &out, errb
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		errb.wait(t, 30*time.Second)
		p.Send(t, "go")
		p.Expect(t, "done")
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
	})
}

// TestAllocNotRoot: without CAP_SYS_ADMIN the error says what to do.
func TestAllocNotRoot(t *testing.T) {
	allocNeedRoot(t) // root is needed to switch to another user
	nobody := &syscall.Credential{Uid: 65534, Gid: 65534}
	// Debian's Ruby: the builds live under root's home, closed to nobody.
	p := startAllocRuby(t, testutil.SystemRuby(t), nobody, "alloc.rb", "10")
	p.Expect(t, "ready")
	if err := os.Chmod(filepath.Dir(binPath), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(binPath, "alloc", "--pid", strconv.Itoa(p.Pid), "--duration", "1s")
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
	oneLineError(t, stderr, code, "--duty-cycle 2 is not in (0, 1]")
	_, stderr, code = run(t, "alloc", "--pid", "1", "--exact", "--duty-cycle", "0.5")
	oneLineError(t, stderr, code, "--exact and --duty-cycle exclude each other")
}

// TestAllocUpload traces the stacks fixture, allocating for 3.5 s, with
// --upload to a real Pyroscope server and one profile per second: more
// than one interval arrives (profiles stamped before and after the
// middle of the workload both hold Widgets), the server's allocation
// totals (alloc_objects) equal the local report's and the Widgets the
// script counted, and its stacks hold C#inner < B#middle < A#outer.
func TestAllocUpload(t *testing.T) {
	allocNeedRoot(t)
	srv := pyroscopetest.Start(t)
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		const secs = 3.5
		p := startAllocRuby(t, rb, nil, "stacks.rb", "2000", fmt.Sprint(secs))
		p.Expect(t, "ready")
		pid := p.Pid
		app := "ci-alloc-" + strings.ReplaceAll(rb.Name, ".", "_")
		local := filepath.Join(t.TempDir(), "alloc.json")
		start := time.Now()
		cmd := exec.Command(binPath, "alloc", "--pid", strconv.Itoa(pid), "--exact", "--format", "json",
			"-o", local, "--upload", srv.URL(), "--app-name", app, "--upload-interval", "1s")
		cmd.Env = rb.ProfilerEnv(t)
		errb := newAttachedWriter()
		cmd.Stderr = errb
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		errb.wait(t, 30*time.Second)
		tGo := time.Now()
		p.Send(t, "go")
		made := p.ExpectInt(t, "widgets ")
		p.Expect(t, "done")
		cmd.Process.Signal(syscall.SIGINT)
		if err := cmd.Wait(); err != nil {
			t.Fatalf("rbscope alloc --upload: %v\n%s", err, errb.String())
		}
		var pushed, pushedAllocs int64
		_, said, _ := strings.Cut(errb.String(), "rbscope alloc: pushed ")
		if _, err := fmt.Sscanf(said, "%d allocation profiles (%d allocations)", &pushed, &pushedAllocs); err != nil {
			t.Fatalf("rbscope alloc did not say what it pushed (%v):\n%s", err, errb.String())
		}
		if pushed < 2 {
			t.Errorf("pushed %d profiles in %.1f s of allocations at --upload-interval 1s, want several", pushed, secs)
		}
		b, err := os.ReadFile(local)
		if err != nil {
			t.Fatal(err)
		}
		var doc struct {
			ByClass []struct {
				Class string `json:"class"`
				Count int64  `json:"count"`
			} `json:"by_class"`
		}
		if err := json.Unmarshal(b, &doc); err != nil {
			t.Fatal(err)
		}
		var total, widgets int64
		for _, c := range doc.ByClass {
			total += c.Count
			if c.Class == "Widget" {
				widgets = c.Count
			}
		}
		if widgets != made {
			t.Fatalf("local report: %d Widgets, the script made %d", widgets, made)
		}
		if pushedAllocs != total {
			t.Errorf("pushed %d allocations, the local report has %d", pushedAllocs, total)
		}
		ctx := context.Background()
		from, until := start.Add(-time.Minute), time.Now().Add(time.Minute)
		var typeID string
		var got pyroscopetest.Counts
		deadline := time.Now().Add(30 * time.Second)
		for {
			types, err := srv.ProfileTypes(ctx, from, until)
			for _, id := range types {
				if strings.Contains(id, "alloc_objects") {
					typeID = id
				}
			}
			if typeID != "" {
				got, err = srv.QueryType(ctx, typeID, pyroscopetest.AppSelector(app), from, until)
				if err == nil && got.Total >= total {
					break
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("server: types %v, %q total %d (err %v), want %d", types, typeID, got.Total, err, total)
			}
			time.Sleep(500 * time.Millisecond)
		}
		t.Logf("server %s: %d allocations (%d Widgets), local report %d", typeID, got.Total, got.Self["Widget"], total)
		if got.Total != total {
			t.Errorf("server holds %d allocations, the local report %d", got.Total, total)
		}
		if got.Self["Widget"] != widgets {
			t.Errorf("server: %d Widgets, local %d", got.Self["Widget"], widgets)
		}
		// Profiles are stamped with their interval's start: both halves
		// of the workload hold some.
		mid := tGo.Add(time.Duration(secs / 2 * float64(time.Second)))
		var halves [2]pyroscopetest.Counts
		for i, r := range [][2]time.Time{{from, mid}, {mid, until}} {
			if halves[i], err = srv.QueryType(ctx, typeID, pyroscopetest.AppSelector(app), r[0], r[1]); err != nil {
				t.Fatal(err)
			}
		}
		t.Logf("server: %d Widgets in profiles stamped before the middle of the workload, %d after", halves[0].Self["Widget"], halves[1].Self["Widget"])
		if halves[0].Self["Widget"] == 0 || halves[1].Self["Widget"] == 0 || halves[0].Total+halves[1].Total != got.Total {
			t.Errorf("server: %d + %d allocations (%d + %d Widgets) stamped before and after the middle, want both halves holding Widgets and %d in all",
				halves[0].Total, halves[1].Total, halves[0].Self["Widget"], halves[1].Self["Widget"], got.Total)
		}
		chained := int64(0)
		for st, v := range got.Stacks {
			if strings.Contains(st, "A#outer;B#middle;C#inner") {
				chained += v
			}
		}
		if chained < widgets*95/100 {
			t.Errorf("server: %d of %d Widgets under A#outer;B#middle;C#inner", chained, widgets)
		}
	})
}

// TestAllocJobExits: rbscope alloc follows a job that exits on its own
// (testdata/exiting.rb: 0.3 s of allocations, then its own counts as its
// last words) and writes its report when the job is gone, in every mode
// (the default duty cycle, --exact, --no-sites) and every format, and
// exits 0. The default mode's totals run to the job's end: Ruby's counter
// is read at its teardown (counter_end "exit"), and the JSON's total is
// within 5% of GC.stat(:total_allocated_objects)'s growth; --exact counts
// every Widget the job made.
func TestAllocJobExits(t *testing.T) {
	allocNeedRoot(t)
	// The stack views run the 1 s job: in the default mode (3 % duty
	// cycle, one counted allocation in 64 with its stack) the 0.3 s one
	// may end, on a loaded machine, with no stack sampled at all (then
	// the view is empty and rbscope says why, see TestAllocNoStacks).
	// Likewise a class's share: the 0.3 s job's default-mode totals are
	// Ruby's own counter's, and are checked; its Widgets, estimated from
	// the events of about 3 windows of 3 ms (fewer when a loaded machine
	// starves the job or rbscope), are checked on the 1 s job (CI at load
	// 13: 0 Widgets estimated of 27,000, the total right), logged on the
	// 0.3 s one, as TestExitingJob does.
	cases := []struct {
		name, format, secs string
		args               []string
	}{
		{"default-json", "json", "0.3", nil},
		{"default-json-1s", "json", "1", nil},
		{"exact-text", "text", "0.3", []string{"--exact"}},
		{"exact-nosites-json", "json", "0.3", []string{"--exact", "--no-sites"}},
		{"nosites-pprof", "pprof", "1", []string{"--no-sites"}},
		{"default-flamegraph", "flamegraph", "1", nil},
		{"default-speedscope", "speedscope", "1", nil},
		{"default-collapsed", "collapsed", "1", nil},
	}
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				p := startAllocRuby(t, rb, nil, "exiting.rb", c.secs)
				p.Expect(t, "ready")
				pid := p.Pid
				out := filepath.Join(t.TempDir(), "report."+c.format)
				args := append([]string{"alloc", "--pid", strconv.Itoa(pid), "--format", c.format, "-o", out}, c.args...)
				cmd := exec.Command(binPath, args...)
				cmd.Env = rb.ProfilerEnv(t)
				errb := newAttachedWriter()
				cmd.Stderr = errb
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
				errb.wait(t, 30*time.Second)
				p.Send(t, "go")
				var before, after, gc0, gc1, widgets int64
				select {
				case l := <-p.Lines:
					if _, err := fmt.Sscanf(l, "stat %d %d %d %d %d", &before, &after, &gc0, &gc1, &widgets); err != nil {
						t.Fatalf("script said %q: %v", l, err)
					}
				case <-time.After(60 * time.Second):
					t.Fatal("the script did not finish")
				}
				done := make(chan error, 1)
				go func() { done <- cmd.Wait() }()
				select {
				case err := <-done:
					if err != nil {
						t.Fatalf("rbscope alloc: %v\n%s", err, errb.String())
					}
				case <-time.After(30 * time.Second):
					t.Fatalf("rbscope alloc did not stop after the job exited:\n%s", errb.String())
				}
				if !strings.Contains(errb.String(), fmt.Sprintf("process %d exited", pid)) {
					t.Errorf("stderr does not say the process exited:\n%s", errb.String())
				}
				b, err := os.ReadFile(out)
				if err != nil {
					t.Fatalf("no report: %v\n%s", err, errb.String())
				}
				checkExitReport(t, c.format, c.args, c.secs == "0.3", b, after-before, widgets)
			})
		}
	})
}

// checkExitReport checks a report of testdata/exiting.rb in format: it
// names Widget; a JSON report's Widgets are the job's (exactly with
// --exact, within 5% otherwise, but for a short job's estimate: logged)
// and a default-mode one's total is within 5% of what Ruby counted, read
// at the job's exit.
func checkExitReport(t *testing.T, format string, args []string, short bool, b []byte, allocated, widgets int64) {
	t.Helper()
	exact := slices.Contains(args, "--exact")
	// A short job's class shares in the default mode are logged only
	// (see TestAllocJobExits).
	classErrorf := t.Errorf
	if short && !exact {
		classErrorf = t.Logf
	}
	switch format {
	case "pprof":
		p, err := profile.ParseData(b)
		if err != nil {
			t.Fatalf("not a pprof profile: %v", err)
		}
		var n int64
		for _, s := range p.Sample {
			if len(s.Location) > 0 && len(s.Location[0].Line) > 0 && s.Location[0].Line[0].Function.Name == "Widget" {
				n += s.Value[0]
			}
		}
		if math.Abs(float64(n)/float64(widgets)-1) > 0.05 {
			classErrorf("pprof: %d Widgets, the job made %d", n, widgets)
		}
	case "json":
		var doc struct {
			Scaling       string  `json:"scaling"`
			CounterEnd    string  `json:"counter_end"`
			CounterSource string  `json:"counter_source"`
			Attached      float64 `json:"attached_fraction"`
			Loose         int     `json:"loose_windows"`
			ByClass       []struct {
				Class string `json:"class"`
				Count int64  `json:"count"`
			} `json:"by_class"`
		}
		if err := json.Unmarshal(b, &doc); err != nil {
			t.Fatalf("not JSON: %v\n%s", err, b)
		}
		var total, n int64
		for _, c := range doc.ByClass {
			total += c.Count
			if c.Class == "Widget" {
				n = c.Count
			}
		}
		switch {
		case exact && n != widgets:
			t.Errorf("--exact: %d Widgets, the job made %d", n, widgets)
		case !exact && math.Abs(float64(n)/float64(widgets)-1) > 0.05:
			classErrorf("%d Widgets estimated, the job made %d", n, widgets)
		}
		if !exact {
			t.Logf("estimated: %d allocations (%d Widgets), GC.stat %d (%d Widgets made); scaling %s, counter %s, counter_end %s, counted %.1f%% of the time, %d loose windows",
				total, n, allocated, widgets, doc.Scaling, doc.CounterSource, doc.CounterEnd, 100*doc.Attached, doc.Loose)
			if doc.Scaling != "counter" || doc.CounterEnd != "exit" {
				t.Errorf("scaling %q, counter_end %q: want Ruby's counter, read at exit", doc.Scaling, doc.CounterEnd)
			}
			if d := float64(total)/float64(allocated) - 1; math.Abs(d) > 0.05 {
				t.Errorf("estimated total %d, GC.stat says %d allocated (%+.1f%%)", total, allocated, 100*d)
			}
		}
	default:
		if !bytes.Contains(b, []byte("Widget")) {
			t.Errorf("%s report does not name Widget:\n%.2000s", format, b)
		}
	}
}

// TestAllocNoStacks: a job that exits before any allocation stack was
// sampled (exiting.rb with 0 seconds of allocations, default mode) still
// gets its speedscope view, empty and valid, and stderr says why.
func TestAllocNoStacks(t *testing.T) {
	allocNeedRoot(t)
	rb := testutil.SystemRuby(t)
	p := startAllocRuby(t, rb, nil, "exiting.rb", "0")
	p.Expect(t, "ready")
	out := filepath.Join(t.TempDir(), "report.speedscope")
	cmd := exec.Command(binPath, "alloc", "--pid", strconv.Itoa(p.Pid), "--format", "speedscope", "-o", out)
	cmd.Env = rb.ProfilerEnv(t)
	errb := newAttachedWriter()
	cmd.Stderr = errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	errb.wait(t, 30*time.Second)
	p.Send(t, "go")
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("rbscope alloc: %v\n%s", err, errb.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("rbscope alloc did not stop after the job exited:\n%s", errb.String())
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatalf("no speedscope file: %v\n%s", err, errb.String())
	}
	var doc struct {
		Schema string `json:"$schema"`
	}
	if err := json.Unmarshal(b, &doc); err != nil || !strings.Contains(doc.Schema, "speedscope") {
		t.Fatalf("not a speedscope file (%v):\n%.500s", err, b)
	}
	if !bytes.Contains(b, []byte("Widget")) && !strings.Contains(errb.String(), "no allocation stack was sampled") {
		t.Errorf("an empty view, and stderr does not say why:\n%s", errb.String())
	}
}

package postmortem

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/stack"
	"github.com/rbscope/rbscope/internal/testutil"
)

// These tests change /proc/sys/kernel/core_pattern, which is global: they
// hold an exclusive lock on coreLockFile meanwhile (any package that
// changes core_pattern in tests must take it too) and restore the
// previous value in t.Cleanup, whatever happens.
const coreLockFile = "/tmp/rbscope-core_pattern.lock"

var binPath string

// TestMain builds the rbscope binary the kernel will run as the handler.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "rbscope-postmortem")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	os.Chmod(dir, 0o755)
	binPath = filepath.Join(dir, "rbscope")
	cmd := exec.Command("go", "build", "-o", binPath, "../../cmd/rbscope")
	if out, err := cmd.CombinedOutput(); err != nil {
		os.Stderr.Write(out)
		os.Exit(2)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// shortDir is a report directory with a short path: the core_pattern line
// must fit in 127 bytes.
func shortDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "rbpm")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		testutil.Missing(t, "needs root: sets /proc/sys/kernel/core_pattern")
	}
	if _, err := os.Stat(CorePatternFile); err != nil {
		testutil.Missing(t, "no %s: %v", CorePatternFile, err)
	}
}

// lockCorePattern takes the core_pattern lock and restores the current
// value when the test ends.
func lockCorePattern(t *testing.T) {
	t.Helper()
	needRoot(t)
	f, err := os.OpenFile(coreLockFile, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	orig, err := ReadPattern(CorePatternFile)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := WritePattern(CorePatternFile, orig); err != nil {
			t.Errorf("restore core_pattern: %v", err)
		}
		syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	})
}

func runBin(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(binPath, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("rbscope %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// install installs the handler for dir (uninstalled at the end).
func install(t *testing.T, dir string, flags ...string) {
	t.Helper()
	runBin(t, append([]string{"core-handler", "install", "--dir", dir}, flags...)...)
	got, _ := ReadPattern(CorePatternFile)
	if !strings.HasPrefix(got, "|"+binPath+" core-handler --dir "+dir) || !strings.Contains(got, " %P %i %s %t %e") {
		t.Fatalf("core_pattern after install: %q", got)
	}
	t.Cleanup(func() {
		exec.Command(binPath, "core-handler", "uninstall", "--dir", dir).Run()
	})
}

// crash runs a command expected to die from a signal and returns its pid
// and combined output.
func crash(t *testing.T, name string, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(name, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus)
		if err == nil || !ws.Signaled() || !ws.CoreDump() {
			t.Fatalf("%s %v: want a death by signal with a core dump, got %v (%v)\n%s", name, args, err, ws, out.String())
		}
		deaths.Store(cmd.Process.Pid, int(ws.Signal()))
	case <-time.After(60 * time.Second):
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		t.Fatalf("%s %v did not crash within 60s\n%s", name, args, out.String())
	}
	return cmd.Process.Pid, out.String()
}

// deaths holds the signal each crashed pid died from, as wait(2) said.
var deaths sync.Map

// deathSignal is the signal pid died from: the truth a report's signal is
// checked against (Ruby 3.1 aborts after its [BUG] report, 3.3 re-raises
// the SIGSEGV).
func deathSignal(t *testing.T, pid int) int {
	t.Helper()
	s, ok := deaths.Load(pid)
	if !ok {
		t.Fatalf("no death recorded for pid %d", pid)
	}
	return s.(int)
}

func crashRuby(t *testing.T, rb testutil.RubyUnderTest, script string) (int, string) {
	t.Helper()
	argv := rb.Argv(filepath.Join("testdata", script))
	return crash(t, argv[0], argv[1:]...)
}

// waitLog waits for the handler's log line about pid.
func waitLog(t *testing.T, dir string, pid int) string {
	t.Helper()
	key := fmt.Sprintf(" pid=%d ", pid)
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		b, _ := os.ReadFile(filepath.Join(dir, LogName))
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, key) {
				return l
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	b, _ := os.ReadFile(filepath.Join(dir, LogName))
	t.Fatalf("no log line for pid %d in %s within 90s; log:\n%s", pid, LogName, b)
	return ""
}

// reportOf waits for the handler and loads the report of pid.
func reportOf(t *testing.T, dir string, pid int) *Report {
	t.Helper()
	line := waitLog(t, dir, pid)
	i := strings.Index(line, ": report ")
	if i < 0 {
		t.Fatalf("no report for pid %d: %s", pid, line)
	}
	id := strings.Fields(line[i+len(": report "):])[0]
	r, err := Load(dir, id)
	if err != nil {
		t.Fatal(err)
	}
	if r.Pid != pid {
		t.Fatalf("report %s has pid %d, want %d", id, r.Pid, pid)
	}
	return r
}

func threadNamed(t *testing.T, r *Report, name string) stack.Thread {
	t.Helper()
	for _, th := range r.Threads {
		if th.Name == name {
			return th
		}
	}
	b, _ := json.MarshalIndent(r.Threads, "", " ")
	t.Fatalf("no thread %q in report %s:\n%s", name, r.ID, b)
	return stack.Thread{}
}

type wantFrame struct {
	name string
	line int
}

// checkFrames compares the innermost frames of th with want (path: the
// script's absolute path).
func checkFrames(t *testing.T, th stack.Thread, script string, want ...wantFrame) {
	t.Helper()
	path, _ := filepath.Abs(filepath.Join("testdata", script))
	var got []string
	for _, f := range th.Frames {
		got = append(got, fmt.Sprintf("%s@%s:%d", f.Name, filepath.Base(f.Path), f.Line))
	}
	if len(th.Frames) < len(want) {
		t.Fatalf("thread %q: frames %v, want at least %v", th.Name, got, want)
	}
	for i, w := range want {
		f := th.Frames[i]
		if f.Name != w.name || f.Line != w.line || (f.Path != path && f.Path != filepath.Join("testdata", script)) {
			t.Errorf("thread %q frame %d: %s %s:%d, want %s %s:%d (all: %v)", th.Name, i, f.Name, f.Path, f.Line, w.name, path, w.line, got)
		}
	}
}

func TestRubyCrashReports(t *testing.T) {
	lockCorePattern(t)
	testutil.EachRuby(t, testRubyCrashReports)
}

func testRubyCrashReports(t *testing.T, rb testutil.RubyUnderTest) {
	dir := shortDir(t)
	install(t, dir)
	exe, err := filepath.EvalSymlinks(rb.Exe)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("segv from a thread", func(t *testing.T) {
		pid, out := crashRuby(t, rb, "segv_thread.rb")
		if !strings.Contains(out, "[BUG] Segmentation fault") {
			t.Errorf("Ruby printed no crash report:\n%s", out)
		}
		r := reportOf(t, dir, pid)
		// Ruby's SEGV handler prints its report, then aborts (3.1) or
		// re-raises SIGSEGV (3.3): the core says what killed the process.
		sig := deathSignal(t, pid)
		if r.Signal != sig || (sig != 6 && sig != 11) || r.SignalName != SignalName(sig) {
			t.Errorf("signal %d %s, the process died from %d", r.Signal, r.SignalName, sig)
		}
		if r.RubyVersion != rb.Version || len(r.Errors) != 0 || r.Core.Truncated || r.Core.Bytes < 1<<20 {
			t.Errorf("version %q errors %q core %+v", r.RubyVersion, r.Errors, r.Core)
		}
		if r.Executable != exe || len(r.Cmdline) != len(rb.Argv("x")) || !strings.HasSuffix(r.Cmdline[len(r.Cmdline)-1], "segv_thread.rb") {
			t.Errorf("executable %q cmdline %q", r.Executable, r.Cmdline)
		}
		if r.Comm != "ruby" || len(r.Mappings) < 20 {
			t.Errorf("comm %q, %d mappings", r.Comm, len(r.Mappings))
		}
		checkFrames(t, threadNamed(t, r, "crasher"), "segv_thread.rb",
			wantFrame{"Kernel#sleep", 5}, wantFrame{"Object#crash_here", 5}, wantFrame{"block in <main>", 10})
		// The process-directed signal went to the main thread, in join.
		main := threadNamed(t, r, "ruby")
		checkFrames(t, main, "segv_thread.rb", wantFrame{"Thread#join", 12}, wantFrame{"<main>", 12})
		if !main.Main || r.TID != pid || r.CrashThread().TID != pid {
			t.Errorf("main thread %d (main %v), report tid %d, crash thread %d", main.TID, main.Main, r.TID, r.CrashThread().TID)
		}
		txt, err := os.ReadFile(filepath.Join(dir, r.ID+".txt"))
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{fmt.Sprintf("Signal:     %s (%d)", SignalName(sig), sig), "Thread " + strconv.Itoa(pid), "    Object#crash_here (" + filepath.Join(mustAbs(t, "testdata"), "segv_thread.rb") + ":5)"} {
			if !strings.Contains(string(txt), want) {
				t.Errorf("text report lacks %q:\n%s", want, txt)
			}
		}
	})

	t.Run("abort through fiddle", func(t *testing.T) {
		pid, _ := crashRuby(t, rb, "abort_fiddle.rb")
		r := reportOf(t, dir, pid)
		if r.Signal != 6 {
			t.Errorf("signal %d, want 6", r.Signal)
		}
		th := threadNamed(t, r, "aborter")
		checkFrames(t, th, "abort_fiddle.rb",
			wantFrame{"Fiddle::Function#call", 6}, wantFrame{"Crasher#abort_here", 6}, wantFrame{"block in <main>", 12})
		// abort(3) raises SIGABRT in the calling thread, which Fiddle
		// called without the GVL (need_gvl: false): the crash thread is
		// found by the kernel's tid, not by the GVL, which it does not own.
		if r.TID != th.TID || r.TID == pid || r.CrashThread().Name != "aborter" || th.GVL || th.Activity != stack.ActivityBlocked {
			t.Errorf("report tid %d, aborter %d (gvl %v, activity %s), crash thread %q", r.TID, th.TID, th.GVL, th.Activity, r.CrashThread().Name)
		}
		if top := r.TopFrame(); !strings.HasPrefix(top, "Fiddle::Function#call (") {
			t.Errorf("top frame %q", top)
		}
	})

	t.Run("segfault with threads alive", func(t *testing.T) {
		pid, _ := crashRuby(t, rb, "threads.rb")
		r := reportOf(t, dir, pid)
		if sig := deathSignal(t, pid); r.Signal != sig || len(r.Threads) != 3 {
			t.Errorf("signal %d, %d threads, want %d and 3", r.Signal, len(r.Threads), sig)
		}
		checkFrames(t, threadNamed(t, r, "ruby"), "threads.rb",
			wantFrame{"Fiddle::Function#call", 16}, wantFrame{"Object#segv_here", 16}, wantFrame{"<main>", 24})
		checkFrames(t, threadNamed(t, r, "alpha"), "threads.rb",
			wantFrame{"Kernel#sleep", 7}, wantFrame{"Object#wait_alpha", 7}, wantFrame{"block in <main>", 20})
		checkFrames(t, threadNamed(t, r, "beta"), "threads.rb",
			wantFrame{"Kernel#sleep", 12}, wantFrame{"Object#wait_beta", 12}, wantFrame{"block in <main>", 21})
		if r.TID != pid {
			t.Errorf("tid %d, want the main thread %d", r.TID, pid)
		}
	})

	t.Run("crashes lists them", func(t *testing.T) {
		out := runBin(t, "crashes", "--dir", dir, "--format", "json")
		var list []map[string]any
		if err := json.Unmarshal([]byte(out), &list); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		if len(list) != 3 {
			t.Fatalf("%d crashes listed, want 3:\n%s", len(list), out)
		}
		// Newest first: threads.rb's crash.
		if top := list[0]["top_frame"].(string); !strings.HasPrefix(top, "Fiddle::Function#call (") || !strings.HasSuffix(top, "threads.rb:16)") {
			t.Errorf("newest top frame %q", top)
		}
		if top := list[2]["top_frame"].(string); !strings.HasPrefix(top, "Thread#join (") {
			t.Errorf("oldest top frame %q", top)
		}
		text := runBin(t, "crashes", "--dir", dir)
		if n := strings.Count(text, "SIGABRT") + strings.Count(text, "SIGSEGV"); n != 3 {
			t.Errorf("text listing has %d SIGABRT/SIGSEGV rows, want 3:\n%s", n, text)
		}
		id := list[1]["id"].(string)
		show := runBin(t, "crashes", "--dir", dir, "show", id)
		if !strings.HasPrefix(show, "Crash "+id+"\n") || !strings.Contains(show, "Crasher#abort_here") {
			t.Errorf("show %s:\n%s", id, show)
		}
	})
}

func mustAbs(t *testing.T, p string) string {
	a, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// sleepCrash starts sleep and kills it with SIGSEGV.
func sleepCrash(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	cmd.Process.Signal(syscall.SIGSEGV)
	err := cmd.Wait()
	ws := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if err == nil || ws.Signal() != syscall.SIGSEGV || !ws.CoreDump() {
		t.Fatalf("sleep: %v %v, want a core-dumping SIGSEGV", err, ws)
	}
	return cmd.Process.Pid
}

func TestNonRubyCrashLeavesALogLine(t *testing.T) {
	lockCorePattern(t)
	dir := shortDir(t)
	install(t, dir, "--chain", "none")
	pid := sleepCrash(t)
	line := waitLog(t, dir, pid)
	if !strings.Contains(line, "signal=SIGSEGV(11)") || !strings.Contains(line, "not a Ruby process (/usr/bin/sleep): nothing saved") {
		t.Errorf("log line %q", line)
	}
	time.Sleep(200 * time.Millisecond)
	ents, _ := os.ReadDir(dir)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if strings.Join(names, " ") != LogName+" "+PreviousPatternName {
		t.Errorf("report directory holds %v, want only the log and the saved pattern", names)
	}
}

func TestChainedHandlerGetsNonRubyCores(t *testing.T) {
	lockCorePattern(t)
	dir := shortDir(t)
	out := filepath.Join(t.TempDir(), "chained")
	script := filepath.Join(t.TempDir(), "chain.sh")
	os.WriteFile(script, []byte("#!/bin/sh\necho \"$@\" > "+out+".tmp\nwc -c >> "+out+".tmp\nmv "+out+".tmp "+out+"\n"), 0o755)
	// The previous core_pattern is a pipe: install chains to it by itself.
	if err := WritePattern(CorePatternFile, "|"+script+" %P %s %e %u"); err != nil {
		t.Fatal(err)
	}
	install(t, dir)
	if got, _ := ReadPattern(CorePatternFile); !strings.HasSuffix(got, chainSpecs) {
		t.Errorf("core_pattern %q does not pass %q for the chain", got, chainSpecs)
	}
	pid := sleepCrash(t)
	line := waitLog(t, dir, pid)
	if !strings.Contains(line, "bytes of core passed to "+script) {
		t.Errorf("log line %q", line)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatalf("the chained handler wrote nothing: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 2 || lines[0] != fmt.Sprintf("%d 11 sleep 0", pid) {
		t.Errorf("chained handler saw %q, want args %q", b, fmt.Sprintf("%d 11 sleep 0", pid))
	}
	if n, _ := strconv.Atoi(strings.TrimSpace(lines[len(lines)-1])); n < 100<<10 {
		t.Errorf("chained handler read %d bytes of core", n)
	}
	// Uninstall gives the chained handler its place back.
	runBin(t, "core-handler", "uninstall", "--dir", dir)
	if got, _ := ReadPattern(CorePatternFile); got != "|"+script+" %P %s %e %u" {
		t.Errorf("core_pattern after uninstall: %q", got)
	}
}

func TestTruncatedCoreStillReported(t *testing.T) {
	lockCorePattern(t)
	dir := shortDir(t)
	const limit = 3 << 20
	install(t, dir, "--max-core-size", strconv.Itoa(limit))
	pid, _ := crashRuby(t, testutil.SystemRuby(t), "segv_thread.rb")
	r := reportOf(t, dir, pid)
	if !r.Core.Truncated || r.Core.Bytes != limit || r.Core.Limit != limit {
		t.Errorf("core %+v, want truncated at %d", r.Core, limit)
	}
	if len(r.Mappings) < 20 || len(r.Cmdline) != 2 {
		t.Errorf("%d mappings, cmdline %q", len(r.Mappings), r.Cmdline)
	}
	txt, _ := os.ReadFile(filepath.Join(dir, r.ID+".txt"))
	if !strings.Contains(string(txt), fmt.Sprintf("TRUNCATED at the %d-byte cap", limit)) {
		t.Errorf("text report does not say the core was truncated:\n%.600s", txt)
	}
	if line := waitLog(t, dir, pid); !strings.Contains(line, fmt.Sprintf("core truncated at %d bytes", limit)) {
		t.Errorf("log line %q", line)
	}
	if m, _ := filepath.Glob(filepath.Join(dir, ".*core*")); len(m) != 0 {
		t.Errorf("left behind: %v", m)
	}
}

func TestRetentionAndKeptCores(t *testing.T) {
	lockCorePattern(t)
	dir := shortDir(t)
	install(t, dir, "--keep", "2", "--keep-core")
	var pids []int
	for i := 0; i < 3; i++ {
		pid, _ := crashRuby(t, testutil.SystemRuby(t), "segv_thread.rb")
		waitLog(t, dir, pid)
		pids = append(pids, pid)
	}
	reports, err := List(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(reports) != 2 || reports[0].Pid != pids[2] || reports[1].Pid != pids[1] {
		var got []int
		for _, r := range reports {
			got = append(got, r.Pid)
		}
		t.Fatalf("reports of pids %v, want the newest two of %v", got, pids)
	}
	for _, suffix := range []string{"*.json", "*.txt", "*.core.gz"} {
		if m, _ := filepath.Glob(filepath.Join(dir, suffix)); len(m) != 2 {
			t.Errorf("%d %s files, want 2: %v", len(m), suffix, m)
		}
	}
	// The kept core reads back with snapshot.
	r := reports[0]
	if r.Core.Kept != r.ID+".core.gz" {
		t.Fatalf("kept %q", r.Core.Kept)
	}
	out := runBin(t, "snapshot", "--core", filepath.Join(dir, r.Core.Kept), "--format", "json")
	var doc struct {
		Threads []stack.Thread `json:"threads"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(doc.Threads) != 2 || !strings.Contains(out, `"Object#crash_here"`) {
		t.Errorf("snapshot of the kept core:\n%s", out)
	}
}

// TestSnapshotOfKernelCore checks snapshot --core on a core the kernel
// wrote itself (coredump_filter leaves the binaries' pages out).
func TestSnapshotOfKernelCore(t *testing.T) {
	lockCorePattern(t)
	dir := t.TempDir()
	os.Chmod(dir, 0o777)
	if err := WritePattern(CorePatternFile, filepath.Join(dir, "core.%p")); err != nil {
		t.Fatal(err)
	}
	ruby := testutil.Ruby(t)
	for _, tc := range []struct {
		script string
		thread string
		want   []wantFrame
	}{
		{"threads.rb", "alpha", []wantFrame{{"Kernel#sleep", 7}, {"Object#wait_alpha", 7}}},
		{"abort_fiddle.rb", "aborter", []wantFrame{{"Fiddle::Function#call", 6}, {"Crasher#abort_here", 6}}},
	} {
		pid, _ := crash(t, "/bin/sh", "-c", "ulimit -c unlimited && exec "+ruby+" testdata/"+tc.script)
		core := filepath.Join(dir, fmt.Sprintf("core.%d", pid))
		if _, err := os.Stat(core); err != nil {
			t.Fatalf("the kernel wrote no core: %v", err)
		}
		out := runBin(t, "snapshot", "--core", core, "--format", "json")
		var doc struct {
			Pid     int            `json:"pid"`
			Threads []stack.Thread `json:"threads"`
		}
		if err := json.Unmarshal([]byte(out), &doc); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		if doc.Pid != pid {
			t.Errorf("pid %d, want %d", doc.Pid, pid)
		}
		r := &Report{Threads: doc.Threads}
		checkFrames(t, threadNamed(t, r, tc.thread), tc.script, tc.want...)
	}
}

func TestInstallNeedsRoot(t *testing.T) {
	needRoot(t)
	cmd := exec.Command(binPath, "core-handler", "install", "--dir", t.TempDir())
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "needs root: run it with sudo") || strings.Count(string(out), "\n") != 1 {
		t.Errorf("install as nobody: %v %q", err, out)
	}
}

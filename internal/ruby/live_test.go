package ruby

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/stack"
	"github.com/rbscope/rbscope/internal/target"
	"github.com/rbscope/rbscope/internal/testutil"
)

// rubyReport is what testdata/ruby/stacks.rb prints: Ruby's own
// caller_locations for one thread.
type rubyReport struct {
	Thread string `json:"thread"`
	Frames []struct {
		Label string `json:"label"`
		Path  string `json:"path"`
		Line  int    `json:"line"`
	} `json:"frames"`
}

// qualified maps Ruby 3.1's unqualified labels to the Ruby 3.4-style
// names rbscope must print for the methods in stacks.rb.
var qualified = map[string]string{
	"checkpoint":       "Object#checkpoint",
	"block in level3":  "block in Outer::Inner#level3",
	"each":             "Array#each",
	"level3":           "Outer::Inner#level3",
	"block in level2":  "block in Outer::Inner#level2",
	"times":            "Integer#times",
	"level2":           "Outer::Inner#level2",
	"helper":           "Outer.helper",
	"recurse":          "Deep#recurse",
	"método_ñ":         "Ünïcödé#método_ñ",
	"boot":             "Loaded.boot",
	"require_relative": "Kernel#require_relative",
	"block in <main>":  "block in <main>",
	"<top (required)>": "<top (required)>",
	"<main>":           "<main>",
	"nap":              "Object#nap",
	"a":                "Fibers.a",
	"b":                "Fibers.b",
	"run":              "Fibers.run",

	"loop":                       "Kernel#loop",
	"then":                       "Kernel#then",
	"block (2 levels) in <main>": "block (2 levels) in <main>",
	"block (3 levels) in <main>": "block (3 levels) in <main>",
}

// isQualifiedName reports whether label is one of the names qualified
// maps to: Ruby 3.4's own label for that method.
func isQualifiedName(label string) bool {
	for _, q := range qualified {
		if q == label {
			return true
		}
	}
	return false
}

// openRunning opens the running Ruby process pid, closed when the test
// ends.
func openRunning(t *testing.T, pid int) *Process { return openRunningWith(t, pid, nil) }

// openRunningWith is openRunning with the Runtimes rts (nil: its own).
func openRunningWith(t *testing.T, pid int, rts *Runtimes) *Process {
	t.Helper()
	tg, err := target.OpenLive(pid)
	if err != nil {
		t.Fatalf("open live target %d: %v", pid, err)
	}
	t.Cleanup(func() { tg.Close() })
	p, err := Open(context.Background(), Spec{Target: tg, Consistency: Running, Options: Options{Runtimes: rts}})
	if err != nil {
		t.Fatalf("open Ruby process %d: %v", pid, err)
	}
	return p
}

func snapshotLive(t *testing.T, pid int) ([]stack.Thread, *Process) {
	t.Helper()
	p := openRunning(t, pid)
	var err error
	// A thread may still be between printing its report and sleeping,
	// and a running thread's stack may change while it is read (then it
	// carries an Error and no frames, more often when it runs on another
	// core): retry until every reported thread is inside Kernel#sleep and
	// every stack was read whole.
	var threads []stack.Thread
	for i := 0; i < 50; i++ {
		threads, err = p.Snapshot()
		if err != nil {
			t.Fatalf("snapshot: %v", err)
		}
		if allSleeping(threads) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	return threads, p
}

func allSleeping(ths []stack.Thread) bool {
	for _, th := range ths {
		if th.Error != "" {
			return false
		}
		if th.Name == "gamma-spinner" || len(th.Frames) == 0 {
			continue
		}
		if th.Frames[0].Name != "Kernel#sleep" {
			return false
		}
	}
	return true
}

func reports(t *testing.T, p *testutil.Proc) map[string]rubyReport {
	t.Helper()
	out := map[string]rubyReport{}
	for _, l := range p.Lines {
		var r rubyReport
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("bad report line %q: %v", l, err)
		}
		out[r.Thread] = r
	}
	return out
}

// checkAgainstRuby asserts that th's frames are exactly Ruby's view: the
// innermost Kernel#sleep (at the checkpoint's line) and then every frame
// caller_locations listed, with qualified names, paths and lines.
func checkAgainstRuby(t *testing.T, th stack.Thread, want rubyReport) {
	t.Helper()
	if m := mismatch(th, want); m != "" {
		t.Error(m)
	}
}

// mismatch says how th's stack differs from Ruby's report of it plus the
// sleep it is in ("" when it does not).
func mismatch(th stack.Thread, want rubyReport) string {
	if len(th.Frames) != len(want.Frames)+1 {
		return fmt.Sprintf("thread %q: %d frames, Ruby says %d (+1 for sleep):\n%s", th.Name, len(th.Frames), len(want.Frames), dump(th.Frames))
	}
	var b strings.Builder
	sl := th.Frames[0]
	if sl.Name != "Kernel#sleep" || sl.Kind != stack.KindCFunc || sl.Path != want.Frames[0].Path || sl.Line != want.Frames[0].Line {
		fmt.Fprintf(&b, "thread %q: innermost frame %+v, want Kernel#sleep cfunc at %s:%d\n", th.Name, sl, want.Frames[0].Path, want.Frames[0].Line)
	}
	for i, wf := range want.Frames {
		got := th.Frames[i+1]
		wantName, ok := qualified[wf.Label]
		if !ok && isQualifiedName(wf.Label) {
			// Ruby 3.4+ labels are qualified already.
			wantName, ok = wf.Label, true
		}
		if !ok {
			return fmt.Sprintf("test has no qualified name for label %q", wf.Label)
		}
		path, line, ipath, iline := wf.Path, wf.Line, "", 0
		if strings.HasPrefix(wf.Path, stack.InternalPrefix) {
			// A method defined inside Ruby is shown as Ruby 3.4 shows
			// it: at its caller's place, the next outer frame outside
			// Ruby's own files, as caller_locations reports that frame.
			ipath, iline, path, line = wf.Path, wf.Line, "", 0
			for _, outer := range want.Frames[i+1:] {
				if !strings.HasPrefix(outer.Path, stack.InternalPrefix) {
					path, line = outer.Path, outer.Line
					break
				}
			}
		}
		if ipath == "" && strings.HasPrefix(got.InternalPath, stack.InternalPrefix) && !strings.HasPrefix(path, stack.InternalPrefix) {
			// Ruby 3.4+ reports a method defined inside Ruby (Array#each)
			// at its caller's place itself and hides its own file: the
			// place is compared, the internal file kept aside is not.
			ipath, iline = got.InternalPath, got.InternalLine
		}
		if got.Name != wantName || got.Path != path || got.Line != line || got.InternalPath != ipath || got.InternalLine != iline {
			fmt.Fprintf(&b, "thread %q frame %d: got %s (%s:%d, internal %q:%d), Ruby says %s (%s:%d, internal %q:%d)\n", th.Name, i+1,
				got.Name, got.Path, got.Line, got.InternalPath, got.InternalLine, wantName, path, line, ipath, iline)
		}
	}
	return strings.TrimSuffix(b.String(), "\n")
}

func dump(fs []stack.Frame) string {
	var b strings.Builder
	for _, f := range fs {
		fmt.Fprintf(&b, "  %s (%s:%d) %s\n", f.Name, f.Path, f.Line, f.Kind)
	}
	return b.String()
}

func findThread(ths []stack.Thread, name string) (stack.Thread, bool) {
	for _, th := range ths {
		if th.Name == name {
			return th, true
		}
	}
	return stack.Thread{}, false
}

func TestLiveScenariosMatchRuby(t *testing.T) {
	testutil.EachRuby(t, testLiveScenariosMatchRuby)
}

func testLiveScenariosMatchRuby(t *testing.T, rb testutil.RubyUnderTest) {
	rb.SetProfilerEnv(t)
	for _, sc := range []string{"nested", "internal", "deep", "unicode", "require"} {
		t.Run(sc, func(t *testing.T) {
			proc := rb.Start(t, "stacks.rb", sc)
			want := reports(t, proc)
			threads, p := snapshotLive(t, proc.Pid)
			if p.Version() != rb.Version {
				t.Errorf("Ruby version %q, the interpreter says %q", p.Version(), rb.Version)
			}
			if len(threads) != 2 {
				t.Fatalf("want 2 Ruby threads (main + worker), got %d", len(threads))
			}
			var main, worker stack.Thread
			for _, th := range threads {
				if th.Main {
					main = th
				} else {
					worker = th
				}
			}
			if main.TID != proc.Pid {
				t.Errorf("main thread tid %d, want the pid %d", main.TID, proc.Pid)
			}
			if worker.TID == 0 || worker.TID == proc.Pid {
				t.Errorf("worker tid %d", worker.TID)
			} else if _, err := os.Stat(fmt.Sprintf("/proc/%d/task/%d", proc.Pid, worker.TID)); err != nil {
				t.Errorf("worker tid %d is not a thread of %d", worker.TID, proc.Pid)
			}
			checkAgainstRuby(t, worker, want["main"])
			if sc == "deep" && len(worker.Frames) < 500 {
				t.Errorf("deep recursion: %d frames", len(worker.Frames))
			}
			// The main thread waits in Kernel#sleep called from <main>.
			if n := len(main.Frames); n < 2 || main.Frames[0].Name != "Kernel#sleep" || main.Frames[n-1].Name != "<main>" {
				t.Errorf("main thread frames:\n%s", dump(main.Frames))
			}
		})
	}
}

func TestLiveThreadsNamesAndStates(t *testing.T) {
	testutil.EachRuby(t, testLiveThreadsNamesAndStates)
}

func testLiveThreadsNamesAndStates(t *testing.T, rb testutil.RubyUnderTest) {
	rb.SetProfilerEnv(t)
	proc := rb.Start(t, "stacks.rb", "threads")
	want := reports(t, proc)
	threads, _ := snapshotLive(t, proc.Pid)
	if len(threads) != 4 {
		t.Fatalf("want 4 threads, got %d: %+v", len(threads), threads)
	}
	tids := map[int]bool{}
	gvl := 0
	for _, th := range threads {
		if tids[th.TID] {
			t.Errorf("duplicate tid %d", th.TID)
		}
		tids[th.TID] = true
		if th.GVL {
			gvl++
		}
	}
	if gvl > 1 {
		t.Errorf("%d threads claim the GVL", gvl)
	}
	for _, name := range []string{"alpha-worker", "beta-worker"} {
		th, ok := findThread(threads, name)
		if !ok {
			t.Fatalf("no thread named %q", name)
		}
		if th.State != StatusSleep {
			t.Errorf("%s state %q, want sleep (Thread#status of a sleeping thread)", name, th.State)
		}
		checkAgainstRuby(t, th, want[name])
	}
	sp, ok := findThread(threads, "gamma-spinner")
	if !ok {
		t.Fatal("no gamma-spinner thread")
	}
	if sp.State != StatusRun {
		t.Errorf("spinner state %q", sp.State)
	}
	names := []string{}
	for _, f := range sp.Frames {
		names = append(names, f.Name)
	}
	if got := strings.Join(names, " < "); !strings.Contains(got, "Kernel#loop < block in <main>") {
		t.Errorf("spinner frames: %s", got)
	}
}

func TestNoSymbolsFindsVMByScan(t *testing.T) {
	testutil.EachRuby(t, testNoSymbolsFindsVMByScan)
}

func testNoSymbolsFindsVMByScan(t *testing.T, rb testutil.RubyUnderTest) {
	rb.SetProfilerEnv(t)
	proc := rb.Start(t, "stacks.rb", "nested")
	want := reports(t, proc)
	tg, err := target.OpenLive(proc.Pid)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tg.Close() })
	p, err := Open(context.Background(), Spec{Target: tg, Consistency: Running, Options: Options{NoSymbols: true, Version: rb.Version}})
	if err != nil {
		t.Fatalf("open without symbols: %v", err)
	}
	if src := p.Info().AddressSources["ruby_current_vm_ptr"]; src != "memory scan" {
		t.Errorf("VM found by %q, want memory scan", src)
	}
	ths, err := p.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	for _, th := range ths {
		if !th.Main {
			checkAgainstRuby(t, th, want["main"])
		}
	}
}

func init() {
	// The benchgc scenario's chain of methods.
	for i := 0; i < 50; i++ {
		qualified[fmt.Sprintf("m%d", i)] = fmt.Sprintf("Chain#m%d", i)
		qualified[fmt.Sprintf("block in m%d", i)] = fmt.Sprintf("block in Chain#m%d", i)
	}
}

// snapshotCounted starts a scenario of stacks.rb, takes a first snapshot
// and returns Ruby's own report of the thread named report, the snapshot,
// the process and its target's read counter.
func snapshotCounted(t *testing.T, rb testutil.RubyUnderTest, scenario, report string) (rubyReport, []stack.Thread, *Process, target.ReadCounter) {
	t.Helper()
	rb.SetProfilerEnv(t)
	proc := rb.Start(t, "stacks.rb", scenario)
	want := reports(t, proc)[report]
	first, p := snapshotLive(t, proc.Pid)
	rc, ok := p.t.(target.ReadCounter)
	if !ok {
		t.Fatal("the live target counts no reads")
	}
	return want, first, p, rc
}

// TestNamesCheckedAfterGC: after a GC, the names of a stack cached before
// it are checked against their witnesses in a batch instead of read
// again, and are still Ruby's own (caller_locations). Counts reads, not
// time.
func TestNamesCheckedAfterGC(t *testing.T) {
	testutil.NeedRoot(t)
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		want, _, p, rc := snapshotCounted(t, rb, "benchgc", "chain")
		if p.gcCountAddr == 0 {
			t.Fatal("the GC count was not found")
		}
		for round := 0; round < 5; round++ {
			if err := p.waitForGC(10 * time.Second); err != nil {
				t.Fatalf("%v (the scenario runs GC.start every 0.5 ms)", err)
			}
			reads, checks := rc.ReadCalls(), p.witChecks
			ths, err := p.Snapshot()
			if err != nil {
				t.Fatal(err)
			}
			reads = rc.ReadCalls() - reads
			th, ok := findThread(ths, "chain")
			if !ok {
				t.Fatalf("no thread \"chain\" in %d threads", len(ths))
			}
			if th.Error != "" {
				continue // the GC moved again while the stack was read
			}
			checkAgainstRuby(t, th, want)
			if p.witChecks == checks {
				t.Errorf("round %d: no witness checked after a GC", round)
			}
			// ~10 on 3.1 and 3.3; naming the 50 frames again is ~600.
			if reads > 40 {
				t.Errorf("round %d: %d reads for a snapshot after a GC: cached names were read again", round, reads)
			}
			t.Logf("round %d: %d reads, %d witness checks", round, reads, p.witChecks-checks)
		}
	})
}

// TestUnchangedStacksNotWalked: a thread whose control frames are the
// same bytes as at the last two snapshots, which named them alike, with no
// GC since, gets the same stack without a walk; a tick in which no stack
// changed takes one batched read (the thread list with every thread's
// execution context and its control frames where they were last tick:
// guessRegions). The stacks are still Ruby's own (caller_locations).
func TestUnchangedStacksNotWalked(t *testing.T) {
	testutil.NeedRoot(t)
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		want, first, p, rc := snapshotCounted(t, rb, "nested", "main")
		if _, err := p.Snapshot(); err != nil { // the second walk
			t.Fatal(err)
		}
		skipped := 0
		for round := 0; round < 5; round++ {
			walks, reads, epoch := p.walks, rc.ReadCalls(), p.epoch
			ths, err := p.Snapshot()
			if err != nil {
				t.Fatal(err)
			}
			walks, reads = p.walks-walks, rc.ReadCalls()-reads
			if len(ths) != len(first) {
				t.Fatalf("round %d: %d threads, %d at first", round, len(ths), len(first))
			}
			for i, th := range ths {
				if th.Error != "" {
					t.Fatalf("round %d: thread %d: %s", round, th.TID, th.Error)
				}
				if !th.Main {
					checkAgainstRuby(t, th, want)
				}
				if len(th.Frames) == 0 || &th.Frames[0] != &first[i].Frames[0] {
					t.Errorf("round %d: thread %d: not the stack of the first snapshot", round, th.TID)
				}
			}
			if p.epoch != epoch {
				continue // a GC ran: names are checked again (TestNamesCheckedAfterGC)
			}
			skipped++
			if walks != 0 {
				t.Errorf("round %d: %d stacks walked, none changed", round, walks)
			}
			if reads != 1 {
				t.Errorf("round %d: %d reads, an unchanged tick takes 1", round, reads)
			}
		}
		if skipped == 0 {
			t.Error("a GC ran in every round")
		}
	})
}

// TestFiberSwitches: a thread that switches between two fibers is read
// from the execution context it runs now, not from the one read where it
// ran last tick (a tick reads the contexts of the last tick with the
// thread list, and again where a thread points elsewhere). Each fiber naps
// on the line it reported (caller_locations); every snapshot of the
// thread must show one of the two stacks, but for the moments of a switch.
func TestFiberSwitches(t *testing.T) {
	testutil.NeedRoot(t)
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		rb.SetProfilerEnv(t)
		proc := rb.Start(t, "stacks.rb", "fibers")
		want := reports(t, proc)
		_, p := snapshotLive(t, proc.Pid)
		var seen [2]int
		other, n := 0, 0
		var lastOther string
		for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); n++ {
			ths, err := p.Snapshot()
			if err != nil {
				t.Fatal(err)
			}
			th, ok := findThread(ths, "switcher")
			if !ok {
				t.Fatalf("no thread \"switcher\" in %d threads", len(ths))
			}
			ma, mb := mismatch(th, want["fiber-a"]), mismatch(th, want["fiber-b"])
			switch {
			case ma == "":
				seen[0]++
			case mb == "":
				seen[1]++
			default:
				other++
				lastOther = ma + "\n" + mb
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Logf("%d snapshots: %d in fiber a, %d in fiber b, %d elsewhere", n, seen[0], seen[1], other)
		if seen[0] < n/5 || seen[1] < n/5 || other > n/10 {
			t.Errorf("%d snapshots over ten switches: %d in fiber a, %d in fiber b, %d in neither; the last of those:\n%s",
				n, seen[0], seen[1], other, lastOther)
		}
	})
}

// TestNamesHealWhenSymbolsAppear: a process opened before its global
// symbol table can be found (launch mode opens Ruby while it boots) names
// C functions and classes once the table is found, without waiting for a
// GC: names decoded without it are not cached, and the memory scan for it
// is tried again.
func TestNamesHealWhenSymbolsAppear(t *testing.T) {
	testutil.NeedRoot(t)
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		rb.SetProfilerEnv(t)
		proc := rb.Start(t, "stacks.rb", "nested")
		want := reports(t, proc)["main"]
		_, p := snapshotLive(t, proc.Pid) // every thread asleep: the stacks stay
		// Open again, as if while Ruby boots: the table unknown and the
		// scan for it just failed.
		p, err := Open(context.Background(), Spec{Target: p.t, Consistency: Running})
		if err != nil {
			t.Fatal(err)
		}
		p.symbolsAddr = 0
		p.symScanNext = time.Now().Add(time.Hour)
		worker := func() stack.Thread {
			t.Helper()
			ths, err := p.Snapshot()
			if err != nil {
				t.Fatal(err)
			}
			for _, th := range ths {
				if !th.Main {
					return th
				}
			}
			t.Fatalf("no worker thread in %d threads", len(ths))
			return stack.Thread{}
		}
		before := worker()
		if n := len(before.Frames); n == 0 || before.Frames[0].Name != unnamedCFunc {
			t.Fatalf("without the symbol table the innermost frame is named:\n%s", dump(before.Frames))
		}
		gc := p.epoch
		p.symScanNext = time.Time{} // the next scan finds the table
		after := worker()
		if p.symbolsAddr == 0 {
			t.Fatal("the symbol table was not found by the second scan")
		}
		if p.epoch != gc {
			t.Logf("a GC ran meanwhile (epoch %d -> %d): this run does not tell", gc, p.epoch)
		}
		checkAgainstRuby(t, after, want)
	})
}

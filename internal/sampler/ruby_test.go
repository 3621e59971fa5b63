package sampler

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/procfs"
	"github.com/rbscope/rbscope/internal/ruby"
	"github.com/rbscope/rbscope/internal/stack"
	"github.com/rbscope/rbscope/internal/target"
	"github.com/rbscope/rbscope/internal/testutil"
)

// eachRuby runs f on every Ruby under test, as root.
func eachRuby(t *testing.T, f func(t *testing.T, rb testutil.RubyUnderTest)) {
	t.Helper()
	testutil.NeedRoot(t)
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		rb.SetProfilerEnv(t)
		f(t, rb)
	})
}

// startRuby runs script on rb (testutil.RubyUnderTest.StartSource, as
// script.rb) and waits for it to print "ready"; its process group is
// killed on cleanup.
func startRuby(t testing.TB, rb testutil.RubyUnderTest, script string, args ...string) *exec.Cmd {
	t.Helper()
	return rb.StartSource(t, "script.rb", script, args...).Cmd
}

const twoThreads = `
def busy_worker
  x = 0
  loop { x += 1 }
end
def idle_waiter
  sleep
end
t1 = Thread.new { busy_worker }
t1.name = "busy"
t2 = Thread.new { idle_waiter }
t2.name = "idle"
sleep 0.1
puts "ready"
$stdout.flush
t1.join
`

func openRuby(t testing.TB, pid int) *ruby.Process {
	t.Helper()
	p, err := ruby.Open(context.Background(), ruby.Spec{Pid: pid, Wait: 5 * time.Second})
	if err != nil {
		t.Fatalf("open ruby %d: %v", pid, err)
	}
	t.Cleanup(func() { p.Target().Close() })
	return p
}

// startTestdata starts this package's testdata/NAME (with args) under rb, with the
// profiler's environment, waits for its "ready" and opens it.
func startTestdata(t *testing.T, rb testutil.RubyUnderTest, name string, args ...string) (*testutil.Proc, *ruby.Process) {
	t.Helper()
	script, err := filepath.Abs(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	rb.SetProfilerEnv(t)
	proc := rb.Start(t, script, args...)
	p, err := ruby.Open(context.Background(), ruby.Spec{Pid: proc.Pid, Wait: 10 * time.Second})
	if err != nil {
		t.Fatalf("open ruby %d: %v", proc.Pid, err)
	}
	t.Cleanup(func() { p.Target().Close() })
	return proc, p
}

// checkBusyIdle checks the stack of a sample of the thread named "busy"
// (in busy_worker) or "idle" (asleep in idle_waiter), as the scripts that
// start such threads name them; other threads pass.
func checkBusyIdle(t *testing.T, s stack.Sample) {
	t.Helper()
	names := frameNames(s.Frames)
	switch s.ThreadName {
	case "busy":
		if !strings.Contains(names, "Object#busy_worker") {
			t.Errorf("busy thread stack %q", names)
		}
	case "idle":
		if !strings.HasPrefix(names, "Kernel#sleep;Object#idle_waiter") {
			t.Errorf("idle thread stack %q", names)
		}
	}
}

func frameNames(fs []stack.Frame) string {
	var b []string
	for _, f := range fs {
		b = append(b, f.Name)
	}
	return strings.Join(b, ";")
}

func TestRubySource(t *testing.T) { eachRuby(t, testRubySource) }

func testRubySource(t *testing.T, rb testutil.RubyUnderTest) {
	for _, blocking := range []bool{false, true} {
		name := "nonblocking"
		if blocking {
			name = "blocking"
		}
		t.Run(name, func(t *testing.T) {
			cmd := startRuby(t, rb, twoThreads)
			p := openRuby(t, cmd.Process.Pid)
			var opts RubyOptions
			if blocking {
				pz := target.NewPauser()
				defer pz.Close()
				opts.Pauser = pz
			}
			src := NewRubySource(p, opts)
			defer src.Close()
			onCPU := map[string]int{}
			seen := map[string]int{}
			st, err := Run(context.Background(), src, Config{Rate: 200, Duration: time.Second}, func(b []stack.Sample) {
				for _, s := range b {
					if s.Pid != cmd.Process.Pid || s.TID == 0 || s.Time.IsZero() {
						t.Errorf("sample without pid/tid/time: %+v", s)
					}
					seen[s.ThreadName]++
					if s.OnCPU {
						onCPU[s.ThreadName]++
					}
					checkBusyIdle(t, s)
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			// Without pausing, the busy thread's stack (its block frame is
			// pushed and popped on every iteration) can keep changing
			// while it is read: such a sample is counted as inconsistent,
			// never emitted. Allow a few.
			busyMin := st.Ticks
			if !blocking {
				busyMin = st.Ticks * 95 / 100
			}
			if st.Ticks < 20 || seen["busy"] < busyMin || seen["idle"] != st.Ticks || st.ErrorCount() != st.Errors[KindUnmapped] {
				t.Fatalf("ticks %d, samples per thread %v, errors %s (%v)", st.Ticks, seen, st.ErrorSummary(), st.LastError)
			}
			// The busy thread competes for the GVL with the main thread
			// (sleeping in join): it is on a CPU most of the time, the
			// sleeper never.
			// Blocking mode wakes the sleeper for each pause (ptrace
			// interrupts its futex wait, which restarts on resume): on a
			// loaded machine it can be seen runnable now and then.
			// Without pausing, Ruby's timer thread still wakes the
			// sleeper for interrupts once in a while.
			idleMax := st.Ticks / 50
			if blocking {
				// Seen up to 37% on a machine at load 15.
				idleMax = st.Ticks / 2
			}
			if onCPU["busy"] < st.Ticks/2 || onCPU["idle"] > idleMax {
				t.Errorf("on-CPU counts %v of %d ticks", onCPU, st.Ticks)
			}
			if len(st.Threads) != 3 {
				t.Errorf("threads %+v, want main, busy, idle", st.Threads)
			}
			// After sampling, the target runs normally.
			for tid, s := range threadStates(cmd.Process.Pid) {
				if s == 't' || s == 'T' {
					t.Errorf("thread %d left in state %c", tid, s)
				}
			}
		})
	}
}

func threadStates(pid int) map[int]byte {
	out := map[int]byte{}
	ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	for _, e := range ents {
		if tid, err := strconv.Atoi(e.Name()); err == nil {
			out[tid] = procfs.TaskState(pid, tid)
		}
	}
	return out
}

// TestRubySourceTargetExits: the sampler stops with Exited when the
// target ends, keeping what it sampled.
// TestHolderKernelState: a thread holding the GVL asleep in a C function
// (testdata/holdgvl.rb: usleep through Fiddle, keeping the lock) is off a
// CPU, its kernel state read (from /proc, or from its stop in blocking
// mode); the same thread spinning in Ruby code is on one, and no
// recording reads /proc for it.
func TestHolderKernelState(t *testing.T) { eachRuby(t, testHolderKernelState) }

func testHolderKernelState(t *testing.T, rb testutil.RubyUnderTest) {
	modes(t, func(t *testing.T, blocking bool) {
		for _, spin := range []bool{false, true} {
			var args []string
			if spin {
				args = []string{"spin"}
			}
			_, p := startTestdata(t, rb, "holdgvl.rb", args...)
			var opts RubyOptions
			if blocking {
				pz := target.NewThreadPauser()
				defer pz.Close()
				opts.Pauser = pz
			}
			src := NewRubySource(p, opts)
			type share struct{ onCPU, all int }
			byInner := map[string]*share{}
			st, err := Run(context.Background(), src, Config{Rate: 200, Duration: 1500 * time.Millisecond}, func(b []stack.Sample) {
				for _, s := range b {
					if s.ThreadName != "holder" || len(s.Frames) == 0 {
						continue
					}
					sh := byInner[s.Frames[0].Name]
					if sh == nil {
						sh = &share{}
						byInner[s.Frames[0].Name] = sh
					}
					sh.all++
					if s.OnCPU {
						sh.onCPU++
					}
				}
			})
			reads := src.states.reads
			src.Close()
			if err != nil || st.Ticks < 100 {
				t.Fatalf("spin=%v: %d ticks, %v", spin, st.Ticks, err)
			}
			summary := ""
			for n, sh := range byInner {
				summary += fmt.Sprintf(" %s %d/%d on CPU;", n, sh.onCPU, sh.all)
			}
			t.Logf("spin=%v: %d ticks, %d states read:%s", spin, st.Ticks, reads, summary)
			inRuby := byInner["Object#spin_in_ruby"]
			if inRuby == nil || inRuby.all < st.Ticks/10 || inRuby.onCPU < inRuby.all*95/100 {
				t.Errorf("spin=%v: spinning in Ruby should be on a CPU:%s", spin, summary)
			}
			// Nothing but Ruby code needs no kernel state; asleep in C,
			// a blocking sample takes it from the stop, /proc saying
			// "traced" then.
			if (spin || blocking) && reads != 0 {
				t.Errorf("read %d kernel states from /proc", reads)
			}
			if spin {
				continue
			}
			// Enough samples in C to tell (10): how many there are is the
			// load's, not rbscope's. Under a CPU hog on each core the
			// Ruby loop (3 M iterations) takes several times its CPU time
			// in wall time while usleep's 20 ms stay 20 ms, and C's share
			// of the ticks fell to 8.7 % in one CI run (25 of 286).
			inC := byInner["Fiddle::Function#call"]
			if inC == nil || inC.all < 10 || inC.onCPU > inC.all/5 {
				t.Errorf("asleep in usleep holding the GVL should be off a CPU:%s", summary)
			}
		}
	})
}

func TestRubySourceTargetExits(t *testing.T) { eachRuby(t, testRubySourceTargetExits) }

func testRubySourceTargetExits(t *testing.T, rb testutil.RubyUnderTest) {
	// The script exits 0.6 s after the test says go (a file appears), so
	// that opening the process (DWARF on some Rubies) is not timed.
	goFile := filepath.Join(t.TempDir(), "go")
	cmd := startRuby(t, rb, `
def work; x = 0; loop { x += 1 }; end
Thread.new { sleep 0.01 until File.exist?(ARGV[0]); sleep 0.6; exit! 0 }
puts "ready"; $stdout.flush
work`, goFile)
	p := openRuby(t, cmd.Process.Pid)
	src := NewRubySource(p, RubyOptions{})
	defer src.Close()
	if err := os.WriteFile(goFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// The exited process stays a zombie until the cleanup reaps it: it
	// has no memory left to read, which the source reports as an exit.
	n := 0
	st, err := Run(context.Background(), src, Config{Rate: 100, Duration: 10 * time.Second}, func(b []stack.Sample) { n += len(b) })
	if err != nil {
		t.Fatal(err)
	}
	if !st.Exited || n == 0 || st.End.Sub(st.Start) > 3*time.Second {
		t.Fatalf("exited %v after %v with %d samples (errors %s)", st.Exited, st.End.Sub(st.Start), n, st.ErrorSummary())
	}
}

// TestTreeSource: a Ruby script that forks a Ruby child and runs another
// Ruby with system (and a non-Ruby child): samples come from three pids,
// each with its own methods; the non-Ruby child is skipped.
func TestTreeSource(t *testing.T) { eachRuby(t, testTreeSource) }

func testTreeSource(t *testing.T, rb testutil.RubyUnderTest) {
	cmd := startRuby(t, rb, `
def forked_child; x = 0; loop { x += 1 }; end
def parent_work; x = 0; loop { x += 1 }; end
fork { forked_child }
Thread.new { system("sleep", "30") }
Thread.new { system(ARGV[0], "-e", "def system_child; x = 0; loop { x += 1 }; end; system_child") }
puts "ready"; $stdout.flush
parent_work
`, rb.Exe)
	p := openRuby(t, cmd.Process.Pid)
	src := NewTreeSource(cmd.Process.Pid, p, TreeOptions{OpenTimeout: 2 * time.Second})
	defer src.Close()
	names := map[int]map[string]bool{}
	st, err := Run(context.Background(), src, Config{Rate: 50, Duration: 4 * time.Second}, func(b []stack.Sample) {
		for _, s := range b {
			if names[s.Pid] == nil {
				names[s.Pid] = map[string]bool{}
			}
			for _, f := range s.Frames {
				names[s.Pid][f.Name] = true
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(names) != 3 {
		t.Fatalf("samples from %d pids (%v), want 3; errors %s %v", len(names), names, st.ErrorSummary(), st.LastError)
	}
	want := map[string]bool{}
	for pid, fs := range names {
		for _, m := range []string{"Object#parent_work", "Object#forked_child", "Object#system_child"} {
			if fs[m] {
				want[m] = true
				if m == "Object#parent_work" && pid != cmd.Process.Pid {
					t.Errorf("parent_work seen in pid %d", pid)
				}
			}
		}
	}
	if len(want) != 3 {
		t.Errorf("methods seen %v, want parent_work, forked_child and system_child", want)
	}
	skipped := src.Skipped()
	if len(skipped) != 1 {
		t.Errorf("skipped %v, want the sleep child", skipped)
	}
}

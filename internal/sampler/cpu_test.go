package sampler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rbscope/rbscope/internal/ruby"
	"github.com/rbscope/rbscope/internal/stack"
	"github.com/rbscope/rbscope/internal/target"
	"github.com/rbscope/rbscope/internal/testutil"
)

// pin runs thread tid on CPU cpu alone.
func pin(t *testing.T, tid, cpu int) {
	t.Helper()
	var set unix.CPUSet
	set.Set(cpu)
	if err := unix.SchedSetaffinity(tid, &set); err != nil {
		t.Fatalf("pin thread %d to CPU %d: %v", tid, cpu, err)
	}
}

// hog starts a shell looping without system calls on CPU cpu, killed when
// the test ends.
func hog(t *testing.T, cpu int) {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", "while :; do :; done")
	if err := cmd.Start(); err != nil {
		t.Fatalf("start a CPU hog: %v", err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	pin(t, cmd.Process.Pid, cpu)
}

// cpuRun is one Mode cpu run: every sample the source took, those Run
// kept, and when each tick was taken.
type cpuRun struct {
	all, kept []stack.Sample
	ticks     []time.Time
	late      []time.Duration // how long after its deadline each tick began
	st        Stats
	ps        pauses
}

// sampleCPU samples process pid in Mode cpu as record does, in blocking
// or nonblocking mode, until stop returns true (checked every 100 ms) or
// d passes.
func sampleCPU(t *testing.T, pid int, blocking bool, rate float64, d time.Duration, stop func() bool) cpuRun {
	t.Helper()
	p, err := ruby.Open(context.Background(), ruby.Spec{Pid: pid, Wait: 10 * time.Second})
	if err != nil {
		t.Fatalf("open Ruby process %d: %v", pid, err)
	}
	t.Cleanup(func() { p.Target().Close() })
	var opts RubyOptions
	tp := &timedPauser{}
	if blocking {
		pz := target.NewThreadPauser()
		t.Cleanup(func() { pz.Close() })
		tp.p = pz
		opts.Pauser = tp
	}
	src := NewRubySource(p, opts)
	defer src.Close()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	go func() {
		for ctx.Err() == nil {
			if stop() {
				cancel()
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	var r cpuRun
	// Every sample, before Run's filter: a source between Run and the
	// Ruby source, as record's gate is.
	all := SourceFunc(func(ctx context.Context) ([]stack.Sample, error) {
		now := time.Now()
		r.ticks = append(r.ticks, now)
		r.late = append(r.late, now.Sub(tickOf(ctx).deadline))
		out, err := src.Sample(ctx)
		r.all = append(r.all, out...)
		return out, err
	})
	r.st, err = Run(ctx, all, Config{Rate: rate, Mode: stack.ModeCPU}, func(b []stack.Sample) {
		r.kept = append(r.kept, b...)
	})
	if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("sample: %v", err)
	}
	if r.st.CPUError != nil {
		t.Fatalf("on-CPU states: %v", r.st.CPUError)
	}
	tp.mu.Lock()
	defer tp.mu.Unlock()
	r.ps = pauses(tp.spans)
	return r
}

// TestModeCPU: Mode cpu keeps a thread's samples in proportion to the
// CPU time it gets, not to the time it holds the GVL. The script's main
// thread shares one CPU with a CPU hog (another hog takes a second CPU),
// and goes round three methods: Ruby code, a
// clock_gettime(CLOCK_THREAD_CPUTIME_ID) loop, and sched_yield(2) with
// the GVL held, which hands the CPU to the hog at each call (see
// testdata/ruby/cpumode.rb). It measures itself, over a window, its wall
// and CPU time and each method's. In that window, with sampling error
// sigma = sqrt(p(1-p)/n) for a share p of n samples:
//
//   - the share of ticks at which rbscope found the thread on a CPU (kept
//     it, or could not read it: an off-CPU thread's sample is dropped
//     whatever its stack) is the share of its wall time it had a CPU,
//     within 2 points + 3 sigma plus, in blocking mode, the share of the
//     time rbscope held it stopped or was stopping it (its wall time runs
//     on while it is neither on a CPU nor waiting for one);
//   - each method's share of the kept samples is its share of the
//     thread's CPU time, within 2 points + 3 sigma. The script's own
//     wall-time shares, which a sampler counting GVL time would follow,
//     are logged beside them, and the yielding method's must exceed its
//     CPU share by 20 points or more (else the hog did not keep it off
//     the CPU, and the test would not tell the two apart).
func TestModeCPU(t *testing.T) {
	testutil.NeedRoot(t)
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		rb.SetProfilerEnv(t)
		modes(t, func(t *testing.T, blocking bool) {
			cpu := runtime.NumCPU() - 1
			hog(t, cpu)
			if cpu > 0 {
				hog(t, cpu-1)
			}
			out := filepath.Join(t.TempDir(), "cpumode.json")
			proc := rb.Start(t, "cpumode.rb", out, "8")
			pin(t, proc.Pid, cpu)
			r := sampleCPU(t, proc.Pid, blocking, 100, 60*time.Second, waitFile(out))
			b, err := os.ReadFile(out)
			if err != nil {
				t.Fatalf("the script wrote no result: %v", err)
			}
			var res struct {
				StartRealNs int64 `json:"start_real_ns"`
				StopRealNs  int64 `json:"stop_real_ns"`
				Wall        int64 `json:"wall_ns"`
				CPU         int64 `json:"cpu_ns"`
				Methods     map[string]struct {
					Wall int64 `json:"wall_ns"`
					CPU  int64 `json:"cpu_ns"`
				} `json:"methods"`
			}
			if err := json.Unmarshal(b, &res); err != nil {
				t.Fatal(err)
			}
			in := func(at time.Time) bool {
				ns := at.UnixNano()
				return ns >= res.StartRealNs && ns <= res.StopRealNs
			}
			ticks := 0
			var late []time.Duration
			for i, at := range r.ticks {
				if in(at) {
					ticks++
					late = append(late, r.late[i])
				}
			}
			sort.Slice(late, func(i, j int) bool { return late[i] < late[j] })
			main := func(s *stack.Sample) bool { return s.TID == proc.Pid && in(s.Time) }
			method := func(s *stack.Sample) string {
				for _, f := range s.Frames {
					if name, ok := strings.CutPrefix(f.Name, "Object#"); ok {
						if _, ok := res.Methods[name]; ok {
							return name
						}
					}
				}
				return "other"
			}
			read, kept := 0, 0
			wallBy, keptBy := map[string]int{}, map[string]int{}
			for i := range r.all {
				if s := &r.all[i]; main(s) {
					read++
					wallBy[method(s)]++
				}
			}
			for i := range r.kept {
				s := &r.kept[i]
				if !main(s) {
					continue
				}
				if !s.OnCPU || s.Activity == stack.ActivityGVLWait {
					t.Errorf("kept a sample off a CPU or waiting for the GVL: %+v", s)
				}
				kept++
				keptBy[method(s)]++
			}
			paused := r.ps.within(res.StartRealNs, res.StopRealNs)
			t.Logf("%d ticks in the window, the main thread read at %d, kept at %d; %d late, %d missed; paused %v",
				ticks, read, kept, r.st.Late, r.st.Missed, paused)
			if len(late) > 0 {
				t.Logf("ticks began after their deadline by: median %v, 90th percentile %v, most %v",
					late[len(late)/2], late[len(late)*9/10], late[len(late)-1])
			}
			if ticks < 300 || read < ticks*9/10 {
				t.Fatalf("%d ticks in the window, the main thread read at %d", ticks, read)
			}
			// A sample Mode cpu could not read is one of a thread on a
			// CPU at the deadline (an off-CPU thread's sample is dropped
			// whatever its stack): unread ticks count as on a CPU.
			wantCPU := 100 * float64(res.CPU) / float64(res.Wall)
			gotCPU := 100 * float64(kept+ticks-read) / float64(ticks)
			unread := 100 * float64(ticks-read) / float64(ticks)
			pausedPct := 100 * float64(paused) / float64(res.Wall)
			t.Logf("on a CPU at %.1f%% of ticks (%.1f%% unread); the thread had a CPU %.1f%% of its wall time (%v of %v, %.1f%% being stopped by rbscope)",
				gotCPU, unread, wantCPU, time.Duration(res.CPU), time.Duration(res.Wall), pausedPct)
			if bound := 2 + 3*sigma(wantCPU, ticks) + pausedPct; !(math.Abs(gotCPU-wantCPU) <= bound) {
				t.Errorf("on a CPU at %.1f%% of ticks, but the thread had a CPU %.1f%% of its time (bound %.1f points)", gotCPU, wantCPU, bound)
			}
			var names []string
			for name := range res.Methods {
				names = append(names, name)
			}
			sort.Strings(names)
			for _, name := range names {
				m := res.Methods[name]
				cpuShare := 100 * float64(m.CPU) / float64(res.CPU)
				wallShare := 100 * float64(m.Wall) / float64(res.Wall)
				got := 100 * float64(keptBy[name]) / float64(kept)
				t.Logf("%-9s kept %5.1f%% (%d), CPU time %5.1f%%; all samples %5.1f%%, wall time %5.1f%%",
					name, got, keptBy[name], cpuShare, 100*float64(wallBy[name])/float64(read), wallShare)
				if bound := 2 + 3*sigma(cpuShare, kept); !(math.Abs(got-cpuShare) <= bound) {
					t.Errorf("%s: %.1f%% of the kept samples, but %.1f%% of the CPU time (%.1f%% of the wall time; bound %.1f points)", name, got, cpuShare, wallShare, bound)
				}
				if name == "yield_gvl" && !(wallShare-cpuShare >= 20) {
					t.Errorf("yield_gvl had %.1f%% of the wall time and %.1f%% of the CPU time: the hogs did not keep it off the CPU, and the test cannot tell CPU from GVL time", wallShare, cpuShare)
				}
			}
		})
	})
}

// sigma is the standard deviation, in points, of a share pct% measured
// over n independent samples.
func sigma(pct float64, n int) float64 {
	p := pct / 100
	return 100 * math.Sqrt(p*(1-p)/float64(n))
}

// TestModeCPULateFirstTick: a blocking Mode cpu run whose first tick is
// late (taken after the next deadlines passed, as on a busy machine) never
// counts a sleeping thread on a CPU. names.rb's threads sleep for good in
// Kernel#sleep, Thread#join and Thread::Queue#pop beside two busy ones,
// with a CPU hog on each CPU. The first tick's pause stops every thread,
// which wakes the sleeping ones; the ticks that catch up at once after it
// had no context-switch records for their deadlines when the threads were
// watched only from the first tick's end, fell back on /proc, found the
// woken threads still waiting for a CPU to go back to sleep ('R') and
// counted each one on a CPU (TestTopModeAndThreads under load, once in
// 10-20 runs). RubyOptions.WatchCPU watches them from the source's
// creation.
func TestModeCPULateFirstTick(t *testing.T) {
	testutil.NeedRoot(t)
	for cpu := 0; cpu < runtime.NumCPU(); cpu++ {
		hog(t, cpu)
	}
	sleeping := []string{"Kernel#sleep", "Thread#join", "Thread::Queue#pop"}
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		rb.SetProfilerEnv(t)
		proc := rb.Start(t, "names.rb")
		p, err := ruby.Open(context.Background(), ruby.Spec{Pid: proc.Pid, Wait: 10 * time.Second})
		if err != nil {
			t.Fatalf("open Ruby process %d: %v", proc.Pid, err)
		}
		defer p.Target().Close()
		pz := target.NewThreadPauser()
		defer pz.Close()
		// At least minRuns runs, and more until the busy threads were found
		// on a CPU at minOn deadlines (the check's evidence that the
		// records were read). They hand the GVL to each other every
		// ~30 µs and wait for a CPU behind the hogs at each hand-off, and
		// are mostly on a CPU in Thread.pass without the GVL, which Mode
		// cpu drops: beside a load of the machine's own, few samples are
		// kept (2 of 1285 ticks beside a Ruby build; two such threads
		// alone, under `record --mode cpu`, were on a CPU at 165 of 500
		// deadlines, 143 of them in Thread.pass), and a fixed 12 runs
		// kept none once in a few tries under a second hog per CPU.
		const rate, minRuns, maxRuns, minOn = 100, 12, 60, 20
		on := map[string]int{}
		kept, ticks, runs, busyOn := 0, 0, 0, 0
		for ; runs < minRuns || (busyOn < minOn && runs < maxRuns); runs++ {
			src := NewRubySource(p, RubyOptions{Pauser: pz, WatchCPU: true})
			first := true
			late := SourceFunc(func(ctx context.Context) ([]stack.Sample, error) {
				if first {
					first = false
					time.Sleep(5 * time.Second / rate) // five deadlines pass
				}
				b, err := src.Sample(ctx)
				for _, s := range b {
					if s.OnCPU && len(s.Frames) > 0 && !slices.Contains(sleeping, s.Frames[0].Name) {
						busyOn++
					}
				}
				return b, err
			})
			st, err := Run(context.Background(), late, Config{Rate: rate, Duration: 150 * time.Millisecond, Mode: stack.ModeCPU},
				func(b []stack.Sample) {
					for _, s := range b {
						kept++
						if len(s.Frames) > 0 && slices.Contains(sleeping, s.Frames[0].Name) {
							on[fmt.Sprintf("%s (%s, tid %d)", s.Frames[0].Name, s.ThreadName, s.TID)]++
						}
					}
				})
			src.Close()
			if err != nil {
				t.Fatalf("sample: %v", err)
			}
			if st.CPUError != nil {
				t.Fatalf("on-CPU states: %v", st.CPUError)
			}
			ticks += int(st.Ticks)
		}
		t.Logf("%d runs, %d ticks: the busy threads on a CPU at %d deadlines, %d samples kept", runs, ticks, busyOn, kept)
		if busyOn == 0 {
			t.Fatalf("the busy threads were never found on a CPU")
		}
		if len(on) > 0 {
			t.Errorf("sleeping threads counted on a CPU: %v", on)
		}
	})
}

package oncpu

import (
	"math"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rbscope/rbscope/internal/procfs"
	"github.com/rbscope/rbscope/internal/testutil"
)

// spin starts a shell looping without system calls, pinned to CPU cpu
// (when cpu >= 0); it is killed when the test ends.
func spin(t *testing.T, cpu int) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", "while :; do :; done")
	if err := cmd.Start(); err != nil {
		t.Fatalf("start a spinning shell: %v", err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	if cpu >= 0 {
		var set unix.CPUSet
		set.Set(cpu)
		if err := unix.SchedSetaffinity(cmd.Process.Pid, &set); err != nil {
			t.Fatalf("pin process %d to CPU %d: %v", cmd.Process.Pid, cpu, err)
		}
	}
	return cmd
}

// stop stops process pid with SIGSTOP and waits until the kernel says it
// is stopped.
func stop(t *testing.T, pid int) {
	t.Helper()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		st := procfs.TaskState(pid, pid)
		if st == 'T' {
			return
		}
		if i > 1000 {
			t.Fatalf("process %d not stopped (state %c)", pid, st)
		}
		time.Sleep(time.Millisecond)
	}
}

// watch watches the one thread of process pid.
func watch(t *testing.T, pid int) *Threads {
	t.Helper()
	w := New(pid)
	t.Cleanup(func() { w.Close() })
	if err := w.Watch([]int{pid}); err != nil {
		if testutil.InCI() || unix.Geteuid() == 0 {
			t.Fatal(err)
		}
		testutil.Missing(t, "perf_event_open on another process (root, or perf_event_paranoid <= 2): %v", err)
	}
	return w
}

// TestAtFollowsCPUTime: a spinning shell pinned to one CPU beside another
// gets part of that CPU (whatever share the machine's load leaves it).
// Asked, after the fact, about instants every 250 µs of its life, the
// records say it was running at as large a share of them as the CPU time
// the kernel charged it (getrusage of the child, from the scheduler's
// sum_exec_runtime) is of its life's wall time, within 3 points. The
// instants are on a grid fixed in advance: instants at which the test's
// own thread runs would not do, since it often runs on that very CPU,
// keeping the spinner off it.
func TestAtFollowsCPUTime(t *testing.T) {
	spin(t, 0)
	start := time.Now()
	sp := spin(t, 0)
	pid := sp.Process.Pid
	w := watch(t, pid)
	var running, asked int
	states := map[State]int{}
	const step = 250 * time.Microsecond
	next := w.threads[pid].since
	end := next + int64(3*time.Second)
	for next < end {
		// The ring buffer holds the last 256 switches: a few hundred
		// milliseconds of a thread switched every few milliseconds.
		time.Sleep(50 * time.Millisecond)
		for now := Now(); next < min(now, end); next += int64(step) {
			s, _ := w.At(pid, next, math.MaxInt64)
			states[s]++
			asked++
			if s == Running {
				running++
			}
		}
	}
	sp.Process.Kill()
	ps, err := sp.Process.Wait()
	if err != nil {
		t.Fatal(err)
	}
	life := time.Since(start)
	ru := ps.SysUsage().(*syscall.Rusage)
	cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	want := 100 * float64(cpu) / float64(life)
	got := 100 * float64(running) / float64(asked)
	t.Logf("running at %.1f%% of %d instants, CPU time %.1f%% of its life (%v of %v); states %v", got, asked, want, cpu, life, states)
	if states[Unknown] > asked/100 {
		t.Fatalf("%d instants answered, %d unknown", asked, states[Unknown])
	}
	if !(math.Abs(got-want) <= 3) {
		t.Errorf("running at %.1f%% of instants, but its CPU time is %.1f%% of its life", got, want)
	}
}

// TestAtAsleepAndStopped: a process asleep in nanosleep is never running;
// one stopped by SIGSTOP is asleep from its stop on, and not switched in
// again until continued (then resumed while it spins, switched in once
// stopped again); an instant before the watch began is unknown.
func TestAtAsleepAndStopped(t *testing.T) {
	sl := exec.Command("sleep", "100")
	if err := sl.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sl.Process.Kill(); sl.Wait() })
	time.Sleep(50 * time.Millisecond)
	before := Now()
	w := watch(t, sl.Process.Pid)
	if s, _ := w.At(sl.Process.Pid, before, math.MaxInt64); s != Unknown {
		t.Errorf("state before the watch began: %v, want unknown", s)
	}
	for i := 0; i < 20; i++ {
		time.Sleep(time.Millisecond)
		if s, _ := w.At(sl.Process.Pid, Now(), math.MaxInt64); s == Running || s == Unknown {
			t.Fatalf("sleeping process: %v", s)
		}
	}

	sp := spin(t, -1)
	pid := sp.Process.Pid
	if err := w.Watch([]int{pid}); err != nil {
		t.Fatal(err)
	}
	if w.Watched() != 1 {
		t.Errorf("watching %d threads after watching only the spinner, want 1", w.Watched())
	}
	time.Sleep(20 * time.Millisecond)
	spinning := Now()
	stop(t, pid)
	stopped := Now()
	time.Sleep(10 * time.Millisecond)
	for _, at := range []int64{stopped, Now()} {
		if s, since := w.At(pid, at, math.MaxInt64); s != Asleep || since != Stayed {
			t.Errorf("stopped process at %d: %v (since: %v), want asleep, stayed", at, s, since)
		}
	}
	// Spinning before the stop, which switched it out not preempted: it
	// went to sleep since (its stack is where it stopped), unless it was
	// preempted and switched in again before (a loaded machine), never
	// stayed.
	if s, since := w.At(pid, spinning, stopped); since == Stayed {
		t.Errorf("spinning process before its stop: %v (since: %v), want slept (or switched in) since", s, since)
	} else {
		t.Logf("spinning process before its stop: %v, since: %v", s, since)
	}
	// Continued, it is switched in again after the stop, and spins on
	// (on a CPU or preempted): resumed.
	continued := Now()
	sp.Process.Signal(syscall.SIGCONT)
	time.Sleep(20 * time.Millisecond)
	if s, since := w.At(pid, stopped, math.MaxInt64); s != Asleep || since != Resumed {
		t.Errorf("continued process at its stop: %v (since: %v), want asleep and resumed since", s, since)
	}
	if _, since := w.At(pid, stopped, continued); since != Stayed {
		t.Errorf("since its stop and before SIGCONT: %v, want stayed", since)
	}
	if _, since := w.At(pid, spinning, math.MaxInt64); since != Resumed {
		t.Errorf("spinning process since before its stop, continued: %v, want resumed", since)
	}
	// Stopped again: switched in since its first stop, and asleep now.
	running := Now()
	stop(t, pid)
	time.Sleep(5 * time.Millisecond)
	if _, since := w.At(pid, stopped, math.MaxInt64); since != SwitchedIn {
		t.Errorf("continued and stopped again since its first stop: %v, want switched in", since)
	}
	if _, since := w.At(pid, stopped, running); since != Resumed {
		t.Errorf("continued since its first stop, until it ran again: %v, want resumed", since)
	}
}

// TestQuietThreadReadOnce: a thread asleep since before the watch began
// has no switch record; it is asleep (as /proc said when the watch began)
// while its task clock says it has not run, and that clock is read once,
// not at every query (a system call per idle thread per tick); once it
// switches (stopped by SIGSTOP), the records answer again.
func TestQuietThreadReadOnce(t *testing.T) {
	sl := exec.Command("sleep", "100")
	if err := sl.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sl.Process.Kill(); sl.Wait() })
	pid := sl.Process.Pid
	time.Sleep(50 * time.Millisecond)
	w := watch(t, pid)
	th := w.threads[pid]
	reads := th.clockReads // the one at the start of the watch
	for i := 0; i < 20; i++ {
		time.Sleep(time.Millisecond)
		if s, since := w.At(pid, Now(), math.MaxInt64); s != Asleep || since != Stayed {
			t.Fatalf("query %d: %v (since: %v), want asleep (as /proc said when the watch began) and stayed", i, s, since)
		}
	}
	if n := th.clockReads - reads; n != 1 {
		t.Errorf("%d task clock reads for 20 queries of a thread that never switched, want 1", n)
	}
	stop(t, pid)
	time.Sleep(5 * time.Millisecond)
	if s, _ := w.At(pid, Now(), math.MaxInt64); s != Asleep {
		t.Errorf("stopped process: %v, want asleep (from its records)", s)
	}
}

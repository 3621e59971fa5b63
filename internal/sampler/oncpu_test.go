package sampler

import (
	"context"
	"errors"
	"math"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rbscope/rbscope/internal/procfs"
	"github.com/rbscope/rbscope/internal/ruby"
	"github.com/rbscope/rbscope/internal/stack"
	"github.com/rbscope/rbscope/internal/testutil"
)

// TestOnCPU: RubySource.OnCPU says whether a thread the last tick read is
// on a CPU now. A spinning Ruby shares CPU 1 with a CPU hog, so it runs
// about half the time and waits for the CPU (runnable, which /proc calls
// 'R' too) the other half; the sampling thread is alone on CPU 0. The
// share of ticks at which OnCPU is true must be the spinner's share of
// the window on a CPU by its scheduler statistics (schedstat), within
// 3 sigma and 3 points; a sleeping Ruby is never on a CPU.
func TestOnCPU(t *testing.T) {
	testutil.NeedRoot(t)
	if runtime.NumCPU() < 2 {
		testutil.Missing(t, "2 CPUs (this machine has %d)", runtime.NumCPU())
	}
	rb := testutil.SystemRuby(t)
	spin := rb.StartSource(t, "spin.rb", "$stdout.puts 'ready'\n$stdout.flush\nloop { }\n")
	sleeper := rb.StartSource(t, "sleep.rb", "$stdout.puts 'ready'\n$stdout.flush\nsleep\n")
	pin(t, spin.Pid, 1)
	hog(t, 1)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var was unix.CPUSet
	if err := unix.SchedGetaffinity(0, &was); err != nil {
		t.Fatal(err)
	}
	defer unix.SchedSetaffinity(0, &was)
	pin(t, 0, 0) // this thread, which Run samples on

	type count struct{ ticks, onCPU int }
	sample := func(pid int, d time.Duration, window func()) count {
		p, err := ruby.Open(context.Background(), ruby.Spec{Pid: pid, Wait: 10 * time.Second})
		if err != nil {
			t.Fatalf("open Ruby process %d: %v", pid, err)
		}
		defer p.Target().Close()
		src := NewRubySource(p, RubyOptions{})
		defer src.Close()
		var c count
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		first := true
		_, err = Run(ctx, SourceFunc(func(ctx context.Context) ([]stack.Sample, error) {
			out, err := src.Sample(ctx)
			if first {
				// The first tick starts the watch of the threads.
				first = false
				window()
				return out, err
			}
			c.ticks++
			if src.OnCPU() {
				c.onCPU++
			}
			return out, err
		}), Config{Rate: 100, Mode: stack.ModeCPU}, nil)
		if err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
			t.Fatalf("sample: %v", err)
		}
		window()
		return c
	}

	var marks []time.Time
	var runs []uint64
	c := sample(spin.Pid, 3*time.Second, func() {
		ss, err := procfs.ReadTaskSchedstat(spin.Pid, spin.Pid)
		if err != nil {
			t.Fatal(err)
		}
		marks, runs = append(marks, time.Now()), append(runs, ss.RunNs)
	})
	ran := float64(runs[1]-runs[0]) / float64(marks[1].Sub(marks[0]).Nanoseconds())
	got := float64(c.onCPU) / float64(c.ticks)
	bound := 3*math.Sqrt(ran*(1-ran)/float64(c.ticks)) + 0.03
	t.Logf("spinner: on a CPU at %d of %d ticks (%.1f%%); by schedstat on a CPU %.1f%% of the window (bound %.1f points)",
		c.onCPU, c.ticks, 100*got, 100*ran, 100*bound)
	if ran < 0.2 || ran > 0.8 {
		t.Errorf("the spinner was on a CPU %.1f%% of the window: the hog did not share its CPU", 100*ran)
	}
	if math.Abs(got-ran) > bound {
		t.Errorf("OnCPU was true at %.1f%% of the ticks, the spinner ran %.1f%% of the window (bound %.1f points)", 100*got, 100*ran, 100*bound)
	}
	s := sample(sleeper.Pid, time.Second, func() {})
	if s.ticks < 50 || s.onCPU != 0 {
		t.Errorf("sleeping Ruby: on a CPU at %d of %d ticks, want 0 of 50 or more", s.onCPU, s.ticks)
	}
}

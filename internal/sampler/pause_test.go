package sampler

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/ruby"
	"github.com/rbscope/rbscope/internal/stack"
	"github.com/rbscope/rbscope/internal/target"
	"github.com/rbscope/rbscope/internal/testutil"
)

// countingPauser records how many threads each pause stopped.
type countingPauser struct {
	p             *target.Pauser
	all, some     int
	maxSome       int
	pausedThreads int
	// misses are the source's pauses of a GVL holder that no longer
	// held it, by reason (RubySource.holderMisses).
	misses map[string]int
}

func (c *countingPauser) Pause(pid int) (func() error, error) {
	c.all++
	return c.p.Pause(pid)
}

func (c *countingPauser) PauseThreads(pid int, tids []int) (func() error, error) {
	c.some++
	c.pausedThreads += len(tids)
	c.maxSome = max(c.maxSome, len(tids))
	return c.p.PauseThreads(pid, tids)
}

// InterruptedSleep reads a stopped thread's state as record's pauser does.
func (c *countingPauser) InterruptedSleep(tid int) (bool, error) { return c.p.InterruptedSleep(tid) }

// sampleCounted samples p for a second at 200 Hz in blocking mode,
// counting the pauses, and gives f every sample.
func sampleCounted(t *testing.T, p *ruby.Process, f func(stack.Sample)) (Stats, *countingPauser) {
	t.Helper()
	pz := &countingPauser{p: target.NewThreadPauser()}
	defer pz.p.Close()
	src := NewRubySource(p, RubyOptions{Pauser: pz})
	defer src.Close()
	st, err := Run(context.Background(), src, Config{Rate: 200, Duration: time.Second}, func(ss []stack.Sample) {
		for _, s := range ss {
			f(s)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	pz.misses = src.holderMisses
	return st, pz
}

// TestPauseOnlyRubyThreads samples, in blocking mode, a process with 100
// native threads that never run Ruby beside its three Ruby threads, one
// of them busy (it holds the GVL all the time) and two asleep: after the
// first sample, which stops every thread, each pause stops only the GVL's
// holder, and the samples are still whole.
func TestPauseOnlyRubyThreads(t *testing.T) {
	testutil.NeedRoot(t)
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		proc, p := startTestdata(t, rb, "natives.rb")
		tasks, err := os.ReadDir("/proc/" + strconv.Itoa(proc.Pid) + "/task")
		if err != nil || len(tasks) < 100 {
			t.Fatalf("target has %d threads (%v), want over 100", len(tasks), err)
		}
		seen := map[string]int{}
		st, pz := sampleCounted(t, p, func(s stack.Sample) {
			seen[s.ThreadName]++
			checkBusyIdle(t, s)
		})
		t.Logf("%s: %d tasks; %d ticks; %d pauses of every thread, %d of only %d Ruby threads at most (%.1f per pause); errors: %s",
			rb.Name, len(tasks), st.Ticks, pz.all, pz.some, pz.maxSome, float64(pz.pausedThreads)/float64(max(pz.some, 1)), st.ErrorSummary())
		if st.Ticks < 20 || seen["busy"] != st.Ticks || seen["idle"] != st.Ticks {
			t.Fatalf("ticks %d, samples per thread %v, errors %s", st.Ticks, seen, st.ErrorSummary())
		}
		// The busy thread holds the GVL nearly all the time, but not
		// always: Ruby 3.1's gvl_yield (at the timer's interrupts) lets it
		// go around a sched_yield even with no thread waiting, and on 3.4
		// another thread had it at times (which one is not known). A tick
		// whose stopped thread does not hold the GVL pauses once more: the
		// new holder alone when another thread holds it, every Ruby thread
		// (three) when none does. CI saw 2 of 200 ticks of the first kind
		// (3.4.5-stripped) and 1 of the second (Debian's Ruby). Such ticks
		// must stay rare.
		moved, none := pz.misses["another thread holds the GVL"], pz.misses["no thread holds the GVL"]
		extra := 0
		for _, n := range pz.misses {
			extra += n
		}
		wide := pz.pausedThreads - pz.some // threads stopped beyond one per pause
		if pz.all != 1 || pz.some != st.Ticks-1+extra || extra > st.Ticks/20 ||
			(pz.maxSome != 1 && (none == 0 || pz.maxSome > 3)) || wide > 2*none {
			t.Errorf("pauses: %d of every thread, %d of Ruby threads (at most %d, %d threads in all), for %d ticks; want 1, %d (one a tick but the first, and one more for each of the %d ticks the GVL had moved on and the %d no thread held it), of one thread but at the ticks no thread held the GVL; holder's pauses that missed: %v",
				pz.all, pz.some, pz.maxSome, pz.pausedThreads, st.Ticks, st.Ticks-1+extra, moved, none, pz.misses)
		}
	})
}

// TestPauseRactors samples, in blocking mode, a process of two ractors
// that both run Ruby at once (a GVL each): stopping the holder of one
// lock does not freeze the other, so every pause must stop both threads,
// and the stacks must be whole.
func TestPauseRactors(t *testing.T) {
	testutil.NeedRoot(t)
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		_, p := startTestdata(t, rb, "ractors.rb")
		seen := map[string]int{}
		st, pz := sampleCounted(t, p, func(s stack.Sample) {
			names := frameNames(s.Frames)
			switch {
			case strings.Contains(names, "Object#main_spin"):
				seen["main"]++
			case strings.Contains(names, "Object#ractor_spin"):
				seen["ractor"]++
			default:
				t.Errorf("thread %d (%s): stack %q is neither spinner's", s.TID, s.ThreadName, names)
			}
		})
		t.Logf("%s: %d ticks; %d pauses of every thread, %d of %.2f threads on average; samples %v; errors: %s",
			rb.Name, st.Ticks, pz.all, pz.some, float64(pz.pausedThreads)/float64(max(pz.some, 1)), seen, st.ErrorSummary())
		if st.Ticks < 20 || seen["main"] != st.Ticks || seen["ractor"] != st.Ticks {
			t.Fatalf("ticks %d, samples %v, errors %s", st.Ticks, seen, st.ErrorSummary())
		}
		if pz.some < st.Ticks-1 || pz.pausedThreads != 2*pz.some {
			t.Errorf("%d pauses of %d threads in %d ticks: want every pause to stop both ractors' threads", pz.some, pz.pausedThreads, st.Ticks)
		}
	})
}

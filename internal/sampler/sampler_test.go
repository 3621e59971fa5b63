package sampler

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/ruby"
	"github.com/rbscope/rbscope/internal/stack"
	"github.com/rbscope/rbscope/internal/target"
)

// fakeClock is virtual time: sleeping jumps to the deadline (plus an
// optional overshoot), sources advance it by their cost. It makes the
// schedule tests exact whatever the machine's load.
type fakeClock struct {
	t         time.Time
	sleeps    int
	overshoot func(n int) time.Duration // extra delay of the n-th sleep
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)} }

func (c *fakeClock) Now() time.Time                  { return c.t }
func (c *fakeClock) advance(d time.Duration)         { c.t = c.t.Add(d) }
func (c *fakeClock) since(t time.Time) time.Duration { return c.t.Sub(t) }

func (c *fakeClock) SleepUntil(ctx context.Context, deadline time.Time) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c.sleeps++
	if deadline.After(c.t) {
		c.t = deadline
	}
	if c.overshoot != nil {
		c.t = c.t.Add(c.overshoot(c.sleeps))
	}
	return nil
}

// TestScheduleExact: 1000 ticks at 1 kHz with a 0.1 ms source and 60 µs
// of wake-up latency: every tick runs at its absolute slot plus the
// latency, so nothing accumulates (a sampler sleeping one period after
// each sample would be 160 ms behind by the end).
func TestScheduleExact(t *testing.T) {
	clk := newFakeClock()
	clk.overshoot = func(int) time.Duration { return 60 * time.Microsecond }
	var calls []time.Time
	src := SourceFunc(func(ctx context.Context) ([]stack.Sample, error) {
		calls = append(calls, clk.Now())
		clk.advance(100 * time.Microsecond)
		return []stack.Sample{{Pid: 1, TID: 1, Time: clk.Now()}}, nil
	})
	st, err := run(context.Background(), src, Config{Rate: 1000, Duration: time.Second}, nil, clk, 0)
	if err != nil {
		t.Fatal(err)
	}
	if st.Ticks != 1000 || st.Missed != 0 || st.Late != 0 {
		t.Fatalf("ticks %d missed %d late %d, want 1000 0 0", st.Ticks, st.Missed, st.Late)
	}
	for i, c := range calls {
		want := st.Start.Add(time.Duration(i)*time.Millisecond + 60*time.Microsecond)
		if !c.Equal(want) {
			t.Fatalf("tick %d at %v, want %v", i, c.Sub(st.Start), want.Sub(st.Start))
		}
	}
	if st.Samples != 1000 || len(st.Threads) != 1 || st.Threads[0].Samples != 1000 {
		t.Errorf("samples %d, threads %+v", st.Samples, st.Threads)
	}
}

// TestJitterStaysAnchored: jittered ticks stay within half a period of
// their slot and the count is exact.
func TestJitterStaysAnchored(t *testing.T) {
	clk := newFakeClock()
	var calls []time.Time
	src := SourceFunc(func(ctx context.Context) ([]stack.Sample, error) {
		calls = append(calls, clk.Now())
		return nil, nil
	})
	st, err := run(context.Background(), src, Config{Rate: 500, Duration: time.Second}, nil, clk, spread)
	if err != nil {
		t.Fatal(err)
	}
	if st.Ticks != 500 || st.Missed != 0 {
		t.Fatalf("ticks %d missed %d", st.Ticks, st.Missed)
	}
	moved := 0
	for i, c := range calls {
		off := c.Sub(st.Start.Add(time.Duration(i) * 2 * time.Millisecond))
		if off < -time.Millisecond || off > time.Millisecond {
			t.Fatalf("tick %d is %v from its slot", i, off)
		}
		if off != 0 {
			moved++
		}
	}
	if moved < 250 {
		t.Errorf("only %d of 500 ticks jittered", moved)
	}
}

// TestSlowSourceSkipsTicks: a source that takes 2.5 periods makes the
// sampler skip the slots it cannot take in time, and count them; no tick
// starts more than a period after its slot.
func TestSlowSourceSkipsTicks(t *testing.T) {
	clk := newFakeClock()
	src := SourceFunc(func(ctx context.Context) ([]stack.Sample, error) {
		clk.advance(25 * time.Millisecond)
		return nil, nil
	})
	st, err := run(context.Background(), src, Config{Rate: 100, Duration: time.Second}, nil, clk, 0)
	if err != nil {
		t.Fatal(err)
	}
	if st.Ticks+st.Missed != 100 {
		t.Errorf("ticks %d + missed %d, want 100", st.Ticks, st.Missed)
	}
	if st.Ticks < 38 || st.Ticks > 42 || st.Late != 0 {
		t.Errorf("ticks %d late %d, want about 40 (1 s / 25 ms) and 0", st.Ticks, st.Late)
	}
	if f := st.LateFraction(); f < 0.55 || f > 0.62 {
		t.Errorf("late fraction %.2f, want 0.6", f)
	}
}

// TestLateCounted: a wake-up 12 ms late at 200 Hz (5 ms) is a late tick,
// and the slot after it is skipped.
func TestLateCounted(t *testing.T) {
	clk := newFakeClock()
	stalls := 0
	clk.overshoot = func(n int) time.Duration {
		if n%10 == 0 {
			stalls++
			return 12 * time.Millisecond
		}
		return 0
	}
	src := SourceFunc(func(ctx context.Context) ([]stack.Sample, error) { return nil, nil })
	st, err := run(context.Background(), src, Config{Rate: 200, Duration: time.Second}, nil, clk, 0)
	if err != nil {
		t.Fatal(err)
	}
	if stalls < 15 || st.Late != stalls || st.Missed != stalls || st.Ticks+st.Missed != 200 {
		t.Errorf("stalls %d: late %d missed %d ticks %d", stalls, st.Late, st.Missed, st.Ticks)
	}
}

// TestProgress: the progress callback runs about every ProgressEvery with
// the counts so far.
func TestProgress(t *testing.T) {
	clk := newFakeClock()
	src := SourceFunc(func(ctx context.Context) ([]stack.Sample, error) {
		return []stack.Sample{{Pid: 1, TID: 1}}, nil
	})
	var seen []int
	_, err := run(context.Background(), src, Config{Rate: 100, Duration: time.Second, ProgressEvery: 250 * time.Millisecond,
		Progress: func(st Stats) { seen = append(seen, st.Samples) }}, nil, clk, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) != 3 || seen[0] != 26 || seen[2] != 76 {
		t.Errorf("progress calls saw %v samples, want [26 51 76]", seen)
	}
}

// TestRealClock: with the real clock, 1000 slots at 1 kHz are all
// accounted for (taken or missed), none runs earlier than half a period
// before its slot (deadlines are spread over their period, see spread),
// and the run lasts until its last slot. (How many are missed depends on the
// machine's load.)
func TestRealClock(t *testing.T) {
	var times []time.Time
	src := SourceFunc(func(ctx context.Context) ([]stack.Sample, error) {
		times = append(times, time.Now())
		return nil, nil
	})
	st, err := Run(context.Background(), src, Config{Rate: 1000, Duration: time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if st.Ticks+st.Missed != 1000 || st.Ticks == 0 {
		t.Fatalf("ticks %d + missed %d, want 1000", st.Ticks, st.Missed)
	}
	// The last slot is at 999 ms, and its tick may come half a period
	// earlier.
	if d := st.End.Sub(st.Start); d < 998500*time.Microsecond {
		t.Errorf("run took %v, less than its last slot allows", d)
	}
	for i, tm := range times {
		if tm.Before(st.Start.Add(time.Duration(i)*time.Millisecond - time.Millisecond/2)) {
			t.Fatalf("call %d ran more than half a period before its slot", i)
		}
	}
	t.Logf("%d ticks, %d missed, %d late", st.Ticks, st.Missed, st.Late)
}

func TestErrorKinds(t *testing.T) {
	errs := []error{
		target.UnmappedError{Addr: 0x10, Len: 8},
		fmt.Errorf("read frame: %w", target.UnmappedError{Addr: 0x20, Len: 8}),
		target.DeniedError{Pid: 7, Op: "read memory of", Err: errors.New("EPERM")},
		errors.New("bad iseq"),
		inconsistent{},
		fmt.Errorf("process 7: %w", &ThreadErrors{Pid: 7, Threads: []ThreadError{{TID: 9, Err: "frame moved"}}}),
		&ThreadErrors{Pid: 7, Threads: []ThreadError{{TID: 9, Err: errMovedOn}}},
		&ThreadErrors{Pid: 7, Threads: []ThreadError{{TID: 9, Err: errMovedOn}, {TID: 10, Err: "frame moved"}}},
		nil,
		fmt.Errorf("walk: %w", target.ExitedError{Pid: 7}),
		nil, // never reached: sampling stops on exit
	}
	var i atomic.Int32
	src := SourceFunc(func(ctx context.Context) ([]stack.Sample, error) {
		k := int(i.Add(1)) - 1
		if errs[k] != nil {
			return nil, errs[k]
		}
		return []stack.Sample{{Pid: 7, TID: 8, OnCPU: true}}, nil
	})
	st, err := Run(context.Background(), src, Config{Rate: 1000}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := [numErrorKinds]int{KindUnmapped: 5, KindPermission: 1, KindOther: 1, KindMovedOn: 1}
	if st.Errors != want {
		t.Errorf("errors %v, want %v", st.Errors, want)
	}
	if !st.Exited || st.Ticks != 10 || st.Samples != 1 {
		t.Errorf("exited %v ticks %d samples %d, want true 10 1", st.Exited, st.Ticks, st.Samples)
	}
	if got := st.ErrorSummary(); got != "5 unmapped/inconsistent, 1 permission, 1 other, 1 moved on since a late deadline" {
		t.Errorf("summary %q", got)
	}
}

type inconsistent struct{}

func (inconsistent) Error() string        { return "frame changed during read" }
func (inconsistent) Is(target error) bool { return target == ruby.ErrInconsistent }

// TestThreadsOverTime: threads appear and disappear between samples; each
// one's first and last sample times are kept, and OnCPUOnly filters.
func TestThreadsOverTime(t *testing.T) {
	var tick int
	clk := newFakeClock() // exact tick counts whatever the machine's load
	src := SourceFunc(func(ctx context.Context) ([]stack.Sample, error) {
		tick++
		clk.advance(50 * time.Microsecond)
		now := clk.Now()
		out := []stack.Sample{{Pid: 1, TID: 1, ThreadName: "main", OnCPU: true, Time: now}}
		if tick >= 10 && tick < 20 {
			out = append(out, stack.Sample{Pid: 1, TID: 2, ThreadName: "worker", OnCPU: tick%2 == 0, Time: now})
		}
		if tick >= 15 {
			out = append(out, stack.Sample{Pid: 3, TID: 2, ThreadName: "child", OnCPU: true, Time: now})
		}
		return out, nil
	})
	var got int
	st, err := run(context.Background(), src, Config{Rate: 1000, Duration: 30 * time.Millisecond, OnCPUOnly: true},
		func(b []stack.Sample) {
			for _, s := range b {
				if !s.OnCPU {
					t.Errorf("off-CPU sample passed the filter: %+v", s)
				}
			}
			got += len(b)
		}, clk, 0)
	if err != nil {
		t.Fatal(err)
	}
	if st.Ticks != 30 || st.Missed != 0 {
		t.Fatalf("%d ticks (%d missed) in 30 virtual ms, want 30", st.Ticks, st.Missed)
	}
	if st.Filtered != 5 || got != st.Samples || st.Samples != 30+5+16 {
		t.Errorf("filtered %d samples %d sink %d, want 5, 51, 51", st.Filtered, st.Samples, got)
	}
	if len(st.Threads) != 3 {
		t.Fatalf("threads %+v", st.Threads)
	}
	w := st.Threads[1]
	if w.TID != 2 || w.Pid != 1 || w.Name != "worker" || w.Samples != 5 || !w.Last.After(w.First) {
		t.Errorf("worker span %+v", w)
	}
	if c := st.Threads[2]; c.Pid != 3 || c.Samples != 16 {
		t.Errorf("child span %+v", c)
	}
}

func TestCancelStops(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	s := Start(ctx, SourceFunc(func(ctx context.Context) ([]stack.Sample, error) {
		return []stack.Sample{{Pid: 1, TID: 1}}, nil
	}), Config{Rate: 100})
	n := 0
	timer := time.AfterFunc(200*time.Millisecond, cancel)
	defer timer.Stop()
	t0 := time.Now()
	for b := range s.Samples() {
		n += len(b.Samples)
	}
	st, _ := s.Wait()
	if d := time.Since(t0); d > time.Second {
		t.Errorf("stopping took %v", d)
	}
	if n != st.Samples || n < 15 || n > 22 {
		t.Errorf("received %d samples, stats say %d, want about 20", n, st.Samples)
	}
}

func TestBadConfig(t *testing.T) {
	src := SourceFunc(func(ctx context.Context) ([]stack.Sample, error) { return nil, nil })
	for _, c := range []Config{{Rate: -1}, {Rate: MaxRate + 1}} {
		if _, err := Run(context.Background(), src, c, nil); err == nil {
			t.Errorf("config %+v accepted", c)
		}
	}
}

package agent

import (
	"context"
	"slices"
	"time"

	"github.com/rbscope/rbscope/internal/procfs"
	"github.com/rbscope/rbscope/internal/sampler"
	"github.com/rbscope/rbscope/internal/stack"
	"github.com/rbscope/rbscope/internal/upload"
)

// event is a change discovery tells the clock: a target to add, or the
// process (pid, ident) to drop.
type event struct {
	add   *proc
	pid   int
	ident procfs.Identity
}

// proc is one profiled process, owned by the clock.
type proc struct {
	pid     int
	ident   procfs.Identity
	src     *sampler.RubySource
	service string
	labels  map[string]string
	// cpu and wall are the current interval's profiles (nil until the
	// first sample of the interval).
	cpu, wall *upload.Builder
	// onCPU: a thread of it was on a CPU as this tick began (see order).
	onCPU bool
}

// close releases the process's files.
func (t *proc) close() {
	t.src.Close()
	_ = t.src.Process().Target().Close()
}

// flush is one target's finished interval, for the flusher.
type flush struct {
	service     string
	labels      map[string]string
	from, until time.Time
	cpu, wall   *upload.Builder
}

// clock is the sampler.Source that samples every target on each tick.
// Only the sampler's goroutine uses it (and Run, once that has returned).
type clock struct {
	a          *Agent
	targets    []*proc
	start, end time.Time // the current interval
}

func newClock(a *Agent) *clock {
	c := &clock{a: a}
	now := time.Now()
	c.start = now.Truncate(a.cfg.Interval)
	c.end = c.start.Add(a.cfg.Interval)
	return c
}

// Sample samples every target once, nonblocking, feeding each one's
// samples to its profiles. It returns no samples and no error: targets
// are accounted for here (an exited one is dropped, not the end of
// sampling).
func (c *clock) Sample(ctx context.Context) ([]stack.Sample, error) {
	t0 := time.Now()
	c.drainEvents()
	if !t0.Before(c.end) {
		c.rotate(t0)
	}
	st := &c.a.stats
	st.ticks.Add(1)
	c.order()
	n := 0
	for i := 0; i < len(c.targets); {
		t := c.targets[i]
		samples, err := t.src.Sample(ctx)
		for j := range samples {
			s := &samples[j]
			if len(s.Frames) == 0 {
				continue
			}
			c.add(t, s)
			n++
		}
		if err != nil {
			k := sampler.Classify(err)
			if k == sampler.KindExited {
				st.exited.Add(1)
				c.drop(i, "process exited")
				continue
			}
			if c.execd(t) {
				// Its memory is another program's now: reads fail until
				// discovery's next scan, which looks at it anew.
				st.reexecs.Add(1)
				c.drop(i, "process exec'd: looking at it anew")
				continue
			}
			st.errors[k].Add(1)
		}
		i++
	}
	st.samples.Add(int64(n))
	st.targetTicks.Add(int64(len(c.targets)))
	st.tickNanos.Add(int64(time.Since(t0)))
	return nil, nil
}

// order puts the targets with a thread on a CPU now first. The targets
// are read one after another, and while the clock reads the others such a
// thread goes on running; threads off a CPU do not move while they wait,
// and read later their stacks are still the deadline's. A thread running
// at the deadline and preempted before its read is read where it was
// preempted, and under EEVDF a slice runs out mostly at a system call that
// updates the thread's run time (a CPU clock read): in a CI run the target
// read last of six spinning scripts on two CPUs (some 0.3 ms after the
// deadline) had 25 of its 250 cpu samples in Process.clock_gettime, and
// its profile leaned 10 points towards the longer of the two methods
// around those reads. On a quiet machine (5 runs of TestAgentPyroscope
// each way) the order made no difference: the reads are prompt there.
func (c *clock) order() {
	if len(c.targets) < 2 {
		return
	}
	for _, t := range c.targets {
		t.onCPU = t.src.OnCPU()
	}
	slices.SortStableFunc(c.targets, func(a, b *proc) int {
		switch {
		case a.onCPU == b.onCPU:
			return 0
		case a.onCPU:
			return -1
		}
		return 1
	})
}

// add puts one sample into t's profiles: wall always, cpu when the thread
// was on a CPU running Ruby, C or GC (stack.ModeCPU).
func (c *clock) add(t *proc, s *stack.Sample) {
	if t.wall == nil {
		var err error
		if t.wall, err = upload.NewBuilder(upload.KindWall, c.a.rate, c.start); err != nil {
			c.a.stats.profileErrs.Add(1)
			return
		}
		if t.cpu, err = upload.NewBuilder(upload.KindCPU, c.a.rate, c.start); err != nil {
			c.a.stats.profileErrs.Add(1)
			t.wall = nil
			return
		}
	}
	t.wall.Add(*s)
	if stack.ModeCPU.Keeps(s) {
		t.cpu.Add(*s)
	}
}

// drainEvents takes discovery's changes.
func (c *clock) drainEvents() {
	for {
		select {
		case ev := <-c.a.events:
			if ev.add != nil {
				c.targets = append(c.targets, ev.add)
				c.a.publish(ev.add.pid, true)
				c.a.startAlloc(ev.add)
				c.a.stats.tracked.Store(int64(len(c.targets)))
				continue
			}
			for i, t := range c.targets {
				if t.pid == ev.pid && t.ident == ev.ident {
					c.remove(i)
					break
				}
			}
		default:
			return
		}
	}
}

// rotate ends the interval: every target's profiles go to the flusher.
func (c *clock) rotate(now time.Time) {
	for _, t := range c.targets {
		c.hand(t, c.end)
	}
	c.start = now.Truncate(c.a.cfg.Interval)
	c.end = c.start.Add(c.a.cfg.Interval)
}

// hand gives t's profiles of the current interval, up to until, to the
// flusher.
func (c *clock) hand(t *proc, until time.Time) {
	if t.wall == nil {
		return
	}
	c.a.flushMu.Lock()
	c.a.flushes = append(c.a.flushes, flush{service: t.service, labels: t.labels, from: c.start, until: until, cpu: t.cpu, wall: t.wall})
	c.a.flushMu.Unlock()
	select {
	case c.a.flushWake <- struct{}{}:
	default:
	}
	t.cpu, t.wall = nil, nil
}

// remove drops target i (discovery's word: it exec'd or is gone),
// handing its profiles on.
func (c *clock) remove(i int) {
	t := c.targets[i]
	c.hand(t, c.end)
	c.a.stopAlloc(t)
	t.close()
	c.a.publish(t.pid, false)
	c.targets = append(c.targets[:i], c.targets[i+1:]...)
	c.a.stats.tracked.Store(int64(len(c.targets)))
}

// execd reports, after a failed sample, whether t's process has exec'd
// (or is gone): its image's identity changed.
func (c *clock) execd(t *proc) bool {
	ps, err := procfs.ReadStat(t.pid)
	return err == nil && ps.Identity() != t.ident
}

// drop drops target i on the clock's own finding (it exited or exec'd)
// and tells discovery.
func (c *clock) drop(i int, why string) {
	t := c.targets[i]
	c.a.log.Info(why, "pid", t.pid, "service_name", t.service)
	c.remove(i)
	c.a.noteDropped(gone{pid: t.pid, ident: t.ident})
}

// finish hands every target's last, partial interval on and closes them.
func (c *clock) finish() {
	now := time.Now()
	for _, t := range c.targets {
		until := c.end
		if now.Before(until) {
			until = now
		}
		c.hand(t, until)
		c.a.stopAlloc(t)
		t.close()
		c.a.publish(t.pid, false)
	}
	c.targets = nil
	c.a.stats.tracked.Store(0)
}

// flusher builds the finished profiles and queues them, off the clock's
// goroutine, until flushEnd is closed and nothing is left.
func (a *Agent) flusher() {
	for {
		ending := false
		select {
		case <-a.flushWake:
		case <-a.flushEnd:
			ending = true
		}
		a.flushMu.Lock()
		batch := a.flushes
		a.flushes = nil
		a.flushMu.Unlock()
		for _, f := range batch {
			a.flush(f)
		}
		if ending {
			a.flushMu.Lock()
			left := len(a.flushes)
			a.flushMu.Unlock()
			if left == 0 {
				return
			}
		}
	}
}

// flush builds one target's profiles of one interval and queues them.
func (a *Agent) flush(f flush) {
	for _, b := range []*upload.Builder{f.cpu, f.wall} {
		if b == nil || b.Samples() == 0 {
			continue
		}
		p, err := b.Profile(f.until, time.Time{})
		if err == nil && p != nil {
			err = a.up.AddProfileFor(f.service, f.labels, f.from, f.until, p, b.Samples())
		}
		if err != nil {
			a.stats.profileErrs.Add(1)
			a.log.Warn("cannot queue a profile", "service_name", f.service, "pid", f.labels["pid"], "err", err)
			continue
		}
		a.stats.profiles.Add(1)
	}
}

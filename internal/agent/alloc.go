package agent

import (
	"context"
	"errors"
	"math"
	"sync"
	"time"

	"github.com/rbscope/rbscope/internal/alloc"
	"github.com/rbscope/rbscope/internal/target"
)

// allocs counts the allocations of every profiled process (Config.Alloc):
// one alloc.Run per process, in the default mode (short counting windows
// scaled by Ruby's own allocation counter, one counted allocation in 64
// with its stack), pushing one allocation profile (alloc_objects,
// alloc_space) per Interval under the process's service name and labels.
type allocs struct {
	mu      sync.Mutex
	running map[*proc]context.CancelFunc
	wg      sync.WaitGroup
}

// startAlloc begins counting t's allocations, when Config.Alloc asks.
// Called by the clock when it takes t.
func (a *Agent) startAlloc(t *proc) {
	if !a.cfg.Alloc {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	a.allocs.mu.Lock()
	if a.allocs.running == nil {
		a.allocs.running = map[*proc]context.CancelFunc{}
	}
	a.allocs.running[t] = cancel
	a.allocs.mu.Unlock()
	a.allocs.wg.Add(1)
	go func() {
		defer a.allocs.wg.Done()
		a.countAllocs(ctx, t)
	}()
}

// stopAlloc ends the counting of t's allocations (it exited, exec'd, or
// the agent stops); its last interval is pushed.
func (a *Agent) stopAlloc(t *proc) {
	a.allocs.mu.Lock()
	cancel := a.allocs.running[t]
	delete(a.allocs.running, t)
	a.allocs.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

// waitAllocs waits for every count to push its last interval.
func (a *Agent) waitAllocs() { a.allocs.wg.Wait() }

// countAllocs counts t's allocations until ctx ends or the process exits.
func (a *Agent) countAllocs(ctx context.Context, t *proc) {
	iv := alloc.NewIntervals()
	from := time.Now()
	var pushed uint64 // allocations queued in this process's profiles
	push := func(r *alloc.Report) {
		now := time.Now()
		d := iv.Next(r)
		n := d.Total()
		if n == 0 {
			return // an interval without allocations pushes nothing
		}
		p, err := d.Profile()
		if err == nil {
			err = a.up.AddProfileFor(t.service, t.labels, from, now, p, int(min(n, math.MaxInt32)))
		}
		if err != nil {
			a.stats.profileErrs.Add(1)
			a.log.Warn("cannot queue an allocation profile", "service_name", t.service, "pid", t.pid, "err", err)
			return
		}
		a.stats.allocProfiles.Add(1)
		pushed += n
		from = now
	}
	attached := false
	defer func() {
		if attached {
			a.stats.allocTracked.Add(-1)
		}
	}()
	r, err := alloc.Run(ctx, alloc.RunConfig{
		Pid: t.pid, PushInterval: a.cfg.Interval, OnPush: push,
		OnAttach: func(*alloc.Plan) {
			attached = true
			a.stats.allocTracked.Add(1)
		},
	})
	if err != nil {
		if !attached && (errors.Is(err, target.ErrExited) || ctx.Err() != nil) {
			return // gone before its probes were attached, or stopping
		}
		// Counted, then lost: the intervals since the last push are
		// missing from the server.
		a.stats.allocErrors.Add(1)
		a.log.Warn("cannot count allocations", "service_name", t.service, "pid", t.pid, "err", err)
		return
	}
	push(r)
	a.log.Info("allocation count ended", "service_name", t.service, "pid", t.pid,
		"allocated", r.RubyAllocated, "queued", pushed, "scaling", r.Scaling,
		"counter_source", r.CounterSource, "counter_end", r.CounterEnd, "loose_windows", r.LooseWindows,
		"counted_fraction", math.Round(1000*r.Attached)/1000, "duration", r.Duration.Round(time.Millisecond))
}

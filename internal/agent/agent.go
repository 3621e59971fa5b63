package agent

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rbscope/rbscope/internal/procfs"
	"github.com/rbscope/rbscope/internal/rtprio"
	"github.com/rbscope/rbscope/internal/ruby"
	"github.com/rbscope/rbscope/internal/sampler"
	"github.com/rbscope/rbscope/internal/stack"
	"github.com/rbscope/rbscope/internal/upload"
)

// Agent profiles the host's Ruby processes into Pyroscope. Make one with
// New, then Run it.
type Agent struct {
	cfg      Config
	log      *slog.Logger
	up       *upload.Uploader
	runtimes *ruby.Runtimes
	rate     int

	// events carry targets from discovery to the clock.
	events chan event
	// flushes are finished intervals the clock handed to the flusher
	// (never blocking the clock: a rotation hands every process's at
	// once); flushWake wakes the flusher, flushEnd ends it once drained.
	flushMu   sync.Mutex
	flushes   []flush
	flushWake chan struct{}
	flushEnd  chan struct{}

	// dropped are the processes the clock dropped on its own (they
	// exited), for discovery to forget.
	droppedMu sync.Mutex
	dropped   []gone

	// pids are the processes the clock samples, published for Pids.
	pidsMu sync.Mutex
	pids   map[int]bool

	allocs allocs

	metricsLn   net.Listener
	metricsSrv  *http.Server
	metricsAddr string

	stats counters
}

// counters are the agent's own counts (see Stats).
type counters struct {
	tracked       atomic.Int64
	discovered    atomic.Int64
	opened        atomic.Int64
	exited        atomic.Int64
	reexecs       atomic.Int64
	notRuby       atomic.Int64
	filtered      atomic.Int64
	denied        atomic.Int64
	gaveUp        atomic.Int64
	overLimit     atomic.Int64
	ticks         atomic.Int64
	samples       atomic.Int64
	errors        [sampler.KindMovedOn + 1]atomic.Int64
	profiles      atomic.Int64
	profileErrs   atomic.Int64
	tickNanos     atomic.Int64
	targetTicks   atomic.Int64
	scans         atomic.Int64
	scanNanos     atomic.Int64
	rubyChecks    atomic.Int64
	lastScanPids  atomic.Int64
	allocTracked  atomic.Int64
	allocProfiles atomic.Int64
	allocErrors   atomic.Int64
}

// Stats are the agent's counts so far.
type Stats struct {
	Tracked    int   // processes profiled now
	Discovered int64 // Ruby processes found (passing the filters), over time
	Opened     int64 // processes opened for sampling, over time
	Exited     int64 // profiled processes that exited
	Reexecs    int64 // profiled processes that exec'd (dropped, looked at anew)
	NotRuby    int64 // process images found not to be Ruby
	Filtered   int64 // Ruby processes left out by the filters
	Denied     int64 // processes the kernel refused
	GaveUp     int64 // Ruby processes never readable within OpenTimeout
	OverLimit  int64 // times a process was left out by MaxProcesses
	// RubyChecks counts the process images examined for being Ruby
	// (once per image: negative answers are kept).
	RubyChecks int64
	Scans      int64 // /proc listings
	// HostProcesses is the number of processes the last listing found.
	HostProcesses int64
	// ScanTime is the time spent listing /proc and examining and opening
	// processes.
	ScanTime time.Duration
	Ticks    int64
	Samples  int64 // thread samples taken
	// Errors counts failed samples by kind (sampler.ErrorKind).
	Errors map[string]int64
	// Profiles counts profiles handed to the uploader; ProfileErrors
	// those that could not be built.
	Profiles, ProfileErrors int64
	// TargetTicks counts one target sampled on one tick; TickTime is the
	// time spent in all ticks.
	TargetTicks int64
	TickTime    time.Duration
	Runtime     ruby.RuntimeStats
	Upload      upload.Stats
	// Buffer is the bound on queued profile bytes.
	Buffer int64
	// AllocTracked are the processes whose allocations are counted now
	// (Config.Alloc), AllocProfiles the allocation profiles queued, and
	// AllocErrors the processes whose allocations could not be counted.
	AllocTracked               int
	AllocProfiles, AllocErrors int64
}

// New checks cfg, starts the uploader and the metrics listener (Run
// serves it).
func New(cfg Config) (*Agent, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if cfg.Realtime {
		if err := rtprio.Check(); err != nil {
			return nil, fmt.Errorf("realtime clock: %w", err)
		}
	}
	a := &Agent{
		cfg:       cfg,
		log:       cfg.Logger,
		runtimes:  ruby.NewRuntimes(),
		rate:      int(cfg.Rate + 0.5),
		events:    make(chan event, 1024),
		flushWake: make(chan struct{}, 1),
		flushEnd:  make(chan struct{}),
		pids:      map[int]bool{},
	}
	if a.rate < 1 {
		a.rate = 1
	}
	a.up, err = upload.New(upload.Config{
		URL: cfg.URL,
		// Every profile goes through AddProfileFor, under its process's
		// own service name; this one is never pushed to.
		AppName:        "rbscope-agent",
		Tags:           cfg.Tags,
		Interval:       cfg.Interval,
		SampleRate:     a.rate,
		MaxMemoryBytes: cfg.Buffer,
		Logf: func(format string, args ...any) {
			a.log.Warn(fmt.Sprintf(format, args...), "part", "upload")
		},
	})
	if err != nil {
		return nil, err
	}
	if cfg.MetricsAddr != "" {
		ln, err := net.Listen("tcp", cfg.MetricsAddr)
		if err != nil {
			a.up.Close(context.Background())
			return nil, fmt.Errorf("listen for /metrics on %s: %w", cfg.MetricsAddr, err)
		}
		a.metricsLn = ln
		a.metricsAddr = ln.Addr().String()
	}
	return a, nil
}

// MetricsAddr is the address /metrics is served on ("" for none).
func (a *Agent) MetricsAddr() string { return a.metricsAddr }

// Run profiles until ctx is done, then finishes the profiles of the
// current interval, pushes what is queued for at most FlushTimeout and
// returns. The error is non-nil when profiling could not start, or
// profiles were left unpushed.
func (a *Agent) Run(ctx context.Context) error {
	if a.metricsLn != nil {
		a.metricsSrv = &http.Server{Handler: a.metricsHandler(), ReadHeaderTimeout: 5 * time.Second}
		go a.metricsSrv.Serve(a.metricsLn)
		a.log.Info("serving metrics", "url", "http://"+a.metricsAddr+"/metrics")
	}
	a.log.Info("agent started", "upload", a.cfg.URL, "rate_hz", a.cfg.Rate, "interval", a.cfg.Interval.String(),
		"buffer_bytes", a.cfg.Buffer, "alloc", a.cfg.Alloc, "realtime", a.cfg.Realtime, "pid", os.Getpid())

	flushDone := make(chan struct{})
	go func() {
		defer close(flushDone)
		a.flusher()
	}()
	discCtx, stopDisc := context.WithCancel(ctx)
	discDone := make(chan struct{})
	go func() {
		defer close(discDone)
		newDiscovery(a).run(discCtx)
	}()

	clk := newClock(a)
	// Mode cpu: the threads' context switches tell on a CPU from waiting
	// for one (see oncpu): on a busy host a runnable thread that holds the
	// GVL is mostly waiting, and counting it as on a CPU leaned the cpu
	// profiles towards the code it was preempted in. The clock keeps every
	// sample for the wall profiles (it returns none to Run to filter).
	_, err := sampler.Run(ctx, clk, sampler.Config{Rate: a.cfg.Rate, Mode: stack.ModeCPU, RealtimeClock: a.cfg.Realtime}, nil)
	stopDisc()
	<-discDone
	// Targets discovery opened that the clock never took.
	clk.drainEvents()
	clk.finish()
	// The allocation counts push their last intervals themselves.
	a.waitAllocs()
	close(a.flushEnd)
	<-flushDone

	fctx, cancel := context.WithTimeout(context.Background(), a.cfg.FlushTimeout)
	defer cancel()
	uerr := a.up.Close(fctx)
	st := a.Stats()
	a.log.Info("agent stopped", "profiles_pushed", st.Upload.Pushed, "samples_pushed", st.Upload.PushedSamples,
		"profiles_dropped", st.Upload.Dropped, "samples", st.Samples)
	if a.metricsSrv != nil {
		sctx, scancel := context.WithTimeout(context.Background(), time.Second)
		a.metricsSrv.Shutdown(sctx)
		scancel()
	}
	if err != nil {
		return fmt.Errorf("sample: %w", err)
	}
	if uerr != nil {
		return fmt.Errorf("push the last profiles: %w", uerr)
	}
	return nil
}

// Stats returns the counts so far.
func (a *Agent) Stats() Stats {
	c := &a.stats
	st := Stats{
		Tracked:       int(c.tracked.Load()),
		Discovered:    c.discovered.Load(),
		Opened:        c.opened.Load(),
		Exited:        c.exited.Load(),
		Reexecs:       c.reexecs.Load(),
		NotRuby:       c.notRuby.Load(),
		Filtered:      c.filtered.Load(),
		Denied:        c.denied.Load(),
		GaveUp:        c.gaveUp.Load(),
		OverLimit:     c.overLimit.Load(),
		RubyChecks:    c.rubyChecks.Load(),
		Scans:         c.scans.Load(),
		HostProcesses: c.lastScanPids.Load(),
		ScanTime:      time.Duration(c.scanNanos.Load()),
		Ticks:         c.ticks.Load(),
		Samples:       c.samples.Load(),
		Errors:        map[string]int64{},
		Profiles:      c.profiles.Load(),
		ProfileErrors: c.profileErrs.Load(),
		TargetTicks:   c.targetTicks.Load(),
		TickTime:      time.Duration(c.tickNanos.Load()),
		Runtime:       a.runtimes.Stats(),
		Upload:        a.up.Stats(),
		Buffer:        a.cfg.Buffer,
		AllocTracked:  int(c.allocTracked.Load()),
		AllocProfiles: c.allocProfiles.Load(),
		AllocErrors:   c.allocErrors.Load(),
	}
	for k := range c.errors {
		if n := c.errors[k].Load(); n > 0 {
			st.Errors[errorKindName(sampler.ErrorKind(k))] = n
		}
	}
	return st
}

// errorKindName is a metric-friendly name of an error kind.
func errorKindName(k sampler.ErrorKind) string {
	switch k {
	case sampler.KindExited:
		return "exited"
	case sampler.KindUnmapped:
		return "inconsistent"
	case sampler.KindPermission:
		return "permission"
	case sampler.KindMovedOn:
		return "moved_on"
	}
	return "other"
}

// Pids lists the processes being sampled now.
func (a *Agent) Pids() []int {
	a.pidsMu.Lock()
	defer a.pidsMu.Unlock()
	out := make([]int, 0, len(a.pids))
	for pid := range a.pids {
		out = append(out, pid)
	}
	sort.Ints(out)
	return out
}

// publish records that the clock samples process pid now (or no longer).
func (a *Agent) publish(pid int, on bool) {
	a.pidsMu.Lock()
	if on {
		a.pids[pid] = true
	} else {
		delete(a.pids, pid)
	}
	a.pidsMu.Unlock()
}

// gone is a process the clock dropped.
type gone struct {
	pid   int
	ident procfs.Identity
}

func (a *Agent) noteDropped(g gone) {
	a.droppedMu.Lock()
	a.dropped = append(a.dropped, g)
	a.droppedMu.Unlock()
}

func (a *Agent) takeDropped() []gone {
	a.droppedMu.Lock()
	defer a.droppedMu.Unlock()
	d := a.dropped
	a.dropped = nil
	return d
}

// processLabels are the series labels of a target besides its service
// name: its own labels, pid and ruby_version.
func processLabels(l Labels, pid int, version string) map[string]string {
	m := make(map[string]string, len(l.Extra)+2)
	for k, v := range l.Extra {
		m[k] = upload.CleanLabelValue(v)
	}
	m["pid"] = strconv.Itoa(pid)
	m["ruby_version"] = upload.CleanLabelValue(version)
	return m
}

package alloc

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"

	"github.com/rbscope/rbscope/internal/elfx"
	"github.com/rbscope/rbscope/internal/ruby"
	"github.com/rbscope/rbscope/internal/target"
)

// Errors users hit, each with what to do. They wrap the underlying error.
var (
	// ErrBPFDenied: the kernel refused to load or attach. Perf-event
	// uprobes need CAP_SYS_ADMIN; uprobe_multi links (Linux 6.6+) were
	// measured to work with CAP_BPF, CAP_PERFMON and CAP_SYS_PTRACE.
	ErrBPFDenied = errors.New("attaching eBPF uprobes needs CAP_SYS_ADMIN: run as root (on Linux 6.6+, CAP_BPF+CAP_PERFMON+CAP_SYS_PTRACE also do)")
	// ErrNoBPF: the kernel cannot load the program.
	ErrNoBPF = errors.New("this kernel cannot run the eBPF program (needs BPF with kprobe programs, attach cookies: Linux 5.15+)")
	// ErrNoUprobes: the kernel has no uprobe support.
	ErrNoUprobes = errors.New("this kernel has no uprobes (needs CONFIG_UPROBE_EVENTS)")
	// ErrProbeBusy: another tracer holds the probe with another semaphore.
	ErrProbeBusy = errors.New("another tracer (bcc?) holds this probe with a different semaphore offset: stop it and retry")
	// ErrUnsupportedArch: the program reads x86_64 registers.
	ErrUnsupportedArch = errors.New("rbscope alloc supports x86_64 only")
)

// Default duty cycle: the probes are attached for DefaultDutyCycle of
// every DefaultDutyWindow (at a random phase). A tight allocation loop
// runs 10-20 times slower while attached, so this costs it a few percent.
const (
	DefaultDutyCycle  = 0.03
	DefaultDutyWindow = 100 * time.Millisecond
	// DefaultRetainedDutyCycle is the duty cycle of retained mode: its
	// counts are those of the objects tracked, a sample that must be
	// large enough for the few that live (a leak among churn). Windows
	// still shorten to about windowEvents events, which bounds the cost
	// on allocation-bound loops.
	DefaultRetainedDutyCycle = 0.2
	// DefaultRetainedDutyWindow is retained mode's duty-cycle period:
	// windows of up to 100 ms (windowEvents events), so that one spans
	// many bursts of a busy target's allocations (a loop's steps, a
	// server's requests) and the one it cuts weighs little.
	DefaultRetainedDutyWindow = 500 * time.Millisecond
)

// Options tunes Attach.
type Options struct {
	// Exact keeps the probes attached and counts every event. Otherwise
	// (the default) they are attached in short windows and the counts are
	// scaled by Ruby's own allocation counter (see Report.Scaling).
	Exact bool
	// SamplePeriod counts one in SamplePeriod events (chosen at random, in
	// the kernel) and scales counts by it. 0 or 1 counts every event.
	SamplePeriod uint32
	// DutyCycle is the fraction of every DutyWindow the probes are
	// attached when not Exact (default DefaultDutyCycle; >= 1: always),
	// at most: a window that would count more than about windowEvents
	// events (by the recent windows' rate) is shorter.
	DutyCycle float64
	// DutyWindow is the duty-cycle period (default DefaultDutyWindow;
	// DefaultRetainedDutyWindow in retained mode).
	DutyWindow time.Duration
	// ForceSymbols uses the allocation-function fallback even when the
	// binary has USDT probes.
	ForceSymbols bool
	// StackPeriod copies the Ruby stack of one in StackPeriod counted
	// allocations (0: DefaultStackPeriod, or DefaultExactStackPeriod when
	// Exact). NoStacks copies none.
	StackPeriod uint32
	NoStacks    bool
	// NoSites counts by class only: the probes do not read each
	// allocation's file and line (Ruby passes the line on its stack, and
	// that read costs more than the rest of the program), and the report
	// has no sites.
	NoSites bool
	// PerSite attaches one perf-event uprobe per site even where the
	// kernel has uprobe_multi links (to compare their costs).
	PerSite bool
	// Retained tracks the objects created (in the counting windows, or
	// all of them when Exact) until they die, and the report is the
	// retained view: those still alive at the end (see retained.go).
	Retained bool
	// ClassName resolves a klass VALUE to its name (the fallback mode
	// counts klass pointers). Nil: names are shown as addresses.
	ClassName func(klass uint64) (string, error)
	// calibrate finds the counter by calibration even where the heaps'
	// layout knows it (tests of the calibration on live processes).
	calibrate bool
}

// Tracker counts one process's allocations until closed. Besides what it
// reads from (the target, the program's maps, the Ruby process) it holds
// three parts, each with its own state: its probes (probeSet: the program
// and its links), the duty cycle's windows (dutyCycle: when the probes are
// attached, how long, where a window ends) and the estimator of what the
// windows did not count (estimator: Ruby's allocation counter, its
// calibration, the scaling). The methods that open and close a window
// (window.go) join the three.
type Tracker struct {
	pid   int
	t     target.Target
	plan  *Plan
	opts  Options
	maps  allocMaps
	start time.Time

	mu        sync.Mutex
	stop      chan struct{}
	done      chan struct{}
	closed    bool
	stopped   bool
	end       time.Time // when Stop detached
	names     *names
	dutyErr   error
	rb        *ruby.Process // opened once, for the counter and class names
	probeSet                // guarded by mu once the duty cycle runs
	dutyCycle               // guarded by mu once the duty cycle runs
	estimator               // guarded by mu once the duty cycle runs

	stacks    stackAgg
	stackRd   *ringbuf.Reader
	stackDone chan struct{}

	exit exitCapture
	// namedKeys is statKeys when resolveNames last read the maps.
	namedKeys uint64
	// targetExited: the duty cycle found the process gone (or in Ruby's
	// teardown) and stopped.
	targetExited bool
	// stackPeriod is the program's stack period (0: no stacks).
	stackPeriod uint32
	// ret is retained mode's state (nil otherwise).
	ret *retState
}

// probeSet is a Tracker's probes: the program attached, multi or per
// site, to the mapped binary, and its links.
type probeSet struct {
	prog  *ebpf.Program // the program attached (multi or per-site)
	multi bool          // one uprobe_multi link instead of one link per site
	exe   *link.Executable
	bin   target.File // the mapped binary, which exe names by descriptor
	// links hold the allocation probes, attached in windows (unless
	// Exact); always the GC and exit probes, attached from Attach to
	// Stop (a few events per GC, one at exit).
	links    []link.Link
	always   []link.Link
	attached bool
}

// dutyCycle is the state of a Tracker's counting windows: how long the
// probes were attached, the recent windows' rates and lengths for the next
// one's, and where the current one ends (a quiet moment, a mark, a burst
// boundary).
type dutyCycle struct {
	onSince time.Time     // when the current attached period began
	onTotal time.Duration // attached time before onSince
	// winOpenEvents are the events when the window opened (winEvents
	// moves on at each calibration checkpoint), for winRate.
	winOpenEvents uint64
	// winRate is the events per second counted in recent windows (a
	// moving average), for windowLength.
	winRate float64
	// lastWinEvents are the events the last window counted, and lastWin
	// how long its gate was open, for offLength.
	lastWinEvents uint64
	lastWin       time.Duration
	// quietMisses counts the windows since the last one that ended at a
	// quiet moment (see untilQuiet).
	quietMisses int
	// marking: the current window ends where the next one like it would
	// begin (window_mark, see armMark); winPastEnd are the events past
	// such ends when the window opened.
	marking    bool
	winPastEnd uint64
	// winAtIdle: the current window opened while the target idled, its
	// first event began a burst (default mode's mark, see armMark);
	// seenAtAttach are the events seen when its probes were being
	// attached (idleNow), boundary the burst boundary learned last.
	winAtIdle    bool
	seenAtAttach uint64
	boundary     boundary
}

// Attach loads the program and attaches it to the Ruby process pid.
func Attach(pid int, opts Options) (*Tracker, error) {
	if runtime.GOARCH != "amd64" {
		return nil, ErrUnsupportedArch
	}
	t, err := target.OpenLive(pid)
	if err != nil {
		return nil, err
	}
	plan, err := PlanFor(t, opts.ForceSymbols)
	if err != nil {
		t.Close()
		return nil, err
	}
	tr, err := attachPlan(t, plan, opts)
	if err != nil {
		t.Close()
		return nil, err
	}
	return tr, nil
}

// attachPlan loads the program for plan, attaches it to the process
// behind t and starts the tracker's readers and duty cycle. On an error
// t is the caller's to close.
func attachPlan(t target.Target, plan *Plan, opts Options) (_ *Tracker, err error) {
	if len(plan.Sites) > maxSpecs {
		return nil, fmt.Errorf("%d probe sites (at most %d)", len(plan.Sites), maxSpecs)
	}
	opts = withDefaults(opts)
	if err := checkKernel(); err != nil {
		return nil, err
	}
	spec, err := loadAlloc()
	if err != nil {
		return nil, fmt.Errorf("load program spec: %w", err)
	}
	if err := setProgramVars(spec, t.Pid(), opts); err != nil {
		return nil, err
	}
	tr := &Tracker{pid: t.Pid(), t: t, plan: plan, opts: opts}
	tr.findCounter()
	if opts.Retained {
		if err := tr.setupRetained(spec); err != nil {
			return nil, err
		}
		if len(plan.Sites) > maxSpecs {
			return nil, fmt.Errorf("%d probe and return sites (at most %d)", len(plan.Sites), maxSpecs)
		}
	}
	stackPeriod := tr.chooseStackPeriod(spec, opts)
	tr.stackPeriod = stackPeriod
	cn := opts.ClassName
	if cn == nil && plan.Mode == "symbols" {
		cn = tr.rubyClassNames()
	}
	tr.names = newNames(t, cn)
	// What is made from here on is undone, last first, if a later step
	// fails.
	var undo closers
	defer func() {
		if err != nil {
			undo.run()
		}
	}()
	// Memory is charged to the cgroup on current kernels; the memlock
	// rlimit is not raised (that would need CAP_SYS_RESOURCE).
	if err := spec.LoadAndAssign(&tr.maps, nil); err != nil {
		return nil, classifyLoad(err)
	}
	undo.push(func() { tr.maps.Close() })
	if err := tr.storeProbeSpecs(); err != nil {
		return nil, err
	}
	tr.syncExitRanges()
	if tr.bin, tr.exe, err = openMapped(t, plan); err != nil {
		return nil, err
	}
	undo.push(func() { tr.bin.Close() })
	tr.start = time.Now()
	if err := tr.loadAndAttach(spec); err != nil {
		return nil, err
	}
	tr.startReaders(stackPeriod)
	return tr, nil
}

// closers is a stack of cleanups, run last first: what a constructor has
// made so far, undone in one place when a later step fails.
type closers []func()

func (c *closers) push(f func()) { *c = append(*c, f) }

func (c *closers) run() {
	for i := len(*c) - 1; i >= 0; i-- {
		(*c)[i]()
	}
	*c = nil
}

// withDefaults returns opts with the defaults of its unset sample
// period, duty window and duty cycle (retained mode's own); a duty cycle
// of 1 or more is exact counting.
func withDefaults(opts Options) Options {
	if opts.SamplePeriod == 0 {
		opts.SamplePeriod = 1
	}
	if opts.DutyWindow <= 0 {
		opts.DutyWindow = DefaultDutyWindow
		if opts.Retained {
			opts.DutyWindow = DefaultRetainedDutyWindow
		}
	}
	if opts.DutyCycle <= 0 {
		opts.DutyCycle = DefaultDutyCycle
		if opts.Retained {
			opts.DutyCycle = DefaultRetainedDutyCycle
		}
	}
	if opts.DutyCycle >= 1 {
		opts.Exact = true
	}
	return opts
}

// setProgramVars sets the program's target process (pid), its sample
// period, and class-only counting (opts.NoSites).
func setProgramVars(spec *ebpf.CollectionSpec, pid int, opts Options) error {
	if err := spec.Variables[allocVarTargetTgid].Set(uint32(pid)); err != nil {
		return fmt.Errorf("set target pid: %w", err)
	}
	if err := spec.Variables[allocVarSamplePeriod].Set(opts.SamplePeriod); err != nil {
		return fmt.Errorf("set sample period: %w", err)
	}
	if opts.NoSites {
		if err := spec.Variables[allocVarWantSites].Set(uint32(0)); err != nil {
			return fmt.Errorf("set class-only counting: %w", err)
		}
	}
	return nil
}

// chooseStackPeriod returns the period of the allocation stacks (0: none;
// the default depends on exact and retained modes) and sets the
// program's stack variables for it. Stacks need the Ruby process's
// layout (tr.rb); where the variables cannot be set, there are none and
// tr.stacks.lastErr says why.
func (tr *Tracker) chooseStackPeriod(spec *ebpf.CollectionSpec, opts Options) uint32 {
	stackPeriod := uint32(0)
	if tr.rb != nil && !opts.NoStacks {
		stackPeriod = opts.StackPeriod
		if stackPeriod == 0 {
			stackPeriod = DefaultStackPeriod
			if opts.Exact {
				stackPeriod = DefaultExactStackPeriod
			}
			if opts.Retained {
				stackPeriod = DefaultRetainedStackPeriod
				if opts.Exact {
					stackPeriod = DefaultRetainedExactStackPeriod
				}
			}
		}
		if err := tr.stackVars(spec, stackPeriod); err != nil {
			tr.stacks.lastErr = fmt.Sprintf("no allocation stacks: %v", err)
			stackPeriod = 0
			spec.Variables[allocVarStackPeriod].Set(uint32(0))
		}
	}
	return stackPeriod
}

// storeProbeSpecs stores the plan's sites in the program's ProbeSpecs
// map, one per site index: what kind of site it is and where its
// arguments are.
func (tr *Tracker) storeProbeSpecs() error {
	for i, s := range tr.plan.Sites {
		ps := allocProbeSpec{Kind: uint32(s.Kind)}
		for j, a := range s.Args {
			if j >= len(ps.Args) {
				break
			}
			ps.Args[j] = allocArgSpec{Kind: uint8(a.Kind), Size: uint8(a.Size), RegOff: uint16(a.RegOffset), Val: a.Disp}
			if a.Signed {
				ps.Args[j].IsSigned = 1
			}
		}
		if s.Kind == KindReturn {
			retProbeSpec(s, &ps)
		}
		if err := tr.maps.ProbeSpecs.Put(uint32(i), &ps); err != nil {
			return fmt.Errorf("store probe spec: %w", err)
		}
	}
	return nil
}

// startReaders starts, once the program is attached, the goroutines that
// read its stacks (with stackPeriod > 0) and its exit events (a plan with
// an exit probe), and, unless counting is exact, the duty cycle.
func (tr *Tracker) startReaders(stackPeriod uint32) {
	if stackPeriod > 0 {
		rd, err := ringbuf.NewReader(tr.maps.Stacks)
		if err != nil {
			tr.stacks.lastErr = fmt.Sprintf("no allocation stacks: open ring buffer: %v", err)
		} else {
			tr.stackRd, tr.stackDone = rd, make(chan struct{})
			go tr.readStacks(rd, tr.stackDone)
		}
	}
	if tr.plan.HasExitProbe() {
		if rd, err := ringbuf.NewReader(tr.maps.ExitEvents); err == nil {
			tr.exit.rd, tr.exit.woke, tr.exit.done = rd, make(chan struct{}), make(chan struct{})
			go tr.watchExit()
		}
	}
	if !tr.opts.Exact {
		tr.stop = make(chan struct{})
		tr.done = make(chan struct{})
		go tr.dutyLoop()
	}
}

// loadAndAttach loads the program and attaches it. It prefers one
// uprobe_multi link (Linux 6.6+): attaching and, above all, detaching N
// perf-event uprobes costs the kernel an RCU grace period each.
func (tr *Tracker) loadAndAttach(spec *ebpf.CollectionSpec) error {
	opts := &ebpf.CollectionOptions{MapReplacements: tr.mapReplacements()}
	if !tr.opts.PerSite && haveUprobeMulti() {
		var multi struct {
			Prog *ebpf.Program `ebpf:"ruby_alloc_multi"`
		}
		if spec.LoadAndAssign(&multi, opts) == nil {
			tr.prog, tr.multi = multi.Prog, true
			err := tr.attachAll()
			if err == nil {
				return nil
			}
			tr.prog.Close()
			tr.prog, tr.multi = nil, false
			if errors.Is(err, ErrBPFDenied) {
				return err
			}
			// Otherwise (a probe held by another tracer, say) the
			// per-site path below attaches or names the failing site
			// precisely.
		}
	}
	var single struct {
		Prog *ebpf.Program `ebpf:"ruby_alloc"`
	}
	if err := spec.LoadAndAssign(&single, opts); err != nil {
		return classifyLoad(err)
	}
	tr.prog = single.Prog
	if err := tr.attachAll(); err != nil {
		tr.prog.Close()
		tr.prog = nil
		return err
	}
	return nil
}

func (tr *Tracker) mapReplacements() map[string]*ebpf.Map {
	return map[string]*ebpf.Map{
		allocMapProbeSpecs:     tr.maps.ProbeSpecs,
		allocMapSites:          tr.maps.Sites,
		allocMapClasses:        tr.maps.Classes,
		allocMapStats:          tr.maps.Stats,
		allocMapGcStart:        tr.maps.GcStart,
		allocMapGate:           tr.maps.Gate,
		allocMapLastTid:        tr.maps.LastTid,
		allocMapStackCountdown: tr.maps.StackCountdown,
		allocMapLastSite:       tr.maps.LastSite,
		allocMapStacks:         tr.maps.Stacks,
		allocMapExitRanges:     tr.maps.ExitRanges,
		allocMapExitGen:        tr.maps.ExitGen,
		allocMapExitCopy:       tr.maps.ExitCopy,
		allocMapExitInfo:       tr.maps.ExitInfo,
		allocMapExitEvents:     tr.maps.ExitEvents,
		allocMapPending:        tr.maps.Pending,
		allocMapTracked:        tr.maps.Tracked,
		allocMapTrackedLen:     tr.maps.TrackedLen,
		allocMapCheckState:     tr.maps.CheckState,
		allocMapMarkPending:    tr.maps.MarkPending,
		allocMapPendingNew:     tr.maps.PendingNew,
		allocMapWindowMark:     tr.maps.WindowMark,
		allocMapFirstPreds:     tr.maps.FirstPreds,
	}
}

const maxSpecs = 1024

// attachAll attaches the probes that stay for the whole session (GC, exit)
// and opens the first counting window. Called before the tracker is
// shared.
func (tr *Tracker) attachAll() error {
	var always []int
	for i, s := range tr.plan.Sites {
		if s.always() {
			always = append(always, i)
		}
	}
	if len(always) > 0 {
		ls, err := tr.attachSites(always)
		if err != nil {
			return err
		}
		tr.always = ls
	}
	if err := tr.attach(); err != nil {
		closeLinks(tr.always)
		tr.always = nil
		return err
	}
	return nil
}

// attach attaches the allocation probes and opens a counting window.
// Called with mu held or before the tracker is shared.
func (tr *Tracker) attach() error {
	if err := tr.attachProbes(); err != nil {
		return err
	}
	tr.winAtIdle = tr.idleNow()
	tr.openAttached()
	return nil
}

// openAttached opens a counting window on the attached probes. Called
// with mu held.
func (tr *Tracker) openAttached() {
	tr.attached = true
	tr.openWindow()
}

// attachProbes attaches the program to the windowed sites, the gate
// closed: attach opens a window at once, reattach at an idle moment
// (untilIdle, then openAttached). Called with mu held.
func (tr *Tracker) attachProbes() error {
	var idx []int
	for i, s := range tr.plan.Sites {
		if !s.always() {
			idx = append(idx, i)
		}
	}
	if err := tr.resetMark(); err != nil {
		return err
	}
	tr.seenAtAttach, _ = tr.statSum(statSeen)
	ls, err := tr.attachSites(idx)
	if err != nil {
		return err
	}
	tr.links = ls
	return nil
}

// attachSites attaches the program to the sites idx indexes in plan.Sites
// (each site's index is its cookie): one uprobe_multi link, or one
// perf-event uprobe per site (in parallel: each registration takes the
// kernel tens of milliseconds).
func (tr *Tracker) attachSites(idx []int) ([]link.Link, error) {
	if tr.multi {
		n := len(idx)
		opts := &link.UprobeMultiOptions{
			Addresses:     make([]uint64, n),
			RefCtrOffsets: make([]uint64, n),
			Cookies:       make([]uint64, n),
			PID:           uint32(tr.pid),
		}
		for j, i := range idx {
			s := tr.plan.Sites[i]
			opts.Addresses[j], opts.RefCtrOffsets[j], opts.Cookies[j] = s.Offset, s.RefCtrOffset, uint64(i)
		}
		l, err := tr.exe.UprobeMulti(nil, tr.prog, opts)
		if err != nil {
			return nil, classifyAttach(err, tr.pid, Site{Name: fmt.Sprintf("%d probe sites", n)})
		}
		return []link.Link{l}, nil
	}
	links := make([]link.Link, len(idx))
	errs := make([]error, len(idx))
	var wg sync.WaitGroup
	for j, i := range idx {
		s := tr.plan.Sites[i]
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := tr.exe.Uprobe(s.Name, tr.prog, &link.UprobeOptions{
				Address:      s.Offset,
				RefCtrOffset: s.RefCtrOffset,
				PID:          tr.pid,
				Cookie:       uint64(i),
			})
			if err != nil {
				errs[j] = classifyAttach(err, tr.pid, s)
				return
			}
			links[j] = l
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			closeLinks(links)
			return nil, err
		}
	}
	return links, nil
}

// closeLinks closes links in parallel: each uprobe unregistration waits
// for an RCU grace period.
func closeLinks(links []link.Link) {
	var wg sync.WaitGroup
	for _, l := range links {
		if l == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			l.Close()
		}()
	}
	wg.Wait()
}

func (tr *Tracker) detach() {
	if tr.attached {
		tr.closeWindow()
	}
	closeLinks(tr.links)
	tr.links = nil
	tr.attached = false
	t0 := time.Now()
	tr.settleCalibration()
	if os.Getenv("RBSCOPE_ALLOC_DEBUG") != "" {
		fmt.Fprintf(os.Stderr, "detached: settling took %v\n", time.Since(t0))
	}
	tr.syncExitRanges()
}

func (tr *Tracker) dutyLoop() {
	defer close(tr.done)
	full := tr.fullWindow()
	for {
		tr.mu.Lock()
		on := tr.windowLength(full)
		tr.mu.Unlock()
		// While the counter is being found, each window is cut in
		// checkpoints: every one is a test of the candidates, so that a
		// short run still gets enough of them.
		steps := 1
		if tr.calibrating() {
			steps = max(1, min(calSteps, int(on/calStepMin)))
		}
		carved := false
		for i := 0; i < steps; i++ {
			step := on / time.Duration(steps)
			if i == steps-1 && step > quietGap {
				// The last quietGap of the window is the first look
				// for a quiet moment to end it at (untilQuiet).
				step -= quietGap
				carved = true
			}
			select {
			case <-tr.stop:
				return
			case <-time.After(step):
			}
			if i < steps-1 {
				tr.mu.Lock()
				tr.checkpoint()
				tr.mu.Unlock()
			}
		}
		if !tr.untilQuiet(carved) {
			return
		}
		tr.mu.Lock()
		tr.detach()
		off := tr.offLength(full)
		tr.mu.Unlock()
		// Names are read while the process lives: one that exits
		// before the next refresh keeps those of this window.
		tr.resolveNames()
		select {
		case <-tr.stop:
			return
		case <-time.After(off):
		}
		t0 := time.Now()
		if !tr.reattach() {
			return
		}
		if os.Getenv("RBSCOPE_ALLOC_DEBUG") != "" {
			fmt.Fprintf(os.Stderr, "reattached after a pause of %v: attaching took %v\n", off, time.Since(t0))
		}
	}
}

// reattach opens the next window, unless counting stopped or the process
// is exiting: Ruby's teardown began (the exit probe fired), or attaching
// failed because the process went away (its memory goes before its
// /proc entry: the kernel then says "file does not exist"). Only a
// failure while the process lives is an error. It reports whether the
// duty cycle goes on.
func (tr *Tracker) reattach() bool {
	tr.mu.Lock()
	if tr.stopped {
		tr.mu.Unlock()
		return false
	}
	if tr.exitFired() {
		tr.targetExited = true
		tr.mu.Unlock()
		return false
	}
	err := tr.attachProbes()
	tr.mu.Unlock()
	if err == nil {
		if !tr.untilIdle() {
			return false // Stop detaches
		}
		tr.mu.Lock()
		defer tr.mu.Unlock()
		if tr.stopped {
			return false
		}
		tr.openAttached()
		return true
	}
	exited := tr.waitExit(exitWait)
	tr.mu.Lock()
	switch {
	case exited:
		tr.targetExited = true
	case !tr.stopped:
		tr.dutyErr = err
	}
	tr.mu.Unlock()
	return false
}

// exitWait is how long a failed attach waits for the process to be gone
// before it counts as an error: the kernel tears an exiting process down
// in milliseconds.
const exitWait = 2 * time.Second

// waitExit reports whether the process exits (or its Ruby tears down)
// within d; it gives up early when Stop is called.
func (tr *Tracker) waitExit(d time.Duration) bool {
	deadline := time.After(d)
	for {
		tr.mu.Lock()
		fired := tr.exitFired()
		tr.mu.Unlock()
		if fired || !tr.Alive() {
			return true
		}
		select {
		case <-tr.stop:
			return false
		case <-deadline:
			return false
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// Exited reports whether the process exited or began Ruby's teardown, as
// far as the tracker has seen: its counts are then final.
func (tr *Tracker) Exited() bool {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.targetExited || tr.exitFired()
}

// Plan returns where the tracker is attached.
func (tr *Tracker) Plan() *Plan { return tr.plan }

// Pid is the traced process.
func (tr *Tracker) Pid() int { return tr.pid }

// Stop detaches from the process (its semaphores drop back) and freezes
// the report's duration; Snapshot still works until Close.
func (tr *Tracker) Stop() {
	tr.mu.Lock()
	if tr.stopped {
		tr.mu.Unlock()
		return
	}
	tr.stopped = true
	tr.mu.Unlock()
	if tr.stop != nil {
		close(tr.stop)
		<-tr.done
	}
	tr.mu.Lock()
	tr.detach()
	tr.end = time.Now()
	closeLinks(tr.always)
	tr.always = nil
	if tr.cal != nil && tr.cal.last != nil {
		// A run too short for the usual evidence: choose on what there
		// is, rather than scale by time.
		if c, start, _, cur := tr.cal.choose(tr.cal.last, calMinFinalWindows); c != nil {
			tr.adoptCounter(c, start)
			// Its value in the last read, unless read later below.
			tr.counterEnd, tr.counterEndHow = cur, counterEndLost
		}
	}
	if tr.counter != nil {
		// The total runs to the end, not to the last window's close:
		// read now, or copied at Ruby's teardown by the exit probe.
		if v, err := tr.readCounter(); err == nil {
			tr.counterEnd = v
			tr.counterEndHow = counterEndStop
			if tr.exit.copy != nil {
				tr.counterEndHow = counterEndExit
			}
		} else {
			tr.counterEndHow = counterEndLost
		}
	}
	tr.mu.Unlock()
	tr.drainStacks(stackDrainTimeout)
	if tr.ret != nil {
		tr.mu.Lock()
		tr.collectRetained(tr.targetExited || tr.exitFired() || !tr.Alive())
		tr.mu.Unlock()
	}
}

// drainStacks waits (at most timeout) until the stack reader has taken
// every stack the program copied so far (before Stop detached it, after
// Stop), so that the next report holds them: the reader may still be
// opening its walker (seconds for a large static Ruby) when a short run
// ends, or when the first interval is pushed.
func (tr *Tracker) drainStacks(timeout time.Duration) {
	if tr.stackRd == nil {
		return
	}
	want, err := tr.statSum(statStacks)
	if err != nil {
		return
	}
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		tr.mu.Lock()
		got := tr.stacks.total
		tr.mu.Unlock()
		if got >= want {
			return
		}
		select {
		case <-tr.stackDone:
			return // the reader gave up (no walker)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// stackDrainTimeout bounds the wait for the stacks at the end, and
// pushDrainTimeout before an interval is pushed (its stacks not taken
// yet go with the next one).
const (
	stackDrainTimeout = 10 * time.Second
	pushDrainTimeout  = 3 * time.Second
)

// Close detaches and frees everything. The kernel also detaches (and
// decrements the probes' semaphores) when rbscope dies, because the links
// are file descriptors.
func (tr *Tracker) Close() error {
	tr.Stop()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.closed {
		return nil
	}
	tr.closed = true
	if tr.stackRd != nil {
		tr.mu.Unlock()
		tr.stackRd.Close()
		<-tr.stackDone
		tr.mu.Lock()
	}
	if tr.exit.rd != nil {
		tr.mu.Unlock()
		tr.exit.rd.Close()
		<-tr.exit.done
		tr.mu.Lock()
	}
	if tr.prog != nil {
		tr.prog.Close()
	}
	tr.maps.Close()
	tr.bin.Close()
	return tr.t.Close()
}

// openMapped opens the binary the process mapped as plan.Binary (see
// target.Target.OpenFile: the mapped object itself, or the file at the
// path once its inode and build id are checked) and names it for the
// kernel by its descriptor, /proc/<rbscope's pid>/fd/N. Uprobes live on
// an inode, which the kernel finds from a path at every attach (every
// window): a path in the target's file system could by then name another
// file (a libruby replaced by an upgrade), the descriptor cannot.
func openMapped(t target.Target, plan *Plan) (_ target.File, _ *link.Executable, err error) {
	f, err := t.OpenFile(plan.Binary)
	if err != nil {
		return nil, nil, fmt.Errorf("open %s of process %d to attach to it: %w", plan.Binary, t.Pid(), err)
	}
	defer func() {
		if err != nil {
			f.Close()
		}
	}()
	fd, ok := f.(interface{ Fd() uintptr })
	if !ok {
		return nil, nil, fmt.Errorf("%s of process %d has no file descriptor to attach to", plan.Binary, t.Pid())
	}
	if id, err := elfx.FileBuildID(f); err != nil || id != plan.BuildID {
		return nil, nil, target.ReplacedError{Pid: t.Pid(), Path: plan.Binary,
			Why: fmt.Sprintf("build id %q when probes were planned, %q now (%v)", plan.BuildID, id, err)}
	}
	exe, err := link.OpenExecutable(fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), fd.Fd()))
	if err != nil {
		return nil, nil, fmt.Errorf("open %s of process %d to attach to it: %w", plan.Binary, t.Pid(), err)
	}
	return f, exe, nil
}

// Alive reports whether the traced process still exists (a zombie has
// exited).
func (tr *Tracker) Alive() bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", tr.pid))
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	return i < 0 || i+2 >= len(b) || (b[i+2] != 'Z' && b[i+2] != 'X')
}

// reasonError prints as its reason alone (one line users can act on) but
// still unwraps to the kernel's error for errors.Is.
type reasonError struct {
	reason error
	cause  error
}

func (e *reasonError) Error() string   { return e.reason.Error() }
func (e *reasonError) Unwrap() []error { return []error{e.reason, e.cause} }

func classifyLoad(err error) error {
	var ve *ebpf.VerifierError
	if errors.As(err, &ve) {
		// The verifier refused the program: a bug here, not the kernel.
		return fmt.Errorf("load program (verifier): %w", err)
	}
	switch {
	case errors.Is(err, unix.EPERM), errors.Is(err, unix.EACCES):
		return &reasonError{ErrBPFDenied, err}
	case errors.Is(err, ebpf.ErrNotSupported), errors.Is(err, unix.ENOSYS), errors.Is(err, unix.EINVAL):
		return fmt.Errorf("%w: load program: %v", ErrNoBPF, err)
	}
	return fmt.Errorf("load program: %w", err)
}

func classifyAttach(err error, pid int, s Site) error {
	where := fmt.Sprintf("attach to %s at offset 0x%x", s.Name, s.Offset)
	switch {
	case errors.Is(err, unix.EPERM), errors.Is(err, unix.EACCES):
		return &reasonError{ErrBPFDenied, err}
	case errors.Is(err, unix.ESRCH):
		return fmt.Errorf("%s: %w", where, target.ExitedError{Pid: pid})
	case errors.Is(err, unix.EINVAL) && s.RefCtrOffset != 0:
		// The kernel logs "ref_ctr_offset mismatch" when a uprobe at the
		// same place exists with another semaphore offset.
		return &reasonError{fmt.Errorf("%w (%s)", ErrProbeBusy, s.Name), err}
	case errors.Is(err, ebpf.ErrNotSupported), errors.Is(err, link.ErrNotSupported):
		return fmt.Errorf("%w: %s: %v", ErrNoUprobes, where, err)
	}
	return fmt.Errorf("%s: %w", where, err)
}

// rubyClassNames resolves klass VALUEs through the Ruby walker.
func (tr *Tracker) rubyClassNames() func(uint64) (string, error) {
	return func(klass uint64) (string, error) {
		if tr.rb == nil {
			return "", fmt.Errorf("locate the Ruby VM: %s", tr.counterNote)
		}
		return tr.rb.ClassName(klass)
	}
}

// names reads C strings and class names from the target, once per
// distinct address.
type names struct {
	t         target.Target
	strs      map[uint64]string
	classes   map[uint64]string
	className func(uint64) (string, error)
}

func newNames(t target.Target, cn func(uint64) (string, error)) *names {
	return &names{t: t, strs: map[uint64]string{}, classes: map[uint64]string{}, className: cn}
}

const maxName = 4096

// cString reads the NUL-terminated string at addr.
func (n *names) cString(addr uint64) (string, error) {
	if s, ok := n.strs[addr]; ok {
		return s, nil
	}
	if addr == 0 {
		return "", nil
	}
	var out []byte
	buf := make([]byte, 256)
	for len(out) < maxName {
		// Never read across a page boundary in one go: the next page
		// may be unmapped.
		chunk := buf
		if room := 4096 - int((addr+uint64(len(out)))%4096); room < len(chunk) {
			chunk = buf[:room]
		}
		if err := n.t.ReadAt(chunk, addr+uint64(len(out))); err != nil {
			return "", fmt.Errorf("read string at 0x%x: %w", addr, err)
		}
		for i, c := range chunk {
			if c == 0 {
				out = append(out, chunk[:i]...)
				s := string(out)
				n.strs[addr] = s
				return s, nil
			}
		}
		out = append(out, chunk...)
	}
	s := string(out)
	n.strs[addr] = s
	return s, nil
}

// class returns a klass VALUE's name.
func (n *names) class(klass uint64) string {
	if s, ok := n.classes[klass]; ok {
		return s
	}
	s := ""
	if klass == 0 {
		s = "(hidden)"
	} else if n.className != nil {
		if name, err := n.className(klass); err == nil && name != "" {
			s = name
		}
	}
	if s == "" {
		s = fmt.Sprintf("(class 0x%x)", klass)
	}
	n.classes[klass] = s
	return s
}

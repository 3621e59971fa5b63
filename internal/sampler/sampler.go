// Package sampler takes stack samples of Ruby processes at a fixed rate.
//
// A Sampler calls a Source (one or more Ruby processes) on an absolute
// schedule (deadline n = start + n*period, moved at random within its
// period, see spread), so that the rate does not drift however long a
// sample takes. A sample taken more
// than one period after its deadline is counted late; ticks that could no
// longer be taken in time are skipped and counted as missed. Failed
// samples are counted by kind (the target exited, an unmapped or
// inconsistent read, permission, other). Samples go to a sink function
// called on the sampler's goroutine, or through a channel (Start).
//
// The Ruby sources (NewRubySource, NewTreeSource) read the kernel state of
// each thread for the on-CPU flag, optionally pause the target for the
// duration of one sample (blocking mode, see target.Pauser), and follow
// child processes.
package sampler

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sort"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rbscope/rbscope/internal/oncpu"
	"github.com/rbscope/rbscope/internal/rtprio"
	"github.com/rbscope/rbscope/internal/ruby"
	"github.com/rbscope/rbscope/internal/stack"
	"github.com/rbscope/rbscope/internal/target"
)

// Source produces one sample per Ruby thread of the process(es) it reads.
// Each sample carries Pid, TID, ThreadName, OnCPU and Time.
type Source interface {
	Sample(ctx context.Context) ([]stack.Sample, error)
}

// SourceFunc adapts a function to Source.
type SourceFunc func(ctx context.Context) ([]stack.Sample, error)

// Sample calls f.
func (f SourceFunc) Sample(ctx context.Context) ([]stack.Sample, error) { return f(ctx) }

// DefaultRate is the sampling rate used when Config.Rate is zero.
const DefaultRate = 100

// MaxRate is the highest sampling rate accepted.
const MaxRate = 20000

// Config says how to sample.
type Config struct {
	// Rate is the number of samples per second (DefaultRate when 0).
	Rate float64
	// Duration stops sampling after this long; 0 samples until the context
	// is cancelled or the target exits.
	Duration time.Duration
	// OnCPUOnly drops samples of threads that were not running on a CPU.
	OnCPUOnly bool
	// Realtime runs rbscope's threads at real-time priority while
	// sampling (see rtprio.Raise): ticks on time at high rates.
	Realtime bool
	// RealtimeClock runs only the sampling goroutine at real-time
	// priority, on an OS thread of its own that waits for each tick itself
	// (see rtprio.RaiseThread); rbscope's other threads stay ordinary. A
	// sampler woken on a CPU busy with a target runs at once instead of at
	// the kernel's next preemption point, often the target's next system
	// call's exit, where the sample would land.
	RealtimeClock bool
	// Mode drops the samples a mode does not keep (stack.Mode.Keeps);
	// "" and wall keep all.
	Mode stack.Mode
	// Progress, when set, is called on the sampler's goroutine about every
	// ProgressEvery with the statistics so far.
	Progress      func(Stats)
	ProgressEvery time.Duration
}

// AsksCPU reports whether the ticks ask the source for on-CPU states
// (Mode cpu, or OnCPUOnly): a RubySource made for such a run watches the
// threads from its creation (RubyOptions.WatchCPU).
func (c Config) AsksCPU() bool { return c.Mode == stack.ModeCPU || c.OnCPUOnly }

// ErrorKind classifies a failed sample.
type ErrorKind int

// Error kinds.
const (
	KindExited     ErrorKind = iota // the target process exited
	KindUnmapped                    // an unmapped or inconsistent read (the stack changed under us)
	KindPermission                  // the kernel refused access
	KindOther                       // anything else
	// KindMovedOn: Mode cpu, a late tick: a thread on a CPU at the
	// deadline was asleep when its stack was read (see errMovedOn).
	KindMovedOn
	numErrorKinds
)

var kindNames = [...]string{"exited", "unmapped/inconsistent", "permission", "other", "moved on since a late deadline"}

func (k ErrorKind) String() string {
	if k < 0 || k >= numErrorKinds {
		return fmt.Sprintf("ErrorKind(%d)", int(k))
	}
	return kindNames[k]
}

// Classify returns the kind of a sampling error.
func Classify(err error) ErrorKind {
	switch {
	case errors.Is(err, target.ErrExited):
		return KindExited
	case errors.Is(err, target.ErrDenied):
		return KindPermission
	case errors.Is(err, target.ErrUnmapped):
		return KindUnmapped
	case movedOnly(err):
		return KindMovedOn
	case errors.Is(err, ruby.ErrInconsistent):
		return KindUnmapped
	}
	return KindOther
}

// ThreadSpan records when a thread was seen.
type ThreadSpan struct {
	Pid, TID    int
	Name        string // the latest name seen
	First, Last time.Time
	Samples     int
	// Unread counts the thread's samples not delivered because its stack
	// could not be read consistently, by the activity it was in (read
	// before the stack, so known): a running thread's stack changes under
	// the reader far more often than one in GC or waiting, and shares
	// by activity that leave these out lean away from running.
	Unread map[stack.Activity]int `json:",omitempty"`
	// Torn counts the thread's samples delivered with a
	// (stack changed while read) frame (nonblocking): its stack kept
	// changing however often it was read, and its inner frames are
	// unknown. GVL counts its samples holding the GVL.
	Torn int `json:",omitempty"`
	GVL  int `json:",omitempty"`
}

// TornShare is the share of the thread's samples (delivered or unread)
// whose stack changed while read (0 to 1).
func (sp *ThreadSpan) TornShare() float64 {
	n := sp.Samples
	for _, u := range sp.Unread {
		n += u
	}
	if n == 0 {
		return 0
	}
	return float64(sp.Torn) / float64(n)
}

// HasTorn reports whether frames hold the marker of a stack that changed
// while read (stack.KindTorn).
func HasTorn(frames []stack.Frame) bool {
	for i := range frames {
		if frames[i].Kind == stack.KindTorn {
			return true
		}
		if !frames[i].IsPseudo() {
			return false
		}
	}
	return false
}

type threadKey struct{ pid, tid int }

// Stats are a sampling run's counts.
type Stats struct {
	Start, End time.Time
	Rate       float64
	Ticks      int // ticks on which the source was called
	Samples    int // thread samples delivered (after filtering)
	Filtered   int // thread samples dropped by OnCPUOnly or Mode
	Late       int // ticks sampled more than one period after their deadline
	Missed     int // ticks skipped because the sampler was behind
	Errors     [numErrorKinds]int
	// LastError is the most recent sampling error.
	LastError error
	// Exited is set when sampling stopped because the target exited (that
	// last tick is not counted in Errors).
	Exited bool
	// CPUError, in Mode cpu, is why some threads could not be told on a
	// CPU from waiting for one (see RubySource): their samples fall back
	// to the kernel's run state, which counts a thread waiting for a CPU
	// as on one.
	CPUError error
	// SampleTime is the total time spent in Source.Sample.
	SampleTime time.Duration
	// CPU is the CPU time (user and system, every thread of this process)
	// used from the first tick to the end: what sampling costs, without
	// what came before (opening the target) or after (rendering).
	CPU time.Duration
	// Threads lists every thread seen, ordered by first sample.
	Threads []ThreadSpan
}

// ErrorCount is the number of failed ticks of all kinds.
func (s Stats) ErrorCount() int {
	n := 0
	for _, c := range s.Errors {
		n += c
	}
	return n
}

// LateFraction is the share of ticks that were late or missed.
func (s Stats) LateFraction() float64 {
	total := s.Ticks + s.Missed
	if total == 0 {
		return 0
	}
	return float64(s.Late+s.Missed) / float64(total)
}

// ErrorSummary describes the errors by kind ("3 exited, 1 other"), or
// "none".
func (s Stats) ErrorSummary() string {
	out := ""
	for k, c := range s.Errors {
		if c == 0 {
			continue
		}
		if out != "" {
			out += ", "
		}
		out += fmt.Sprintf("%d %s", c, ErrorKind(k))
	}
	if out == "" {
		return "none"
	}
	return out
}

// Run samples src according to cfg, calling sink with each tick's samples
// (the slice is only valid during the call), until cfg.Duration has
// passed, ctx is cancelled or the target exits. It returns the statistics;
// the error is non-nil only for an invalid configuration, or when
// cfg.Realtime cannot be had.
func Run(ctx context.Context, src Source, cfg Config, sink func([]stack.Sample)) (Stats, error) {
	if cfg.Realtime {
		restore, err := rtprio.Raise()
		if err != nil {
			return Stats{}, err
		}
		defer restore()
	}
	if cfg.RealtimeClock {
		// A timerfd read in Go's poller is noticed by whichever ordinary
		// thread polls: the raised thread must wait on the timer itself.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		restore, err := rtprio.RaiseThread()
		if err != nil {
			return Stats{}, err
		}
		defer restore()
		return run(ctx, src, cfg, sink, threadClock{announced: true}, spread)
	}
	t, err := newTickTimer(ctx)
	if err != nil {
		// No timerfd (never seen on Linux since 2.6.25): sleep the
		// thread instead.
		return run(ctx, src, cfg, sink, threadClock{}, spread)
	}
	defer t.Close()
	return run(ctx, src, cfg, sink, t, spread)
}

// spread is how far Run moves each deadline at random, as a share of the
// period (half of it either way); deadlines stay anchored to the start,
// so the moves never accumulate. Evenly spaced deadlines fall in step
// with what the sampler's own work does to the target on a shared CPU: a
// sample in blocking mode stops a thread that was on a CPU at its
// deadline, which hands that CPU to another task for a while, and the
// scheduler's slices then follow the ticks. In TestModeCPU a thread
// sharing a CPU with a hog was on it at 6 % of the deadlines for 17 % of
// its time; in TestRecordProportions under a CPU hog per core, a method
// with 6-8 % of the wall time got 2.7-13 % of the samples, bimodal (6.5-9.5
// % with the deadlines spread). Deadlines spread over a whole period are
// not in step with anything.
const spread = 1.0

// tick is what Run tells a source about the tick it samples, through
// the context given to Sample (tickOf finds it). One is made per run and
// updated at each tick: a source must not keep it.
type tick struct {
	context.Context
	// deadline is the instant the sample stands for: when the tick was
	// due, which on a busy machine is well before the sampler got a CPU.
	deadline time.Time
	// cpu asks for on-CPU states (Sample.OnCPU) as the kernel's scheduler
	// accounts them (Mode cpu).
	cpu bool
	// cpuErr is set by a source that could not have them for some
	// threads.
	cpuErr error
}

type tickKey struct{}

// Value returns the tick itself for tickKey, else ctx's values.
func (t *tick) Value(key any) any {
	if key == (tickKey{}) {
		return t
	}
	return t.Context.Value(key)
}

// tickOf returns the tick a context given to Sample stands for; nil when
// Run did not make it (a source called directly).
func tickOf(ctx context.Context) *tick {
	t, _ := ctx.Value(tickKey{}).(*tick)
	return t
}

// clock is time as the sampler sees it; tests substitute a virtual one.
type clock interface {
	Now() time.Time
	// SleepUntil waits for deadline or ctx (returning ctx's error).
	SleepUntil(ctx context.Context, deadline time.Time) error
}

// run is Run on clock clk, each deadline moved at random by up to
// jitter*period/2 either way (0: evenly spaced, for tests that count
// ticks exactly).
func run(ctx context.Context, src Source, cfg Config, sink func([]stack.Sample), clk clock, jitter float64) (Stats, error) {
	rate, period, progressEvery, err := schedule(cfg)
	if err != nil {
		return Stats{}, err
	}

	st := Stats{Rate: rate}
	counts := runCounts{st: &st, spans: make(map[threadKey]int)}
	cpu0, _ := SelfCPU()
	start := clk.Now()
	st.Start = start
	var end time.Time
	if cfg.Duration > 0 {
		end = start.Add(cfg.Duration)
	}
	nextProgress := start.Add(progressEvery)
	var kept []stack.Sample
	tk := &tick{Context: ctx, cpu: cfg.AsksCPU()}

	for n := int64(0); ; n++ {
		deadline := start.Add(time.Duration(n) * period)
		if !end.IsZero() && !deadline.Before(end) {
			break
		}
		if jitter > 0 && n > 0 {
			j := (rand.Float64() - 0.5) * jitter * float64(period)
			deadline = deadline.Add(time.Duration(j))
		}
		if err := clk.SleepUntil(ctx, deadline); err != nil {
			if ctx.Err() == nil {
				st.LastError = err
			}
			break
		}
		t0 := clk.Now()
		tk.deadline = deadline
		samples, err := src.Sample(tk)
		now := clk.Now()
		if tk.cpuErr != nil && st.CPUError == nil {
			st.CPUError = tk.cpuErr
		}
		st.Ticks++
		st.SampleTime += now.Sub(t0)
		if t0.Sub(deadline) > period {
			st.Late++
		}
		if err != nil {
			if ctx.Err() != nil {
				st.Ticks--
				break
			}
			k := Classify(err)
			if k == KindExited {
				// The end of the target ends sampling; it is not a
				// failed sample.
				st.Exited = true
				break
			}
			st.Errors[k]++
			st.LastError = err
			counts.unread(err, now)
		}
		if len(samples) > 0 {
			kept = counts.keep(cfg, samples, kept[:0])
			st.Samples += len(kept)
			if len(kept) > 0 && sink != nil {
				sink(kept)
			}
		}
		// Skip the ticks whose sample would already be late.
		now = clk.Now()
		skip := ticksBehind(now, start, end, period, n)
		st.Missed += int(skip)
		n += skip
		if cfg.Progress != nil && !now.Before(nextProgress) {
			st.End = now
			cfg.Progress(st)
			nextProgress = now.Add(progressEvery)
		}
	}
	st.End = clk.Now()
	if cpu, ok := SelfCPU(); ok {
		st.CPU = cpu - cpu0
	}
	sort.SliceStable(st.Threads, func(i, j int) bool { return st.Threads[i].First.Before(st.Threads[j].First) })
	return st, nil
}

// schedule returns cfg's rate (DefaultRate for 0), the period between
// ticks at that rate, and how often Progress is called, or an error for a
// rate out of range.
func schedule(cfg Config) (rate float64, period, progressEvery time.Duration, err error) {
	rate = cfg.Rate
	if rate == 0 {
		rate = DefaultRate
	}
	if rate < 0 || rate > MaxRate {
		return 0, 0, 0, fmt.Errorf("rate %g Hz is outside 0..%d", rate, MaxRate)
	}
	period = time.Duration(float64(time.Second) / rate)
	if period <= 0 {
		period = 1
	}
	progressEvery = cfg.ProgressEvery
	if progressEvery <= 0 {
		progressEvery = 250 * time.Millisecond
	}
	return rate, period, progressEvery, nil
}

// runCounts counts a run's samples into st: the filtered ones, and per
// thread in st.Threads, indexed by spans.
type runCounts struct {
	st    *Stats
	spans map[threadKey]int // index into st.Threads
}

// span returns thread (pid, tid)'s entry in st.Threads, added (named
// name, first and last seen at t) the first time.
func (c *runCounts) span(pid, tid int, name string, t time.Time) *ThreadSpan {
	key := threadKey{pid, tid}
	idx, ok := c.spans[key]
	if !ok {
		idx = len(c.st.Threads)
		c.spans[key] = idx
		c.st.Threads = append(c.st.Threads, ThreadSpan{Pid: pid, TID: tid, Name: name, First: t, Last: t})
	}
	return &c.st.Threads[idx]
}

// unread counts, by activity, the samples of the threads whose stack a
// tick that failed with err (at now) could not read.
func (c *runCounts) unread(err error, now time.Time) {
	te := unreadThreads(err)
	if te == nil {
		return
	}
	for _, th := range te.Threads {
		if th.TID == 0 || th.Activity == "" {
			continue
		}
		sp := c.span(te.Pid, th.TID, th.Name, now)
		if sp.Unread == nil {
			sp.Unread = map[stack.Activity]int{}
		}
		sp.Unread[th.Activity]++
	}
}

// keep appends to kept the samples that cfg keeps (OnCPUOnly, Mode),
// counting the others filtered and each kept one in its thread's span,
// and returns kept.
func (c *runCounts) keep(cfg Config, samples, kept []stack.Sample) []stack.Sample {
	for i := range samples {
		s := &samples[i]
		if (cfg.OnCPUOnly && !s.OnCPU) || !cfg.Mode.Keeps(s) {
			c.st.Filtered++
			continue
		}
		kept = append(kept, *s)
		sp := c.span(s.Pid, s.TID, s.ThreadName, s.Time)
		sp.Last = s.Time
		sp.Samples++
		if s.GVL {
			sp.GVL++
		}
		if HasTorn(s.Frames) {
			sp.Torn++
		}
		if s.ThreadName != "" {
			sp.Name = s.ThreadName
		}
	}
	return kept
}

// ticksBehind is how many ticks after tick n a run that started at start
// and ends at end (zero: no end) skips at now, when their samples would
// already be late; ticks past the end are not counted.
func ticksBehind(now, start, end time.Time, period time.Duration, n int64) int64 {
	behind := now.Sub(start.Add(time.Duration(n+1) * period))
	if behind <= period {
		return 0
	}
	skip := int64(behind / period)
	if !end.IsZero() {
		// Do not count ticks past the end as missed.
		if left := int64((end.Sub(start)+period-1)/period) - (n + 1); skip > left {
			skip = max(left, 0)
		}
	}
	return skip
}

// threadClock sleeps the calling goroutine's thread, in steps of at most
// maxSleep to notice a cancelled context: where there is no timerfd, and
// for Config.RealtimeClock.
type threadClock struct {
	// announced makes each absolute-deadline clock_nanosleep a system call
	// the runtime knows of: its processor may serve other goroutines
	// meanwhile, and a stop of the world need not wait for the sleep to
	// end. Otherwise it is a raw one, so that the runtime's monitor is not
	// woken (see tickTimer).
	announced bool
}

func (threadClock) Now() time.Time { return time.Now() }

func (c threadClock) SleepUntil(ctx context.Context, deadline time.Time) error {
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		d := time.Until(deadline)
		if d <= 0 {
			return nil
		}
		// CLOCK_MONOTONIC through Go's clock: no system call (see
		// oncpu.Now).
		step := min(d, maxSleep)
		at := unix.NsecToTimespec(oncpu.Now() + int64(step))
		for {
			var e unix.Errno
			if c.announced {
				_, _, e = unix.Syscall6(unix.SYS_CLOCK_NANOSLEEP, unix.CLOCK_MONOTONIC, unix.TIMER_ABSTIME,
					uintptr(unsafe.Pointer(&at)), 0, 0, 0)
			} else {
				_, _, e = unix.RawSyscall6(unix.SYS_CLOCK_NANOSLEEP, unix.CLOCK_MONOTONIC, unix.TIMER_ABSTIME,
					uintptr(unsafe.Pointer(&at)), 0, 0, 0)
			}
			if e != unix.EINTR {
				break
			}
		}
		if step == d {
			return ctx.Err()
		}
	}
}

// SelfCPU is this process's CPU time so far (user and system, all
// threads), from getrusage.
func SelfCPU() (time.Duration, bool) {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}

// maxSleep bounds one uninterruptible sleep, so that a cancelled context
// is noticed within it even at low rates.
const maxSleep = 100 * time.Millisecond

// Batch is one tick's samples, sent by a Sampler started with Start.
type Batch struct {
	Samples []stack.Sample
}

// Sampler runs Run on its own goroutine and sends each tick's samples on
// a channel, like py-spy's Sampler.
type Sampler struct {
	ch    chan Batch
	done  chan struct{}
	stats Stats
	err   error
}

// Start starts sampling src on a new goroutine. Read the batches from
// Samples until it is closed, then call Wait for the statistics. The
// channel is buffered; if the reader falls behind by more than the buffer
// the sampler waits for it (and counts the resulting late ticks).
func Start(ctx context.Context, src Source, cfg Config) *Sampler {
	s := &Sampler{ch: make(chan Batch, 1024), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		defer close(s.ch)
		s.stats, s.err = Run(ctx, src, cfg, func(b []stack.Sample) {
			cp := make([]stack.Sample, len(b))
			copy(cp, b)
			select {
			case s.ch <- Batch{Samples: cp}:
			case <-ctx.Done():
			}
		})
	}()
	return s
}

// Samples is the channel of batches; it is closed when sampling stops.
func (s *Sampler) Samples() <-chan Batch { return s.ch }

// Wait waits for sampling to stop and returns its statistics.
func (s *Sampler) Wait() (Stats, error) {
	<-s.done
	return s.stats, s.err
}

package sampler

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/rbscope/rbscope/internal/oncpu"
	"github.com/rbscope/rbscope/internal/procfs"
	"github.com/rbscope/rbscope/internal/ruby"
	"github.com/rbscope/rbscope/internal/stack"
)

// Pauser stops a process for the duration of one sample; *target.Pauser
// implements it.
type Pauser interface {
	Pause(pid int) (resume func() error, err error)
}

// ThreadPauser stops only some threads of a process for one sample;
// *target.Pauser implements it.
type ThreadPauser interface {
	PauseThreads(pid int, tids []int) (resume func() error, err error)
}

// SleepReader tells, while a pause of it holds thread tid stopped,
// whether the thread was asleep in a system call when stopped;
// *target.Pauser implements it (see target.Pauser.InterruptedSleep).
type SleepReader interface {
	InterruptedSleep(tid int) (asleep bool, err error)
}

// RubyOptions tunes a RubySource.
type RubyOptions struct {
	// Pauser, when set, stops the process while its stacks are read
	// (blocking mode: consistent stacks, a short pause of the target per
	// sample). Nil reads the running process (nonblocking mode). When it
	// is also a ThreadPauser, only the thread holding the GVL is stopped,
	// or the threads that run Ruby when none holds it (see snapshot).
	Pauser Pauser
	// NoGC leaves out the GC pseudo-frames (the samples keep activity gc).
	NoGC bool
	// WatchCPU says the ticks will ask for on-CPU states (Mode cpu): the
	// process's threads' context switches are watched from the source's
	// creation, so that the records reach back to every tick's deadline,
	// the first ones' included. Watched from the first tick only, a tick
	// whose deadline came before the first one's end (a late first tick,
	// on a busy machine) had no records and fell back on /proc, where the
	// threads the first tick's pause woke from their sleep were still
	// runnable: every sleeping thread was counted on a CPU once.
	WatchCPU bool
}

// RubySource samples every Ruby thread of one process.
type RubySource struct {
	p      *ruby.Process
	pid    int
	pauser Pauser
	states *taskStates
	noGC   bool
	out    []stack.Sample
	// rubyTIDs are the Ruby threads of the last sample, the ones a
	// ThreadPauser stops when it cannot stop only the GVL's holder
	// (empty: stop every thread).
	rubyTIDs, spareTIDs []int
	// holder is the thread that held the GVL in the last sample (0: none
	// or not known), the one thread a ThreadPauser stops.
	holder    int
	holderTID [1]int // the threads to stop: holder (no allocation per tick)
	// sampledTIDs are the threads of a sample and needState says whose
	// kernel state is read from /proc (see Sample).
	sampledTIDs []int
	needState   []bool
	// stopStates are the kernel states of a blocking sample's threads
	// ('R' or 'S') taken from their stop, per thread of the snapshot (0:
	// not taken; see stoppedStates).
	stopStates []byte
	// cpu watches the threads' context switches in Mode cpu (nil before
	// the first tick that asks); cpuAt is the instant this tick stands
	// for (its deadline, CLOCK_MONOTONIC), 0 when the tick does not ask;
	// cpuStates are the threads' states then, per thread of the snapshot.
	cpu       *oncpu.Threads
	cpuAt     int64
	cpuStates []oncpu.State
	// letters are the kernel state letters the records give, per thread
	// of the snapshot (0: none; see cpuLetter): at the deadline in Mode
	// cpu, just after the read in nonblocking Mode wall.
	letters []byte
	// pausedAt is when this tick's pause began (CLOCK_MONOTONIC, 0: no
	// pause), of threads pausedTIDs (nil: every thread): a thread that a
	// pause stopped while it waited for a CPU is switched in to stop.
	pausedAt   int64
	pausedTIDs []int
	// readAt is when this tick's snapshot ended (CLOCK_MONOTONIC, 0:
	// not yet): a thread not paused was read by then.
	readAt int64
	// holderMisses counts the pauses of the GVL's holder that found it
	// no longer held (ruby.HolderError), by reason, holder tids left
	// out: each one costs the tick another pause (diagnostics).
	holderMisses map[string]int
	// yielded names the stacks of threads taken as running where they
	// yielded the GVL (their stack without the wait's frame).
	yielded stack.Derived
}

// NewRubySource samples the Ruby process p.
func NewRubySource(p *ruby.Process, opts RubyOptions) *RubySource {
	pid := p.Target().Pid()
	s := &RubySource{p: p, pid: pid, pauser: opts.Pauser, noGC: opts.NoGC, states: newTaskStates(pid)}
	if opts.WatchCPU {
		// Every thread for now: which are Ruby's is known after the first
		// tick, which stops watching the others. A refusal is the first
		// tick's cpuErr.
		s.cpu = oncpu.New(pid)
		if tids, err := procfs.Tasks(pid); err == nil {
			_ = s.cpu.Watch(tids)
		}
	}
	return s
}

// Process is the Ruby process sampled.
func (s *RubySource) Process() *ruby.Process { return s.p }

// OnCPU reports whether a thread the last tick read is on a CPU now, by
// its context-switch records (false where they do not tell: no tick yet,
// or none watched). A thread on a CPU goes on running while a clock of
// many processes reads the others: it reads these first (see the agent).
func (s *RubySource) OnCPU() bool {
	if s.cpu == nil {
		return false
	}
	now := oncpu.Now()
	for _, tid := range s.sampledTIDs {
		if st, _ := s.cpu.At(tid, now, now); st == oncpu.Running {
			return true
		}
	}
	return false
}

// Sample takes one sample of every Ruby thread. The returned slice is
// reused by the next call.
//
// A thread's kernel state (for OnCPU) is read only when Ruby's own state
// does not already say it (needsKernelState): not for a thread waiting
// for the GVL, which in a process of many threads is most of them, nor
// for the one running Ruby code. The states are read after the walk: of
// a thread that a blocking sample stopped, from its stop (stoppedStates;
// a stopped thread's /proc state is "traced"), of the others from /proc.
// A thread whose state was not read is on a CPU when it runs Ruby (holds
// the GVL).
//
// When the tick asks for on-CPU states (Mode cpu, see Run), they come
// instead from the kernel's context-switch records (oncpu): a thread is
// on a CPU when it was running at the tick's deadline, not merely
// runnable, which the kernel's state 'R' also covers (a thread that holds
// the GVL while the kernel has it wait for a CPU is not on one). The
// records cost no system call per tick, and take the place of the /proc
// reads and of the stopped thread's state; /proc and the old rule are
// used for a thread whose records do not reach back to the deadline (its
// first sample: threads are watched from the tick that finds them) or
// that cannot be watched (the tick's cpuErr says why).
//
// Nonblocking ticks of Mode wall watch the context switches too: the
// state just after the read comes from them instead of /proc, where they
// reach back to it. In either mode, a thread they show off every CPU
// since its frames were last read is not read again (ruby.OffCPUWatch).
func (s *RubySource) Sample(ctx context.Context) ([]stack.Sample, error) {
	now := time.Now()
	tk := tickOf(ctx)
	wallWatch := s.startTick(tk)
	threads, err := s.snapshot()
	if s.cpuAt != 0 {
		s.readAt = oncpu.Now()
	}
	if err != nil {
		return s.offCPUError(now, err)
	}
	wallAt := int64(0)
	if wallWatch {
		wallAt = oncpu.Now()
	}
	if len(s.stopStates) != len(threads) {
		s.stopStates = append(s.stopStates[:0], make([]byte, len(threads))...)
	}
	s.cpuStates, s.letters = s.cpuStates[:0], s.letters[:0]
	s.sampledTIDs, s.needState = s.sampledTIDs[:0], s.needState[:0]
	for i := range threads {
		th := &threads[i]
		cs := s.tickCPUState(th)
		s.cpuStates = append(s.cpuStates, cs)
		letter := cpuLetter(cs)
		if letter == 0 && wallAt != 0 && th.TID != 0 {
			// The kernel state just after the read, as /proc would say.
			st, _ := s.cpu.At(th.TID, wallAt, math.MaxInt64)
			letter = cpuLetter(st)
		}
		s.letters = append(s.letters, letter)
		if th.TID != 0 {
			s.sampledTIDs = append(s.sampledTIDs, th.TID)
			s.needState = append(s.needState, s.stopStates[i] == 0 && letter == 0 && needsKernelState(th))
		}
	}
	s.states.read(s.sampledTIDs, s.needState)
	s.watchSampled(tk, wallWatch)
	s.out = s.out[:0]
	// A thread that changed under the walker (created, ending, or read
	// without pausing): its partial stack would distort the profile, so
	// it is counted as an error instead.
	failed := threadErrors(s.pid, threads)
	for i := range threads {
		th := &threads[i]
		if cs := s.cpuStates[i]; th.Error != "" && cs.Known() && cs != oncpu.Running && cs != movedOn {
			// Off a CPU at the deadline, so dropped by Mode cpu (Run
			// counts it filtered) whatever its stack: not an error.
			s.out = append(s.out, stack.Sample{Time: now, Pid: s.pid, TID: th.TID, ThreadID: th.ThreadID, ThreadName: th.Name, Activity: th.Activity, GVL: th.GVL})
			continue
		}
		if th.Error != "" {
			continue
		}
		s.out = append(s.out, s.threadSample(now, i, th))
	}
	if failed != nil {
		return s.out, failed
	}
	return s.out, nil
}

// startTick prepares the source for tick tk (nil: not run by Run): the
// instant the tick stands for when it asks for on-CPU states, the
// context-switch watch, the per-tick state of the last tick cleared, and
// which threads the walker may skip as not run since their last read. It
// returns whether this nonblocking tick of Mode wall watches the context
// switches (see Sample).
func (s *RubySource) startTick(tk *tick) (wallWatch bool) {
	s.cpuAt = 0
	if tk != nil && tk.cpu {
		if s.cpu == nil {
			s.cpu = oncpu.New(s.pid)
		}
		s.cpuAt = oncpu.Mono(tk.deadline)
	}
	// Nonblocking ticks watch the threads' context switches in Mode wall
	// too (wallWatch): not for the on-CPU state at the deadline, but to
	// skip reading the frames of threads that have not run since they
	// were last read, and for the kernel state after the read in place of
	// /proc. Where the kernel refuses, /proc and every read stay.
	wallWatch = tk != nil && !tk.cpu && s.pauser == nil
	if wallWatch && s.cpu == nil {
		s.cpu = oncpu.New(s.pid)
	}
	s.stopStates = s.stopStates[:0]
	s.pausedAt, s.pausedTIDs, s.readAt = 0, nil, 0
	if s.cpu != nil && s.pauser == nil && (s.cpuAt != 0 || wallWatch) {
		// The records also say which threads have not run since their
		// frames were last read: those are not read again.
		s.p.SetOffCPUWatch(offCPUWatch{s.cpu})
	} else {
		s.p.SetOffCPUWatch(nil)
	}
	return wallWatch
}

// tickCPUState is th's state at this tick's deadline (cpuState), or
// movedOn for a thread running then whose stack, read later, is no longer
// where it ran (th.Error then says so). A thread running at the deadline
// that has since yielded the GVL where it ran is taken as running there:
// th loses its "(waiting for GVL)" frame.
func (s *RubySource) tickCPUState(th *stack.Thread) oncpu.State {
	cs := s.cpuState(th.TID)
	if cs == oncpu.Running {
		switch since := s.since(th.TID); {
		case since == oncpu.Stayed:
		case since == oncpu.Resumed && th.Activity != stack.ActivityGVLWait:
			// Switched out (preempted, or asleep a while) and in
			// again, and on a CPU or preempted on one when the read
			// ended: its stack is where it ran then, a little later
			// than the deadline, as that of a thread that stayed
			// on a CPU is. Dropping these (as moved on) lost the
			// samples of threads cut short on a CPU, which share it
			// or hand the GVL on: a quarter of a cpu profile under
			// load, and more of the methods that switch the most.
		case since == oncpu.Slept && th.Activity == stack.ActivityGVLWait && yielded(th.Frames):
			// On a CPU at the deadline, it has since given the GVL
			// up (a late tick: the thread it waits for took it) and
			// waits where it was running, as it was then: a holder
			// yields the GVL at the interrupt check between two
			// instructions of Ruby code. Dropping these samples (as
			// waiting for the GVL) left the cpu profile of a thread
			// that shares the GVL 15-55 % short under load.
			th.Activity = stack.ActivityRunning
			th.Frames, th.Stack = th.Frames[1:], s.yielded.Of(th.Stack)
		case th.Activity != stack.ActivityGVLWait:
			// Switched in again (it may have run anywhere since),
			// or gone to sleep where it is read (Thread::Queue#pop,
			// a read: not where it ran). (A thread waiting for the
			// GVL now, switched in since, is dropped by Mode cpu
			// whatever its stack.)
			cs = movedOn
			if th.Error == "" {
				th.Error = errMovedOn
			}
		}
	}
	return cs
}

// watchSampled watches the context switches of this tick's threads
// (sampledTIDs) when the tick uses them: in Mode cpu a refusal is the
// tick's cpuErr; in nonblocking Mode wall it leaves /proc and every
// read, as without.
func (s *RubySource) watchSampled(tk *tick, wallWatch bool) {
	if s.cpuAt != 0 {
		err := s.cpu.Watch(s.sampledTIDs)
		if err == nil {
			err = s.cpu.Err() // a refusal when the source was made
		}
		if err != nil && tk.cpuErr == nil {
			tk.cpuErr = err
		}
	} else if wallWatch {
		_ = s.cpu.Watch(s.sampledTIDs) // refused: /proc and every read, as without
	}
}

// threadSample is the sample of th, the i-th thread of this tick's
// snapshot, read without error: its kernel state (from its stop, the
// context-switch records or /proc, in that order) completes an unknown
// activity and says whether it was on a CPU, which the records at the
// deadline decide where they tell.
func (s *RubySource) threadSample(now time.Time, i int, th *stack.Thread) stack.Sample {
	cs := s.cpuStates[i]
	kstate := s.stopStates[i]
	if kstate == 0 {
		kstate = s.letters[i]
	}
	if kstate == 0 {
		kstate = s.states.state(th.TID)
	}
	ruby.KernelActivity(th, kstate)
	onCPU := kstate == 'R'
	switch {
	case cs == movedOn:
		onCPU = true
	case cs.Known():
		onCPU = cs == oncpu.Running
	case kstate == 0:
		onCPU = th.Activity == stack.ActivityRunning || th.Activity == stack.ActivityGC
	}
	sm := stack.Sample{
		Time:       now,
		Pid:        s.pid,
		TID:        th.TID,
		ThreadID:   th.ThreadID,
		ThreadName: th.DisplayName(),
		OnCPU:      onCPU,
		Activity:   th.Activity,
		GVL:        th.GVL,
		Frames:     th.Frames,
		Stack:      th.Stack,
	}
	if s.noGC {
		sm.DropGC()
	}
	return sm
}

// offCPUError returns a failed snapshot's error, unless (Mode cpu) it is
// a process's only thread, whose stack could not be read, that was off a
// CPU at the deadline: Mode cpu drops its sample whatever its stack, so
// the tick is that dropped sample (Run counts it filtered), not an error.
func (s *RubySource) offCPUError(now time.Time, err error) ([]stack.Sample, error) {
	var se *ruby.StackError
	if s.cpuAt == 0 || !errors.As(err, &se) || se.TID == 0 {
		return nil, err
	}
	if cs := s.cpuState(se.TID); !cs.Known() || cs == oncpu.Running {
		return nil, err
	}
	s.out = append(s.out[:0], stack.Sample{Time: now, Pid: s.pid, TID: se.TID, ThreadID: se.Addr, ThreadName: se.Name, Activity: stack.Activity(se.Activity)})
	return s.out, nil
}

// cpuState is thread tid's state at this tick's deadline from its
// context-switch records (Unknown when the tick does not ask, or they
// cannot tell).
func (s *RubySource) cpuState(tid int) oncpu.State {
	if s.cpuAt == 0 || tid == 0 {
		return oncpu.Unknown
	}
	st, _ := s.cpu.At(tid, s.cpuAt, math.MaxInt64)
	return st
}

// movedOn marks a thread running at the deadline whose stack, read later,
// is from a later stretch on a CPU (see movedOn).
const movedOn = oncpu.State(255)

// yielded reports whether frames (innermost first) are those of a thread
// that waits for the GVL where it gave it up: "(waiting for GVL)" on a
// Ruby frame. One waiting on a C function (Kernel#sleep, IO#read,
// Thread::Queue#pop) is taking the GVL back after a blocking region: on
// a CPU at the deadline, it was waking up, not running Ruby code (the
// sleeping thread of TestAgentPyroscope showed in its cpu profile).
func yielded(frames []stack.Frame) bool {
	return len(frames) > 1 && frames[0].Kind == stack.KindGVL && frames[1].Kind == stack.KindRuby
}

// movedOn reports whether thread tid went to sleep after this tick's
// deadline and before its stack was read, or was switched onto a CPU
// again and was asleep by then (see since): its stack is then not one it
// ran at.
func (s *RubySource) movedOn(tid int) bool {
	since := s.since(tid)
	return since != oncpu.Stayed && since != oncpu.Resumed
}

// since says what thread tid did after this tick's deadline and before
// its stack was read (see oncpu.Threads.At): before this tick's pause
// for a thread it stopped (stopping a thread that waits for a CPU
// switches it in, where it stops at once), else by the end of the
// snapshot (up to now before it ends). One that went to sleep is read
// where it sleeps: a late tick kept a thread running at the deadline as
// on a CPU in Thread::Queue#pop.
func (s *RubySource) since(tid int) oncpu.Since {
	until := int64(math.MaxInt64)
	if s.readAt != 0 {
		until = s.readAt
	}
	if s.pausedAt != 0 && (s.pausedTIDs == nil || slices.Contains(s.pausedTIDs, tid)) {
		until = s.pausedAt
	}
	_, since := s.cpu.At(tid, s.cpuAt, until)
	return since
}

// cpuLetter is the kernel state letter a context-switch state gives: 'R'
// on a CPU or runnable, 'S' asleep (or stopped), 0 when it does not say.
func cpuLetter(cs oncpu.State) byte {
	switch cs {
	case oncpu.Running, oncpu.Runnable, movedOn:
		return 'R'
	case oncpu.Asleep:
		return 'S'
	}
	return 0
}

// needsKernelState says whether th's kernel state tells anything Ruby's
// own state does not. Not for a thread waiting for the GVL (it sleeps on
// the lock's condition variable), nor for one running Ruby code: holding
// the GVL with a Ruby frame innermost, it executes the VM's instructions,
// which sleep in the kernel only for a page fault or a lock taken inside
// one instruction, so it is on a CPU (or runnable, which the kernel calls
// 'R' too). The state is read for a holder in a C function (a C
// extension that blocks without releasing the GVL) or in GC, and for a
// thread Ruby says is blocked, which may run native code outside the GVL.
func needsKernelState(th *stack.Thread) bool {
	switch {
	case th.Error != "" || th.Activity == stack.ActivityGVLWait:
		return false
	case th.Activity == stack.ActivityRunning && len(th.Frames) > 0 && th.Frames[0].Kind == stack.KindRuby:
		return false
	}
	return true
}

// errMovedOn is the error of a thread that was on a CPU at a late tick's
// deadline but asleep when its stack was read (gone to sleep, or switched in
// again and back to sleep).
const errMovedOn = "on a CPU at the tick's deadline, but asleep when its stack was read (gone to sleep, or switched in again and back to sleep): its stack then is not where it ran (a late tick)"

// movedOnly reports whether err is a ThreadErrors whose every thread
// moved on since a late tick's deadline (see errMovedOn).
func movedOnly(err error) bool {
	var te *ThreadErrors
	if !errors.As(err, &te) || len(te.Threads) == 0 {
		return false
	}
	for _, th := range te.Threads {
		if th.Err != errMovedOn {
			return false
		}
	}
	return true
}

// ThreadError is one thread whose stack could not be read in a sample.
type ThreadError struct {
	TID  int
	Name string
	Err  string
	// Activity is what the thread was doing, read before its stack
	// (from the GVL and GC state): known even when the stack is not.
	Activity stack.Activity
}

// ThreadErrors is returned with the other threads' samples when some
// threads of a sample could not be read. It counts as an inconsistent
// read (KindUnmapped).
type ThreadErrors struct {
	Pid     int
	Threads []ThreadError
}

func (e *ThreadErrors) Error() string {
	if len(e.Threads) == 1 {
		t := e.Threads[0]
		return fmt.Sprintf("process %d thread %d (%s): %s", e.Pid, t.TID, t.Name, t.Err)
	}
	return fmt.Sprintf("process %d: %d threads could not be read, first %d: %s", e.Pid, len(e.Threads), e.Threads[0].TID, e.Threads[0].Err)
}

// Is matches ruby.ErrInconsistent: the threads' reads raced with the
// target.
func (e *ThreadErrors) Is(target error) bool { return target == ruby.ErrInconsistent }

// unreadThreads returns the threads a failed sample could not read, with
// their activities where known: those of a ThreadErrors, or the one
// thread of a process whose snapshot failed on it (nil otherwise).
func unreadThreads(err error) *ThreadErrors {
	var te *ThreadErrors
	if errors.As(err, &te) {
		return te
	}
	var se *ruby.StackError
	if errors.As(err, &se) {
		return &ThreadErrors{Pid: se.Pid, Threads: []ThreadError{{TID: se.TID, Name: se.Name, Err: se.Err.Error(), Activity: stack.Activity(se.Activity)}}}
	}
	return nil
}

// snapshot reads every thread's stack, pausing the process around it in
// blocking mode. With a ThreadPauser, only the thread that held the GVL in
// the last sample is stopped when it still holds it: only the holder runs
// Ruby code, so no other thread's frames can change meanwhile (see
// ruby.HolderStopped). When the GVL has moved on, its new
// holder is stopped instead, once; when no thread holds it (every thread
// waits on IO, say: any of them may take it) or that cannot be told, the
// threads that ran Ruby in the last sample are stopped (a Ruby thread
// found running is then paused with the others and read again), or
// every thread. The process is resumed however the walk ends (a panic
// included).
func (s *RubySource) snapshot() (threads []stack.Thread, err error) {
	// Stacks of a paused target are read once; of a running one, read
	// twice and compared (torn reads are detected, never emitted).
	if s.pauser == nil {
		return s.p.SnapshotWith(ruby.Req{Consistency: ruby.Running})
	}
	tp, onlyRuby := s.pauser.(ThreadPauser)
	if onlyRuby && s.holderOffCPU() {
		// Mode cpu drops the sample of a thread that was not on a CPU at
		// the deadline: its stack need not hold still. Read without a
		// pause (stacks checked as in nonblocking mode), unless a GVL
		// holder turns out to have been running then.
		threads, err = s.p.SnapshotWith(ruby.Req{Consistency: ruby.Running})
		if err == nil && !s.holderRan(threads) {
			s.noteThreads(threads)
			return threads, nil
		}
	}
	if onlyRuby && s.p.HolderKnown() {
		for holder, tries := s.holder, 0; holder != 0 && tries < 2; tries++ {
			s.holderTID[0] = holder
			threads, err = s.pausedSnapshot(tp, s.holderTID[:], holder)
			if err == nil {
				s.noteThreads(threads)
				return threads, nil
			}
			var he *ruby.HolderError
			if !errors.As(err, &he) {
				return threads, err
			}
			s.noteHolderMiss(he)
			holder = he.Holder
		}
	}
	for attempt := 0; ; attempt++ {
		if onlyRuby && len(s.rubyTIDs) > 0 {
			threads, err = s.pausedSnapshot(tp, s.rubyTIDs, 0)
		} else {
			threads, err = s.pausedSnapshot(nil, nil, 0)
		}
		if err != nil || !onlyRuby {
			return threads, err
		}
		// A Ruby thread that was not stopped (new since the last sample,
		// or of unknown tid) was read running: take the sample again,
		// pausing it too (every thread when a tid is unknown).
		known := s.rubyTIDs
		missed := s.noteThreads(threads)
		if len(known) == 0 || !missed || attempt > 0 {
			return threads, nil
		}
	}
}

func (s *RubySource) noteHolderMiss(he *ruby.HolderError) {
	if s.holderMisses == nil {
		s.holderMisses = map[string]int{}
	}
	why := he.Why
	if he.Holder != 0 {
		why = "another thread holds the GVL"
	}
	s.holderMisses[why]++
}

// holderOffCPU reports whether, in Mode cpu, the thread that held the GVL
// in the last sample is known to have been off a CPU at this tick's
// deadline, or to have moved on since (see movedOn): its sample is then
// dropped or unread whatever its stack, and the only thread a blocking
// sample would stop need not be (stopping a thread that waits for a CPU
// also waits for it to get one). Only with a ThreadPauser and a readable
// GVL owner.
func (s *RubySource) holderOffCPU() bool {
	if s.cpuAt == 0 || s.holder == 0 || !s.p.HolderKnown() {
		return false
	}
	cs := s.cpuState(s.holder)
	return cs.Known() && (cs != oncpu.Running || s.movedOn(s.holder))
}

// holderRan reports whether a thread that holds the GVL in threads was
// running at this tick's deadline and has not moved on, or may have been
// (its state unknown).
func (s *RubySource) holderRan(threads []stack.Thread) bool {
	for i := range threads {
		if th := &threads[i]; th.GVL {
			if cs := s.cpuState(th.TID); !cs.Known() || (cs == oncpu.Running && !s.movedOn(th.TID)) {
				return true
			}
		}
	}
	return false
}

// noteThreads keeps the Ruby threads of a sample and its GVL holder for
// the next pause, and reports whether a thread is new since the last
// sample or of unknown tid.
func (s *RubySource) noteThreads(threads []stack.Thread) (missed bool) {
	known := s.rubyTIDs
	tids := s.spareTIDs[:0]
	s.holder = 0
	holders := 0
	for _, th := range threads {
		if th.TID == 0 {
			tids, missed = nil, true
			break
		}
		if !slices.Contains(known, th.TID) {
			missed = true
		}
		tids = append(tids, th.TID)
		if th.GVL {
			holders++
			s.holder = th.TID
		}
	}
	if tids == nil || holders > 1 {
		// Several holders: several ractors, each with its lock, which
		// stopping one thread does not freeze.
		s.holder = 0
	}
	// The two lists take turns (known is read while tids is built).
	s.spareTIDs = known
	s.rubyTIDs = tids
	return missed
}

// pausedSnapshot pauses threads tids with tp (every thread with the
// pauser when tp is nil) and takes a snapshot (HolderStopped when holder
// is not 0), then resumes them however the walk ends (a panic
// included).
func (s *RubySource) pausedSnapshot(tp ThreadPauser, tids []int, holder int) (threads []stack.Thread, err error) {
	var resume func() error
	if s.cpuAt != 0 {
		s.pausedAt, s.pausedTIDs = oncpu.Now(), tids
		if tp == nil {
			s.pausedTIDs = nil
		}
	}
	if tp != nil {
		resume, err = tp.PauseThreads(s.pid, tids)
	} else {
		resume, err = s.pauser.Pause(s.pid)
	}
	if err != nil {
		return nil, fmt.Errorf("pause: %w", err)
	}
	defer func() {
		if rerr := resume(); rerr != nil && err == nil {
			threads, err = nil, fmt.Errorf("resume: %w", rerr)
		}
	}()
	req := ruby.Req{Consistency: ruby.Stopped}
	if holder != 0 {
		req = ruby.Req{Consistency: ruby.HolderStopped, Holder: holder}
	}
	threads, err = s.p.SnapshotWith(req)
	if err == nil {
		s.stoppedStates(threads, tids, tp == nil)
	}
	return threads, err
}

// stoppedStates takes, before the resume, the kernel states of the
// stopped threads (tids, or every thread when all) that need one, from
// their stops: asleep in a system call ('S') or running ('R'). /proc
// would say "traced" now, and after the resume the thread is back on its
// way into the call it left. A thread whose context-switch records give
// its state at the tick's deadline (Mode cpu) needs no look at its stop.
func (s *RubySource) stoppedStates(threads []stack.Thread, tids []int, all bool) {
	sr, ok := s.pauser.(SleepReader)
	if !ok {
		return
	}
	s.stopStates = append(s.stopStates[:0], make([]byte, len(threads))...)
	for i := range threads {
		th := &threads[i]
		if th.TID == 0 || !needsKernelState(th) || (!all && !slices.Contains(tids, th.TID)) ||
			cpuLetter(s.cpuState(th.TID)) != 0 {
			continue
		}
		asleep, err := sr.InterruptedSleep(th.TID)
		if err != nil {
			continue // read from /proc after the resume
		}
		s.stopStates[i] = 'R'
		if asleep {
			s.stopStates[i] = 'S'
		}
	}
}

// Close releases the files kept open for reading thread states and the
// context-switch watches.
func (s *RubySource) Close() error {
	s.states.close()
	if s.cpu != nil {
		s.cpu.Close()
	}
	return nil
}

// Snapshot reads every Ruby thread's stack of the running process p,
// without pausing it. A thread whose stack kept changing while it was read
// (a busy thread: the walker reads such a stack again and again before it
// keeps it under a (stack changed while read) frame, see ruby.ErrTorn), or
// could not be read at all, makes the snapshot be taken again as
// ruby.Retry retries, until every thread is read whole. It returns
// the snapshot that read every thread whole, else the one with the fewest
// unread threads and then the fewest kept torn, with a *ThreadErrors
// naming the threads still unread (their Error says why); an error without
// threads when no snapshot could be taken.
func Snapshot(ctx context.Context, p *ruby.Process) ([]stack.Thread, error) {
	var best []stack.Thread
	var bestErr *ThreadErrors
	bestTorn := 0
	err := ruby.Retry(ctx, 0, func() error {
		threads, err := p.Snapshot()
		if err != nil {
			return err
		}
		failed := threadErrors(p.Target().Pid(), threads)
		torn := 0
		for i := range threads {
			if HasTorn(threads[i].Frames) {
				torn++
			}
		}
		nf, nb := 0, 0
		if failed != nil {
			nf = len(failed.Threads)
		}
		if bestErr != nil {
			nb = len(bestErr.Threads)
		}
		if best == nil || nf < nb || (nf == nb && torn < bestTorn) {
			best, bestErr, bestTorn = threads, failed, torn
		}
		if failed != nil {
			return failed
		}
		if torn > 0 {
			return errTornKept
		}
		return nil
	})
	switch {
	case best == nil:
		return nil, err
	case bestErr != nil:
		return best, bestErr
	}
	return best, nil
}

// errTornKept is Snapshot's error, to retry, of a snapshot that kept a
// stack under a (stack changed while read) frame.
var errTornKept = fmt.Errorf("%w: a stack kept changing while it was read", ruby.ErrInconsistent)

// threadErrors returns the threads of a snapshot of process pid that
// could not be read, nil when every one was.
func threadErrors(pid int, threads []stack.Thread) *ThreadErrors {
	var failed *ThreadErrors
	for i := range threads {
		if th := &threads[i]; th.Error != "" {
			if failed == nil {
				failed = &ThreadErrors{Pid: pid}
			}
			failed.Threads = append(failed.Threads, ThreadError{TID: th.TID, Name: th.DisplayName(), Err: th.Error, Activity: th.Activity})
		}
	}
	return failed
}

// offCPUWatch answers ruby.OffCPUWatch from the threads' context-switch
// records.
type offCPUWatch struct{ w *oncpu.Threads }

func (o offCPUWatch) Now() int64 { return oncpu.Now() }

// OffSince: off a CPU at instant at (preempted or asleep) and not switched
// onto one since; false when the records do not reach back to it.
func (o offCPUWatch) OffSince(tid int, at int64) bool {
	st, since := o.w.At(tid, at, math.MaxInt64)
	return st.Known() && st != oncpu.Running && since == oncpu.Stayed
}

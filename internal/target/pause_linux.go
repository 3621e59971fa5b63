package target

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/rbscope/rbscope/internal/procfs"
	"github.com/rbscope/rbscope/internal/rtprio"
	"golang.org/x/sys/unix"
)

// Pausing a live process: every thread is seized with PTRACE_SEIZE and
// stopped with PTRACE_INTERRUPT; resuming detaches every thread with
// PTRACE_DETACH (re-injecting a signal that arrived meanwhile). A seized
// thread that was never stopped by us is not otherwise affected, and if
// rbscope dies the kernel detaches (and so resumes) every tracee.
//
// ptrace requests are only accepted from the thread that attached, so all
// of them run on one goroutine locked to its OS thread.

// pauseStopTimeout bounds the wait for one thread to stop (a thread in
// uninterruptible sleep stops only when it leaves it).
const pauseStopTimeout = time.Second

// maxRelist bounds the re-listing of /proc/PID/task for threads created
// while the others were being stopped.
const maxRelist = 8

// Pauser stops and resumes live processes with ptrace. A Pauser from
// NewPauser may be used from any goroutine: the ptrace calls run on an OS
// thread owned by the Pauser, each call handed over through a channel. A
// Pauser from NewThreadPauser runs them inline on the calling goroutine's
// OS thread, which saves two thread wake-ups per pause (hundreds of
// microseconds on a loaded machine).
type Pauser struct {
	reqs      chan func()
	closeOnce sync.Once
	done      chan struct{}
	inline    bool // NewThreadPauser
	closed    bool
	// NewThreadPauser: the OS thread the calling goroutine is locked to
	// while threads are attached (held: from a pause to its resume, and
	// while a thread that did not stop in time stays pending), the only
	// thread whose ptrace requests the kernel then accepts.
	owner int
	held  bool
	open  int // pauses not resumed yet

	// Owned by the ptrace goroutine.
	pending map[int]int  // tid -> pid: seized, interrupt sent, stop not yet seen
	child   map[int]bool // pid -> it is rbscope's own child (launch mode)
}

// NewPauser starts a Pauser. Close it when done.
func NewPauser() *Pauser {
	p := &Pauser{reqs: make(chan func()), done: make(chan struct{}), pending: map[int]int{}}
	started := make(chan struct{})
	go p.loop(started)
	<-started
	return p
}

func (p *Pauser) loop(started chan struct{}) {
	runtime.LockOSThread()
	// The thread stays locked until the goroutine exits; then the runtime
	// ends the OS thread, which detaches anything still attached.
	close(started)
	for f := range p.reqs {
		f()
	}
	p.settlePending(5 * time.Second)
	close(p.done)
}

// NewThreadPauser returns a Pauser that runs its ptrace requests on the
// calling goroutine's OS thread. The kernel accepts a tracee's requests
// only from the thread that attached it, so a pause locks the goroutine to
// its thread until the pause is resumed (and for as long as a thread that
// did not stop in time stays attached, see Close); in between, the
// goroutine may sleep anywhere, such as in Go's poller, without a
// hand-off to a locked thread at each wake-up. Use it from one goroutine
// at a time, and Close it.
func NewThreadPauser() *Pauser {
	return &Pauser{inline: true, pending: map[int]int{}}
}

// do runs f on the ptrace thread.
func (p *Pauser) do(f func()) (err error) {
	if p.inline {
		if p.closed {
			return errors.New("pauser is closed")
		}
		if !p.held {
			runtime.LockOSThread()
			p.owner, p.held = unix.Gettid(), true
		} else if unix.Gettid() != p.owner {
			return errors.New("pauser used from another thread than the one its threads are attached to")
		}
		f()
		if p.open == 0 && len(p.pending) == 0 {
			p.held = false
			runtime.UnlockOSThread()
		}
		return nil
	}
	defer func() {
		if recover() != nil {
			err = errors.New("pauser is closed")
		}
	}()
	ran := make(chan struct{})
	p.reqs <- func() { f(); close(ran) }
	<-ran
	return nil
}

// Close detaches from anything still attached (waiting up to a few
// seconds for threads that have not stopped yet) and ends the Pauser.
func (p *Pauser) Close() error {
	if p.inline {
		if p.held && unix.Gettid() != p.owner {
			return errors.New("pauser closed from another thread than the one its threads are attached to")
		}
		if !p.closed {
			p.closed = true
			p.settlePending(5 * time.Second)
			if n := len(p.pending); n > 0 {
				// Threads that never stopped are still attached to this
				// OS thread: keep it locked so that no other goroutine
				// runs on it; the kernel detaches them when rbscope exits.
				return fmt.Errorf("%d threads did not stop within %v of being interrupted; they stay attached until rbscope exits", n, pauseStopTimeout+5*time.Second)
			}
			if p.held {
				p.held = false
				runtime.UnlockOSThread()
			}
		}
		return nil
	}
	p.closeOnce.Do(func() { close(p.reqs) })
	<-p.done
	return nil
}

type pausedThread struct {
	tid int
	sig int // signal to re-inject on detach
}

// Paused describes one pause: the threads that were stopped.
type Paused struct {
	Pid  int
	TIDs []int
}

// Pause stops every thread of process pid and returns a function that
// resumes them. The resume function must be called, also on error paths;
// it is safe to call more than once. Pause itself leaves nothing stopped
// when it fails.
func (p *Pauser) Pause(pid int) (resume func() error, err error) {
	_, resume, err = p.PauseInfo(pid)
	return resume, err
}

// PauseInfo is Pause that also reports which threads were stopped.
func (p *Pauser) PauseInfo(pid int) (Paused, func() error, error) {
	return p.pauseInfo(pid, nil, true)
}

// PauseThreads stops only the threads tids of process pid (those that
// have exited are skipped) and returns a function that resumes them, as
// Pause does. It fails, leaving nothing stopped, when one of them does not
// stop in time. A profiler pauses only the threads that run Ruby: a process
// with a hundred native threads of a C library pays for none of them.
func (p *Pauser) PauseThreads(pid int, tids []int) (resume func() error, err error) {
	if len(tids) == 0 {
		return nil, errors.New("no threads to pause")
	}
	_, resume, err = p.pauseInfo(pid, tids, false)
	return resume, err
}

// pauseInfo pauses process pid's threads only (every thread when nil),
// reporting which in the Paused when withTIDs.
func (p *Pauser) pauseInfo(pid int, only []int, withTIDs bool) (Paused, func() error, error) {
	c := &pauseCall{p: p, pid: pid, only: only}
	if e := p.do(c.pause); e != nil {
		return Paused{}, nil, e
	}
	if c.perr != nil {
		return Paused{}, nil, c.perr
	}
	info := Paused{Pid: pid}
	if withTIDs {
		info.TIDs = make([]int, len(c.threads))
		for i, th := range c.threads {
			info.TIDs[i] = th.tid
		}
	}
	return info, c.resume, nil
}

// pauseCall is one pause and its resume, in one allocation.
type pauseCall struct {
	p       *Pauser
	pid     int
	only    []int // the threads to pause (nil: all); not kept after the pause
	threads []pausedThread
	perr    error
	mu      sync.Mutex
	done    bool
	rerr    error
}

func (c *pauseCall) pause() {
	if c.threads, c.perr = c.p.pause(c.pid, c.only); c.perr == nil {
		c.p.open++
	}
	c.only = nil
}

func (c *pauseCall) detach() {
	c.rerr = c.p.resume(c.pid, c.threads)
	c.p.open--
	c.done = true
}

// resume resumes the paused threads, once; a call refused (from another
// thread than the one the threads are attached to) leaves it to a later
// call.
func (c *pauseCall) resume() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done {
		return c.rerr
	}
	if e := c.p.do(c.detach); e != nil {
		return e
	}
	return c.rerr
}

var defaultPauser struct {
	once sync.Once
	p    *Pauser
}

// Pause stops every thread of live process pid (PTRACE_SEIZE and
// PTRACE_INTERRUPT on each, waiting for each stop) and returns a function
// that resumes them all (PTRACE_DETACH). It uses a process-wide Pauser.
func Pause(pid int) (resume func() error, err error) {
	defaultPauser.once.Do(func() { defaultPauser.p = NewPauser() })
	return defaultPauser.p.Pause(pid)
}

func (p *Pauser) pause(pid int, only []int) ([]pausedThread, error) {
	p.settlePending(0)
	var seized []int
	var seen map[int]bool // threads tried, when re-listing (only == nil)
	if only == nil {
		seen = map[int]bool{}
	}
	fail := func(err error) ([]pausedThread, error) {
		// Stop what we started, then let everything go.
		stopped := p.waitStops(pid, seized)
		_ = p.resume(pid, stopped)
		return nil, err
	}
	for round := 0; round < maxRelist; round++ {
		var tids []int
		var err error
		if only == nil {
			tids, err = p.listTasks(pid)
		} else if round == 0 {
			tids = only
		} else {
			break // no re-listing: only these threads
		}
		if err != nil {
			if len(seized) == 0 {
				return nil, err
			}
			break
		}
		added := false
		for _, tid := range tids {
			if seen != nil {
				if seen[tid] {
					continue
				}
				seen[tid] = true
			}
			if err := ptrace(unix.PTRACE_SEIZE, tid, 0); err != nil {
				if errors.Is(err, unix.ESRCH) {
					continue // the thread exited
				}
				if errors.Is(err, unix.EPERM) {
					if s := procfs.TaskState(pid, tid); s == 'Z' || s == 'X' || s == 0 {
						continue // exiting: the kernel refuses to attach
					}
					if tracer := tracerPid(pid, tid); tracer == unix.Gettid() {
						// Seized by this pauser in an earlier pause whose
						// wait for its stop gave up, and not detached
						// since (its stop was never seen): it is ours to
						// stop and detach now, or it stays stopped.
						delete(p.pending, tid)
						seized = append(seized, tid)
						added = true
						if err := ptrace(unix.PTRACE_INTERRUPT, tid, 0); err != nil && !errors.Is(err, unix.ESRCH) {
							return fail(fmt.Errorf("interrupt thread %d of process %d: %w", tid, pid, err))
						}
						continue
					} else if tracer != 0 {
						return fail(fmt.Errorf("pause process %d: thread %d is already traced by process %d (a debugger?); use --nonblocking", pid, tid, tracer))
					}
					return fail(NewDeniedError(pid, "pause (ptrace) thread "+strconv.Itoa(tid)+" of", err))
				}
				return fail(fmt.Errorf("seize thread %d of process %d: %w", tid, pid, err))
			}
			seized = append(seized, tid)
			added = true
			if err := ptrace(unix.PTRACE_INTERRUPT, tid, 0); err != nil && !errors.Is(err, unix.ESRCH) {
				return fail(fmt.Errorf("interrupt thread %d of process %d: %w", tid, pid, err))
			}
		}
		if !added {
			break
		}
	}
	stopped := p.waitStops(pid, seized)
	if only != nil {
		// The caller reads these threads as stopped: one that is still
		// running (left pending: its stop did not come in time) fails
		// the pause rather than being read as if it were stopped.
		for _, tid := range seized {
			if p.pending[tid] == pid {
				_ = p.resume(pid, stopped)
				return nil, fmt.Errorf("pause thread %d of process %d: it did not stop within %v", tid, pid, pauseStopTimeout)
			}
		}
	}
	if len(stopped) == 0 {
		if s := procfs.TaskState(pid, pid); s == 'Z' || s == 'X' || s == 0 || !processAlive(pid) {
			return nil, ExitedError{Pid: pid}
		}
	}
	return stopped, nil
}

// waitStops waits for each seized thread's stop. Threads that exited are
// dropped; threads that do not stop in time are left pending (detached
// as soon as they stop, on a later call or on Close).
func (p *Pauser) waitStops(pid int, tids []int) []pausedThread {
	out := make([]pausedThread, 0, len(tids))
	for _, tid := range tids {
		sig, ok, gone := waitStop(pid, tid, pauseStopTimeout, p.ownChild(pid, tid))
		switch {
		case gone:
		case ok:
			out = append(out, pausedThread{tid: tid, sig: sig})
		default:
			p.pending[tid] = pid
		}
	}
	return out
}

// ownChild reports whether tid is the main thread of rbscope's own child
// pid (a launched command): its exit status belongs to the code that
// launched it, so waitStop must not reap it.
func (p *Pauser) ownChild(pid, tid int) bool {
	if tid != pid {
		return false
	}
	if p.child == nil {
		p.child = map[int]bool{}
	}
	c, ok := p.child[pid]
	if !ok {
		st, err := procfs.ReadStat(pid)
		c = err == nil && st.PPid == os.Getpid()
		p.child[pid] = c
	}
	return c
}

// exitPending reports whether thread tid has exited, without reaping it
// (waitid with WNOWAIT), and whether it has any event to wait for at all.
func exitPending(tid int) (exited, event bool) {
	var info unix.Siginfo
	err := unix.Waitid(unix.P_PID, tid, &info, unix.WEXITED|unix.WSTOPPED|unix.WNOHANG|unix.WNOWAIT|unix.WALL, nil)
	if err != nil {
		return errors.Is(err, unix.ECHILD), errors.Is(err, unix.ECHILD)
	}
	// siginfo_t: si_signo, si_errno, si_code, then (for SIGCHLD) si_pid.
	raw := (*[24]byte)(unsafe.Pointer(&info))
	if binary.NativeEndian.Uint32(raw[16:]) == 0 {
		return false, false // nothing to report yet
	}
	const cldExited, cldKilled, cldDumped = 1, 2, 3
	code := info.Code
	return code == cldExited || code == cldKilled || code == cldDumped, true
}

// stopSpin is how long waitStop polls for a stop before yielding its CPU.
const stopSpin = 30 * time.Microsecond

// waitStop waits for seized thread tid to stop. It returns the signal to
// re-inject on detach, ok when the thread is stopped, and gone when it
// exited (or is a zombie that will never stop). With keepExit (the main
// thread of rbscope's own child) an exit is seen without being reaped,
// so that the launcher still gets the exit status.
func waitStop(pid, tid int, timeout time.Duration, keepExit bool) (sig int, ok, gone bool) {
	var ws unix.WaitStatus
	var deadline, spinUntil time.Time
	backoff := time.Duration(0)
	rt := 0 // 0 unknown, 1 ordinary, 2 real-time (the caller's policy)
	for i := 0; ; i++ {
		var wpid int
		var err error
		if keepExit {
			exited, event := exitPending(tid)
			if exited {
				return 0, false, true
			}
			if event {
				wpid, err = wait4NoHang(tid, &ws)
			}
		} else {
			wpid, err = wait4NoHang(tid, &ws)
		}
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			// ECHILD: not (or no longer) our tracee.
			return 0, false, true
		}
		if wpid == tid {
			switch {
			case ws.Exited() || ws.Signaled():
				return 0, false, true
			case ws.Stopped():
				if int(ws)>>16 == unix.PTRACE_EVENT_STOP {
					return 0, true, false // our interrupt, or a group stop
				}
				// A signal-delivery stop came first: the thread is stopped
				// and the signal is delivered again when we detach.
				return int(ws.StopSignal()), true, false
			}
			continue
		}
		if timeout == 0 {
			return 0, false, false
		}
		// Not stopped yet. A thread running on another CPU stops within
		// microseconds of the interrupt: poll without giving up this CPU
		// for a while first. A yield can hand it to an ordinary thread of
		// the target, which a kernel that preempts lazily lets run until
		// its next tick (4 ms at HZ=250) while the threads already
		// stopped stay stopped (scripts/bench-pause.sh, 4 spinning
		// threads at 100 Hz: stops over 1 ms were 2.7 to 5.4 % of all,
		// 0.5 to 1.1 % with the poll). Then yield the CPU (the thread may
		// be waiting for this one to enter its stop), then back off,
		// giving up at the deadline.
		if i == 0 {
			spinUntil = time.Now().Add(stopSpin)
		}
		if i < 1000 && time.Now().Before(spinUntil) {
			continue
		}
		if i < 1000 {
			if rt == 0 {
				rt = 1
				if rtprio.Caller() {
					rt = 2
				}
			}
			if rt == 2 {
				// A real-time thread's yield leaves its CPU to no
				// ordinary thread: sleep instead (--realtime).
				ts := unix.Timespec{Nsec: 20000}
				_, _, _ = unix.RawSyscall(unix.SYS_NANOSLEEP, uintptr(unsafe.Pointer(&ts)), 0, 0)
			} else {
				_, _, _ = unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
			}
			continue
		}
		if deadline.IsZero() {
			deadline = time.Now().Add(timeout)
			if s := procfs.TaskState(pid, tid); s == 'Z' || s == 'X' || s == 0 {
				return 0, false, true
			}
		}
		if time.Now().After(deadline) {
			return 0, false, false
		}
		backoff = min(max(2*backoff, 10*time.Microsecond), 200*time.Microsecond)
		ts := unix.NsecToTimespec(int64(backoff))
		_ = unix.Nanosleep(&ts, nil)
	}
}

// settlePending detaches pending threads that have stopped since, waiting
// up to wait for them.
func (p *Pauser) settlePending(wait time.Duration) {
	if len(p.pending) == 0 {
		return
	}
	deadline := time.Now().Add(wait)
	for len(p.pending) > 0 {
		for tid, pid := range p.pending {
			sig, ok, gone := waitStop(pid, tid, 0, p.ownChild(pid, tid))
			if gone {
				delete(p.pending, tid)
			} else if ok {
				_ = detach(tid, sig)
				delete(p.pending, tid)
			}
		}
		if len(p.pending) == 0 || time.Now().After(deadline) {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

func (p *Pauser) resume(pid int, threads []pausedThread) error {
	var errs []error
	// The leader last: a killed process's leader reports its exit only
	// once its other threads are reaped.
	order := make([]pausedThread, 0, len(threads))
	for _, th := range threads {
		if th.tid != pid {
			order = append(order, th)
		}
	}
	for _, th := range threads {
		if th.tid == pid {
			order = append(order, th)
		}
	}
	for _, th := range order {
		if err := detach(th.tid, th.sig); err != nil {
			// Killed while stopped: gone, or a zombie its tracer must
			// reap (the leader of rbscope's own child is left to its
			// parent's wait, whose status it is).
			if errors.Is(err, unix.ESRCH) && (!taskExists(pid, th.tid) || p.ownChild(pid, th.tid) || reapTracee(th.tid)) {
				continue
			}
			errs = append(errs, fmt.Errorf("resume thread %d of process %d: %w", th.tid, pid, err))
		}
	}
	p.settlePending(0)
	return errors.Join(errs...)
}

func detach(tid, sig int) error { return ptrace(unix.PTRACE_DETACH, tid, uintptr(sig)) }

// reapTracee collects the exit of thread tid, killed while it was
// stopped: a traced thread that exits stays a zombie until its tracer
// waits for it (it can no longer be detached), and until then its parent
// cannot reap the process. It waits up to a second for the exit to be
// reported and says whether it was.
func reapTracee(tid int) bool {
	deadline := time.Now().Add(time.Second)
	for {
		var ws unix.WaitStatus
		r, err := wait4NoHang(tid, &ws)
		switch {
		case err != nil: // ECHILD: not (or no longer) our tracee
			return errors.Is(err, unix.ECHILD)
		case r == tid && (ws.Exited() || ws.Signaled()):
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
}

// InterruptedSleep reports whether thread tid, stopped by a pause of p
// (between the pause and its resume), was asleep in a system call when it
// was stopped: the pause interrupted the call, which the thread restarts
// on resume. Its registers (PTRACE_GETREGS, one request, where reading
// /proc's task state before the pause took a file read) show a system
// call number (orig_rax; an interrupt or exception leaves -1 there) and
// one of the kernel's restart codes in rax, or -EINTR. A thread stopped
// in user code, or on its way back from a call that had completed, was
// running: on a CPU or waiting for one. It fails for a thread p has not
// stopped. (A thread in an uninterruptible sleep, a disk read, stops only
// once the call completes, and so counts as running.)
func (p *Pauser) InterruptedSleep(tid int) (asleep bool, err error) {
	var regs Registers
	var rerr error
	if e := p.do(func() { rerr = ptrace(unix.PTRACE_GETREGS, tid, uintptr(unsafe.Pointer(&regs))) }); e != nil {
		return false, e
	}
	if rerr != nil {
		return false, fmt.Errorf("read the registers of stopped thread %d: %w", tid, rerr)
	}
	return interruptedCall(&regs), nil
}

// The kernel's internal errors of an interrupted system call that is to
// be restarted (include/linux/errno.h).
const (
	errRestartSys        = 512
	errRestartNoIntr     = 513
	errRestartNoHand     = 514
	errRestartRestartBlk = 516
)

// interruptedCall says whether registers taken at a ptrace stop are those
// of a thread whose system call the stop interrupted.
func interruptedCall(r *Registers) bool {
	if int64(r.Orig_rax) < 0 {
		return false
	}
	switch -int64(r.Rax) {
	case int64(unix.EINTR), errRestartSys, errRestartNoIntr, errRestartNoHand, errRestartRestartBlk:
		return true
	}
	return false
}

// ptrace makes a ptrace request that returns at once (seize, interrupt,
// getregs, detach) as a raw system call, and wait4NoHang polls a tracee's stop the
// same way: a pause makes a dozen of these per sample, and announcing
// each to the Go scheduler would wake its monitor thread, which then
// polls every 20 µs (measured: 12 nanosleep and 8 futex calls per tick in
// blocking mode). None of them blocks: every wait here is WNOHANG, and
// the rare long wait sleeps with an ordinary nanosleep.
func ptrace(req int, tid int, data uintptr) error {
	_, _, e := unix.RawSyscall6(unix.SYS_PTRACE, uintptr(req), uintptr(tid), 0, data, 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

func wait4NoHang(tid int, ws *unix.WaitStatus) (int, error) {
	var status int32
	r, _, e := unix.RawSyscall6(unix.SYS_WAIT4, uintptr(tid), uintptr(unsafe.Pointer(&status)), unix.WALL|unix.WNOHANG, 0, 0, 0)
	if e != 0 {
		return 0, e
	}
	*ws = unix.WaitStatus(status)
	return int(r), nil
}

func (p *Pauser) listTasks(pid int) ([]int, error) {
	tids, err := procfs.Tasks(pid)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, ExitedError{Pid: pid}
		}
		return nil, err
	}
	if len(tids) == 0 {
		return nil, ExitedError{Pid: pid}
	}
	return tids, nil
}

func taskExists(pid, tid int) bool {
	_, err := os.Stat("/proc/" + strconv.Itoa(pid) + "/task/" + strconv.Itoa(tid))
	return err == nil
}

func processAlive(pid int) bool {
	err := unix.Kill(pid, 0)
	return err == nil || errors.Is(err, unix.EPERM)
}

// tracerPid returns the TracerPid of thread tid, 0 if none or unknown.
func tracerPid(pid, tid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/status", pid, tid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "TracerPid:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return 0
}

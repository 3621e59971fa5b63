// Package rtprio runs rbscope's threads at real-time priority
// (SCHED_FIFO) while it samples, and tells whether the calling thread
// runs at it.
package rtprio

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rbscope/rbscope/internal/procfs"
)

// Priority is the SCHED_FIFO priority Raise gives rbscope's threads: the
// lowest, above every ordinary thread and below the kernel's own
// real-time threads.
const Priority = 1

// Raise puts every thread of this process under SCHED_FIFO at Priority
// (threads started meanwhile inherit it) and returns the function that
// puts each back to the policy it had (ordinary threads started meanwhile
// become ordinary). On a kernel that preempts ordinary threads lazily, at
// its tick (4 ms at HZ=250), a sampler that wakes on a CPU busy with the
// target waits up to a tick: measured on this project's 2-core VM, 4
// threads x 50 frames at 5 kHz nonblocking, 2.2 % of ticks late or missed
// as an ordinary process, 0.2 % at real-time priority, the same CPU per
// tick. It fails, changing nothing, where the priority may not be raised
// (no root or CAP_SYS_NICE, or a cgroup without real-time runtime).
func Raise() (restore func(), err error) {
	tids, err := procfs.Tasks(os.Getpid())
	if err != nil {
		return nil, err
	}
	// The policy each thread had; leftAlone for those not changed.
	const leftAlone = -1
	was := map[int]int{}
	changed := 0
	undo := func() {
		if changed == 0 {
			return
		}
		now, _ := procfs.Tasks(os.Getpid())
		for _, tid := range now {
			pol, ok := was[tid]
			if !ok {
				pol = unix.SCHED_NORMAL // started meanwhile, inheriting real-time
			}
			if pol == leftAlone {
				continue
			}
			if p, err := Policy(tid); err != nil || p != unix.SCHED_FIFO {
				continue
			}
			_ = setPolicy(tid, pol, 0)
		}
	}
	for _, tid := range tids {
		pol, err := Policy(tid)
		if err != nil {
			continue // exited
		}
		if pol != unix.SCHED_NORMAL && pol != unix.SCHED_BATCH {
			was[tid] = leftAlone // already real-time (chrt), or SCHED_IDLE
			continue
		}
		if err := setPolicy(tid, unix.SCHED_FIFO, Priority); err != nil {
			if errors.Is(err, unix.ESRCH) {
				continue
			}
			undo()
			return nil, raiseErr(err)
		}
		was[tid] = pol
		changed++
	}
	return undo, nil
}

// RaiseThread puts the calling OS thread alone under SCHED_FIFO at
// Priority, with SCHED_RESET_ON_FORK so that the threads it starts are
// ordinary, and returns the function that puts it back. The caller keeps
// its goroutine on the thread (runtime.LockOSThread) while it runs raised,
// and calls restore on it. For a long-lived sampler (the agent) whose
// other work, uploads and scans of /proc, must not run above the targets.
// A thread already at real-time priority is left alone.
func RaiseThread() (restore func(), err error) {
	pol, err := Policy(0)
	if err != nil {
		return nil, fmt.Errorf("read rbscope's scheduling policy: %w", err)
	}
	if pol != unix.SCHED_NORMAL && pol != unix.SCHED_BATCH {
		return func() {}, nil
	}
	if err := setPolicy(0, unix.SCHED_FIFO|unix.SCHED_RESET_ON_FORK, Priority); err != nil {
		return nil, raiseErr(err)
	}
	return func() { _ = setPolicy(0, pol, 0) }, nil
}

// Check reports whether Raise can succeed, by raising the calling thread
// to real-time priority and back (a user's flag is refused before
// anything starts, not after the target was opened).
func Check() error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	pol, err := Policy(0)
	if err != nil {
		return fmt.Errorf("read rbscope's scheduling policy: %w", err)
	}
	if realtime(pol) {
		return nil
	}
	if err := setPolicy(0, unix.SCHED_FIFO, Priority); err != nil {
		return raiseErr(err)
	}
	_ = setPolicy(0, pol, 0)
	return nil
}

// Caller reports whether the calling OS thread runs at real-time
// priority (SCHED_FIFO or SCHED_RR). The caller keeps its goroutine on
// the thread for as long as the answer matters.
func Caller() bool {
	pol, err := Policy(0)
	return err == nil && realtime(pol)
}

// Policy is thread tid's scheduling policy (0: the calling thread's),
// without the SCHED_RESET_ON_FORK flag. It is a raw system call: a
// pause's wait asks it, and announcing it to Go's scheduler would wake
// its monitor (see target.ptrace).
func Policy(tid int) (int, error) {
	pol, _, e := unix.RawSyscall(unix.SYS_SCHED_GETSCHEDULER, uintptr(tid), 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(pol) &^ unix.SCHED_RESET_ON_FORK, nil
}

func realtime(policy int) bool { return policy == unix.SCHED_FIFO || policy == unix.SCHED_RR }

func setPolicy(tid, policy, prio int) error {
	p := int32(prio)
	if _, _, e := unix.RawSyscall(unix.SYS_SCHED_SETSCHEDULER, uintptr(tid), uintptr(policy), uintptr(unsafe.Pointer(&p))); e != 0 {
		return e
	}
	return nil
}

func raiseErr(err error) error {
	if errors.Is(err, unix.EPERM) {
		return fmt.Errorf("run at real-time priority (SCHED_FIFO %d): %w (needs root or CAP_SYS_NICE, and real-time runtime in rbscope's cgroup)", Priority, err)
	}
	return fmt.Errorf("run at real-time priority (SCHED_FIFO %d): %w", Priority, err)
}

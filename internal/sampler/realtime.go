package sampler

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"unsafe"

	"golang.org/x/sys/unix"
)

// RealtimePriority is the SCHED_FIFO priority Config.Realtime gives
// rbscope's threads: the lowest, above every ordinary thread and below
// the kernel's own real-time threads.
const RealtimePriority = 1

// raiseRealtime puts every thread of this process under SCHED_FIFO at
// RealtimePriority (threads started meanwhile inherit it) and returns
// the function that puts each back to the policy it had (ordinary
// threads started meanwhile become ordinary). On a kernel that preempts
// ordinary threads lazily, at its tick (4 ms at HZ=250), a sampler that
// wakes on a CPU busy with the target waits up to a tick: measured on this
// project's 2-core VM, 4 threads x 50 frames at 5 kHz nonblocking, 2.2 %
// of ticks late or missed as an ordinary process, 0.2 % at real-time
// priority, the same CPU per tick. It fails, changing nothing, where the
// priority may not be raised (no root or CAP_SYS_NICE, or a cgroup
// without real-time runtime).
func raiseRealtime() (restore func(), err error) {
	tids, err := ownThreads()
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
		now, _ := ownThreads()
		for _, tid := range now {
			pol, ok := was[tid]
			if !ok {
				pol = unix.SCHED_NORMAL // started meanwhile, inheriting real-time
			}
			if pol == leftAlone {
				continue
			}
			if p, err := getPolicy(tid); err != nil || p != unix.SCHED_FIFO {
				continue
			}
			_ = setPolicy(tid, pol, 0)
		}
	}
	for _, tid := range tids {
		pol, err := getPolicy(tid)
		if err != nil {
			continue // exited
		}
		if pol != unix.SCHED_NORMAL && pol != unix.SCHED_BATCH {
			was[tid] = leftAlone // already real-time (chrt), or SCHED_IDLE
			continue
		}
		if err := setPolicy(tid, unix.SCHED_FIFO, RealtimePriority); err != nil {
			if errors.Is(err, unix.ESRCH) {
				continue
			}
			undo()
			return nil, realtimeErr(err)
		}
		was[tid] = pol
		changed++
	}
	return undo, nil
}

// ownThreads lists this process's threads.
func ownThreads() ([]int, error) {
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return nil, fmt.Errorf("list rbscope's threads: %w", err)
	}
	tids := make([]int, 0, len(ents))
	for _, e := range ents {
		if tid, err := strconv.Atoi(e.Name()); err == nil {
			tids = append(tids, tid)
		}
	}
	return tids, nil
}

func getPolicy(tid int) (int, error) {
	pol, _, e := unix.RawSyscall(unix.SYS_SCHED_GETSCHEDULER, uintptr(tid), 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(pol) &^ unix.SCHED_RESET_ON_FORK, nil
}

func setPolicy(tid, policy, prio int) error {
	p := int32(prio)
	if _, _, e := unix.RawSyscall(unix.SYS_SCHED_SETSCHEDULER, uintptr(tid), uintptr(policy), uintptr(unsafe.Pointer(&p))); e != 0 {
		return e
	}
	return nil
}

// CheckRealtime reports whether Config.Realtime can be had, by raising
// the calling thread to real-time priority and back (a user's flag is
// refused before anything starts, not after the target was opened).
func CheckRealtime() error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	pol, err := getPolicy(0)
	if err != nil {
		return fmt.Errorf("read rbscope's scheduling policy: %w", err)
	}
	if pol == unix.SCHED_FIFO || pol == unix.SCHED_RR {
		return nil
	}
	if err := setPolicy(0, unix.SCHED_FIFO, RealtimePriority); err != nil {
		return realtimeErr(err)
	}
	_ = setPolicy(0, pol, 0)
	return nil
}

func realtimeErr(err error) error {
	if errors.Is(err, unix.EPERM) {
		return fmt.Errorf("run at real-time priority (SCHED_FIFO %d): %w (needs root or CAP_SYS_NICE, and real-time runtime in rbscope's cgroup)", RealtimePriority, err)
	}
	return fmt.Errorf("run at real-time priority (SCHED_FIFO %d): %w", RealtimePriority, err)
}

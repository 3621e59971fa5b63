// Package oncpu tells whether a thread was running on a CPU at a given
// instant, by the kernel's own account.
//
// /proc cannot tell: a task's state 'R' covers both a thread on a CPU and
// one runnable but waiting for a CPU, and its CPU times (stat's utime and
// stime, schedstat's sum_exec_runtime) advance only at scheduler ticks and
// switches, so between two reads they say how much a thread ran, not
// whether it runs now. The kernel's scheduler does say it, as it switches:
// a perf event (perf_event_open(2), the software task clock) bound to one
// thread with context_switch set makes the kernel write a PERF_RECORD_SWITCH
// record, time-stamped with CLOCK_MONOTONIC, each time the thread is
// switched onto or off a CPU, marking a switch-out that left the thread
// runnable (preempted) apart from one that put it to sleep. The records go
// to a ring buffer the kernel overwrites (read-only mapping, written
// backwards: the newest record first) and rbscope reads from memory, so a
// query costs no system call: the last record at or before the instant
// says what the thread was doing then.
//
// Asking about an instant that has passed (a sampler's tick deadline
// rather than the moment it got to run) matters on a busy machine: a
// sampler woken on the CPU the thread was running on takes it from the
// thread, and the thread's state when the sampler looks is then "waiting
// for a CPU" however much it ran before.
package oncpu

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rbscope/rbscope/internal/procfs"
)

// State is what a thread was doing at an instant.
type State uint8

// States.
const (
	// Unknown: the records do not reach back to the instant (the thread
	// was not watched yet, or switched so often since that the ring
	// buffer no longer holds it).
	Unknown State = iota
	// Running: on a CPU.
	Running
	// Runnable: switched out while runnable (preempted), waiting for a
	// CPU.
	Runnable
	// Asleep: switched out not runnable: asleep in the kernel, or
	// stopped.
	Asleep
	// Off: not on a CPU, either runnable or asleep (the records say it
	// was switched in after the instant, not how it had left).
	Off
)

func (s State) String() string {
	switch s {
	case Running:
		return "running"
	case Runnable:
		return "runnable"
	case Asleep:
		return "asleep"
	case Off:
		return "off"
	}
	return "unknown"
}

// Known reports whether the state says whether the thread was on a CPU.
func (s State) Known() bool { return s != Unknown }

// dataPages is the size of each ring buffer in pages (a power of two):
// one page holds 256 switch records (16 bytes each), and a query walks
// only the records written since the instant it asks about.
const dataPages = 1

// Bit 13 and 14 of a record's misc field (PERF_RECORD_MISC_SWITCH_OUT,
// PERF_RECORD_MISC_SWITCH_OUT_PREEMPT).
const (
	miscOut     = unix.PERF_RECORD_MISC_SWITCH_OUT
	miscPreempt = unix.PERF_RECORD_MISC_SWITCH_OUT_PREEMPT
)

// Threads watches threads of one process.
type Threads struct {
	pid     int
	threads map[int]*thread
	seen    map[int]bool
	// failed are the threads that could not be watched, not tried again;
	// off is set when the kernel refused outright (no thread is tried).
	failed map[int]bool
	off    bool
	err    error // the first failure
}

// New watches nothing yet of process pid (see Watch).
func New(pid int) *Threads {
	return &Threads{pid: pid, threads: map[int]*thread{}, seen: map[int]bool{}, failed: map[int]bool{}}
}

// Watch starts watching each thread of tids not watched yet and stops
// watching those not in tids (threads that ended). A thread is known from
// the moment it is first watched: an instant before that is Unknown. The
// error is the first failure to watch one of tids; a thread that failed
// is not tried again, and after a refusal that would refuse every thread
// (permissions, a kernel without perf events) none is.
func (w *Threads) Watch(tids []int) error {
	clear(w.seen)
	var first error
	for _, tid := range tids {
		w.seen[tid] = true
		if _, ok := w.threads[tid]; ok || w.off || w.failed[tid] {
			continue
		}
		th, err := open(w.pid, tid)
		if err != nil {
			if errors.Is(err, unix.ESRCH) {
				continue // ended
			}
			w.failed[tid] = true
			if refusesAll(err) {
				w.off = true
			}
			if first == nil {
				first = err
			}
			continue
		}
		w.threads[tid] = th
	}
	for tid, th := range w.threads {
		if !w.seen[tid] {
			th.close()
			delete(w.threads, tid)
		}
	}
	for tid := range w.failed {
		if !w.seen[tid] {
			delete(w.failed, tid)
		}
	}
	if first != nil && w.err == nil {
		w.err = first
	}
	return first
}

// refusesAll reports whether a failure to watch one thread would be the
// same for every other: permissions (perf_event_paranoid, a seccomp
// filter, a missing capability) or a kernel without the feature.
func refusesAll(err error) bool {
	for _, e := range []error{unix.EACCES, unix.EPERM, unix.ENOSYS, unix.ENOENT, unix.EOPNOTSUPP, unix.EINVAL, unix.E2BIG} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// Err is the first failure to watch a thread, if any.
func (w *Threads) Err() error { return w.err }

// Watched is the number of threads watched.
func (w *Threads) Watched() int { return len(w.threads) }

// Since is what a thread did after an instant, up to a later one.
type Since uint8

// What a thread did since an instant.
const (
	// Stayed: no switch, or only preemptions: a thread running at the
	// instant is still in the same stretch on a CPU, or was preempted in
	// it, so its stack read then is where it ran at the instant.
	Stayed Since = iota
	// Slept: switched out without being preempted (asleep in the
	// kernel, or stopped), never back in: its stack is where it went to
	// sleep, which may be past where it ran at the instant (a
	// Queue#pop, a read), or the same place (waiting for the GVL).
	Slept
	// SwitchedIn: switched onto a CPU, and asleep again by the later
	// instant: it may have run anywhere since, and its stack then is
	// where it went to sleep.
	SwitchedIn
	// Resumed: switched onto a CPU, and on one, or preempted while on
	// one, at the later instant: its stack then is where it ran then
	// (not at the first instant: its stretch on a CPU was cut in between).
	Resumed
)

func (s Since) String() string {
	switch s {
	case Stayed:
		return "stayed"
	case Slept:
		return "slept"
	case SwitchedIn:
		return "switched in"
	case Resumed:
		return "resumed"
	}
	return "since?"
}

// At returns what thread tid was doing at instant at (CLOCK_MONOTONIC
// nanoseconds, see Mono), and what it did after that, no later than
// until.
func (w *Threads) At(tid int, at, until int64) (st State, since Since) {
	th := w.threads[tid]
	if th == nil {
		return Unknown, Stayed
	}
	return th.at(at, until)
}

// Close stops watching every thread.
func (w *Threads) Close() error {
	for tid, th := range w.threads {
		th.close()
		delete(w.threads, tid)
	}
	return nil
}

// thread is one watched thread: its perf event and ring buffer.
type thread struct {
	fd   int
	mem  []byte
	meta *unix.PerfEventMmapPage
	data []byte
	// since is when records began (CLOCK_MONOTONIC ns): the state at an
	// earlier instant is unknown. clock0 is the task clock then.
	since  int64
	clock0 uint64
	// A thread with no switch since the watch began is in the state its
	// task clock said (quiet), as long as the ring buffer's head is still
	// quietHead (a switch writes a record): no read of the clock, a
	// system call, per query of an idle thread.
	quietHead  uint64
	quiet      State
	clockReads int
	// asleep: /proc said the thread slept just after the watch began.
	asleep bool
}

// open watches thread tid of process pid.
func open(pid, tid int) (*thread, error) {
	attr := unix.PerfEventAttr{
		Type:        unix.PERF_TYPE_SOFTWARE,
		Config:      unix.PERF_COUNT_SW_TASK_CLOCK,
		Sample_type: unix.PERF_SAMPLE_TIME,
		// exclude_kernel lets perf_event_paranoid 2 (user-space
		// measurements only) open it; the switch records and the task
		// clock do not depend on it.
		Bits: unix.PerfBitContextSwitch | unix.PerfBitSampleIDAll | unix.PerfBitUseClockID |
			unix.PerfBitWriteBackward | unix.PerfBitExcludeKernel | unix.PerfBitExcludeHv,
		Clockid: unix.CLOCK_MONOTONIC,
	}
	attr.Size = uint32(unsafe.Sizeof(attr))
	fd, err := unix.PerfEventOpen(&attr, tid, -1, -1, unix.PERF_FLAG_FD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("watch context switches of thread %d of process %d (perf_event_open): %w", tid, pid, err)
	}
	page := os.Getpagesize()
	// A read-only mapping is an overwritable ring buffer: the kernel never
	// waits for a reader, and keeps the newest records.
	mem, err := unix.Mmap(fd, 0, page*(1+dataPages), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("map the context-switch records of thread %d of process %d: %w", tid, pid, err)
	}
	th := &thread{fd: fd, mem: mem, meta: (*unix.PerfEventMmapPage)(unsafe.Pointer(&mem[0]))}
	off, size := th.meta.Data_offset, th.meta.Data_size
	if size == 0 { // before Linux 4.1: the data follow the first page
		off, size = uint64(page), uint64(page*dataPages)
	}
	if off+size > uint64(len(mem)) || size&(size-1) != 0 {
		th.close()
		return nil, fmt.Errorf("context-switch records of thread %d: ring buffer at %d+%d outside the %d-byte mapping", tid, off, size, len(mem))
	}
	th.data = mem[off : off+size]
	if th.clock0, err = th.clock(); err != nil {
		th.close()
		return nil, fmt.Errorf("read the task clock of thread %d of process %d: %w", tid, pid, err)
	}
	// Records begin with the event: a thread asleep after it, with no
	// record since, has been asleep all along (see at).
	th.asleep = procfs.TaskState(pid, tid) == 'S'
	th.since = Now()
	return th, nil
}

// clock reads the thread's task clock (nanoseconds on a CPU), brought up
// to date by the kernel when the thread is running.
func (th *thread) clock() (uint64, error) {
	th.clockReads++
	var b [8]byte
	n, err := unix.Read(th.fd, b[:])
	if err != nil {
		return 0, err
	}
	if n != len(b) {
		return 0, fmt.Errorf("read %d bytes, want %d", n, len(b))
	}
	return binary.LittleEndian.Uint64(b[:]), nil
}

func (th *thread) close() {
	if th.mem != nil {
		_ = unix.Munmap(th.mem)
		th.mem, th.meta, th.data = nil, nil, nil
	}
	_ = unix.Close(th.fd)
}

// at returns the thread's state at instant at from its records, and
// what it did after it, by until (see At): the newest switch at or
// before at says the state; when every record is newer, the oldest one
// says what came before it, provided the buffer still holds every record
// since the watch began; with no record at all the thread has not
// switched since, and its task clock says whether it has been running
// all along (else it is asleep, if /proc said so when the watch began,
// or off).
func (th *thread) at(at, until int64) (State, Since) {
	if at < th.since {
		return Unknown, Stayed
	}
	data := th.data
	size := uint64(len(data))
	mask := size - 1
	head := atomic.LoadUint64(&th.meta.Data_head)
	var walked uint64
	complete := false
	oldest := uint16(0) // misc of the oldest switch seen after at
	seen, since := false, Stayed
	state := Unknown
	// switchedIn: a switch in after at, by until; then: the state at
	// until, from the newest record by then (the walk goes newest first).
	switchedIn, then := false, Unknown
	for walked < size {
		off := (head + walked) & mask
		typ := binary.LittleEndian.Uint32(data[off:])
		misc := binary.LittleEndian.Uint16(data[off+4:])
		n := uint64(binary.LittleEndian.Uint16(data[off+6:]))
		if n == 0 {
			complete = true // the zeroed part never written: all history
			break
		}
		if n < 8 || n&7 != 0 || walked+n > size {
			break
		}
		if typ == unix.PERF_RECORD_SWITCH && n >= 16 {
			t := int64(binary.LittleEndian.Uint64(data[(off+8)&mask:]))
			if t <= at {
				state = fromRecord(misc)
				walked += n
				break
			}
			oldest, seen = misc, true
			if t <= until {
				if then == Unknown {
					then = fromRecord(misc)
				}
				switch {
				case misc&miscOut == 0:
					switchedIn = true
				case misc&miscPreempt == 0:
					since = Slept
				}
			}
		}
		walked += n
	}
	// The kernel writes backwards, over the oldest records: what was read
	// stands if the bytes written meanwhile did not reach it.
	if written := head - atomic.LoadUint64(&th.meta.Data_head); written+walked > size {
		return Unknown, Stayed
	}
	if switchedIn {
		since = SwitchedIn
		if then == Running || then == Runnable {
			since = Resumed
		}
	}
	switch {
	case state != Unknown:
		return state, since
	case !complete:
		return Unknown, Stayed
	case seen && oldest&miscOut != 0:
		return Running, since // switched out after at: it was on a CPU then
	case seen:
		return Off, since // switched in after at
	}
	if th.quiet != Unknown && th.quietHead == head {
		return th.quiet, Stayed
	}
	c, err := th.clock()
	if err != nil {
		return Unknown, Stayed
	}
	st := Off
	switch {
	case c > th.clock0:
		st = Running // ran without a switch since the watch began
	case th.asleep:
		// Asleep when the watch began and not switched in since:
		// asleep still, as far as the records can tell (woken, it is
		// runnable until it is switched in, which writes a record).
		st = Asleep
	}
	if atomic.LoadUint64(&th.meta.Data_head) == head {
		// No switch between the walk and the clock's read: it stands
		// until one.
		th.quietHead, th.quiet = head, st
	}
	return st, Stayed
}

func fromRecord(misc uint16) State {
	switch {
	case misc&miscOut == 0:
		return Running
	case misc&miscPreempt != 0:
		return Runnable
	}
	return Asleep
}

// Now is CLOCK_MONOTONIC in nanoseconds, the clock of the records, read
// through Go's clock (the vDSO: no system call). unix.ClockGettime is a
// system call, and each one made through the runtime's entry wakes its
// monitor thread when that sleeps: a futex wake and the monitor's own
// nanosleeps per tick, which doubled record's cost per tick on one
// spinning thread (35 to 71 µs at 2 kHz, nonblocking).
func Now() int64 { return Mono(time.Now()) }

// clockMonotonic reads CLOCK_MONOTONIC with a system call (calibrate's
// reference).
func clockMonotonic() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0
	}
	return ts.Nano()
}

var base struct {
	once sync.Once
	t    time.Time
	mono int64
}

// Mono converts t, a time.Time with a monotonic reading (from time.Now),
// to CLOCK_MONOTONIC nanoseconds, the clock of the records (Go's
// monotonic clock is CLOCK_MONOTONIC, but its readings count from the
// program's start).
func Mono(t time.Time) int64 {
	base.once.Do(calibrate)
	return base.mono + int64(t.Sub(base.t))
}

// calibrate pairs a time.Now with CLOCK_MONOTONIC: a time.Now read
// between two clock readings, the closest of a few tries (a thread
// switched out between the readings would put every instant asked about
// that much off, and a sampler's ticks on a busy machine are that far
// apart from what it asks).
func calibrate() {
	best := int64(-1)
	for i := 0; i < 50; i++ {
		a := clockMonotonic()
		t := time.Now()
		b := clockMonotonic()
		if gap := b - a; best < 0 || gap < best {
			best, base.t, base.mono = gap, t, a+gap/2
		}
		if best <= 2000 {
			return
		}
	}
}

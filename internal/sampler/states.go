package sampler

import (
	"strconv"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rbscope/rbscope/internal/procfs"
)

// taskStates reads the kernel state of threads of a process from
// /proc/PID/task/TID/stat, keeping each file open and re-reading it with
// pread (procfs regenerates the contents at offset 0). It reads only the
// threads it is given, never the whole task list: a process with a
// hundred native threads that never run Ruby costs none of their reads.
type taskStates struct {
	dir  string
	fds  map[int]int // tid -> open stat file
	cur  map[int]byte
	seen map[int]bool
	buf  [1024]byte
}

func newTaskStates(pid int) *taskStates {
	return &taskStates{
		dir: "/proc/" + strconv.Itoa(pid) + "/task/",
		fds: map[int]int{}, cur: map[int]byte{}, seen: map[int]bool{},
	}
}

// read reads the state of each thread tids[i] with need[i] set, forgets
// the state of the others, keeps the files of tids open (a thread not
// read now may be next time) and closes those of threads not in tids. A
// thread that exited, or whose file cannot be opened, has no state (0).
func (ts *taskStates) read(tids []int, need []bool) {
	clear(ts.seen)
	for i, tid := range tids {
		ts.seen[tid] = true
		delete(ts.cur, tid)
		if !need[i] {
			continue
		}
		fd, ok := ts.fds[tid]
		if !ok {
			var err error
			if fd, err = unix.Open(ts.dir+strconv.Itoa(tid)+"/stat", unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
				continue // exited
			}
			ts.fds[tid] = fd
		}
		if k := pread(fd, ts.buf[:]); k > 0 {
			ts.cur[tid] = procfs.StateLetter(ts.buf[:k])
		}
	}
	for tid, fd := range ts.fds {
		if !ts.seen[tid] {
			unix.Close(fd)
			delete(ts.fds, tid)
		}
	}
}

// pread reads from offset 0 of fd as a raw system call (see
// target.vmReadv for why a short call is not announced to the
// scheduler), returning the bytes read or 0 on an error (a thread that
// exited reads ESRCH).
func pread(fd int, buf []byte) int {
	n, _, errno := unix.RawSyscall6(unix.SYS_PREAD64, uintptr(fd), uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), 0, 0, 0)
	if errno != 0 {
		return 0
	}
	return int(n)
}

func (ts *taskStates) state(tid int) byte { return ts.cur[tid] }

func (ts *taskStates) close() {
	for tid, fd := range ts.fds {
		unix.Close(fd)
		delete(ts.fds, tid)
	}
}

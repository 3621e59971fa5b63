package sampler

import (
	"github.com/rbscope/rbscope/internal/procfs"
)

// taskStates reads the kernel state of threads of a process from
// /proc/PID/task/TID/stat, keeping each file open and re-reading it
// (procfs.StatFile). It reads only the threads it is given, never the
// whole task list: a process with a hundred native threads that never
// run Ruby costs none of their reads.
type taskStates struct {
	pid   int
	files map[int]*procfs.StatFile // tid -> open stat file
	cur   map[int]byte
	seen  map[int]bool
	buf   [1024]byte
	reads int // states read so far
}

func newTaskStates(pid int) *taskStates {
	return &taskStates{pid: pid, files: map[int]*procfs.StatFile{}, cur: map[int]byte{}, seen: map[int]bool{}}
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
		f, ok := ts.files[tid]
		if !ok {
			var err error
			if f, err = procfs.OpenTaskStat(ts.pid, tid); err != nil {
				continue // exited
			}
			ts.files[tid] = f
		}
		ts.reads++
		if st := f.State(ts.buf[:]); st != 0 {
			ts.cur[tid] = st
		}
	}
	for tid, f := range ts.files {
		if !ts.seen[tid] {
			f.Close()
			delete(ts.files, tid)
		}
	}
}

func (ts *taskStates) state(tid int) byte { return ts.cur[tid] }

func (ts *taskStates) close() {
	for tid, f := range ts.files {
		f.Close()
		delete(ts.files, tid)
	}
}

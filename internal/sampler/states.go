package sampler

import (
	"os"
	"strconv"

	"github.com/rbscope/rbscope/internal/procfs"
)

// refreshRuby reads the kernel state of the threads tids only (the Ruby
// threads of the last sample), opening the stat file of a thread not seen
// before and closing those of threads no longer sampled: a process with a
// hundred native threads that never run Ruby costs none of their reads.
// A thread that is new in this sample has no state until the next one.
// With no tids yet (the first sample), or when none of them can be read
// any more, it falls back to refresh, which lists every thread.
func (ts *taskStates) refreshRuby(tids []int) error {
	if len(tids) == 0 {
		return ts.refresh()
	}
	clear(ts.seen)
	alive := 0
	for _, tid := range tids {
		ts.seen[tid] = true
		f := ts.files[tid]
		if f == nil {
			var err error
			if f, err = os.Open(ts.dir + strconv.Itoa(tid) + "/stat"); err != nil {
				delete(ts.cur, tid)
				continue // exited
			}
			ts.files[tid] = f
		}
		k, err := f.ReadAt(ts.buf, 0)
		if k == 0 && err != nil {
			f.Close()
			delete(ts.files, tid)
			delete(ts.cur, tid)
			continue
		}
		alive++
		ts.cur[tid] = procfs.StateLetter(ts.buf[:k])
	}
	for tid, f := range ts.files {
		if !ts.seen[tid] {
			f.Close()
			delete(ts.files, tid)
			delete(ts.cur, tid)
		}
	}
	ts.tids = append(ts.tids[:0], tids...)
	if alive == 0 {
		return ts.refresh()
	}
	return nil
}

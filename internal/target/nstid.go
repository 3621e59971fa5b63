package target

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rbscope/rbscope/internal/procfs"
)

// nsTIDs is the live target's map of namespace thread ids to host ids.
type nsTIDs struct {
	// same is set once the process is known to be in rbscope's PID
	// namespace: then no lock is taken.
	same    atomic.Bool
	mu      sync.Mutex
	checked bool // whether the process's namespace was looked at
	m       map[int]int
	hosts   []int     // the process's host tids (sorted) when m was read
	at      time.Time // when hosts was last compared with the task list
}

// nsTIDMaxAge is how long a map of thread ids is trusted before the
// process's task list is compared with the one it was read with (a
// thread's namespace id may be reused after it exits), and nsTIDMissAge
// how old the comparison must be to be made again for an id the map
// lacks (a thread new since). Reading the map costs a status file per
// thread (about 130 µs each measured on this project's loaded VM); the
// task list is one directory read, and the map is read again only when
// the list changed, so a lingering id costs no status reads.
const (
	nsTIDMaxAge  = time.Second
	nsTIDMissAge = 20 * time.Millisecond
)

// HostTID translates thread id tid of the target's PID namespace into
// this host's (see Target.HostTID). For a process in rbscope's own
// namespace it returns tid.
func (l *live) HostTID(tid int) int {
	n := &l.ns
	if n.same.Load() || tid <= 0 {
		return max(tid, 0)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.checked {
		ns, err := procfs.ReadTaskNSpid(l.pid, l.pid)
		if err != nil {
			return 0 // exited: no thread to name
		}
		n.checked = true
		if len(ns) < 2 {
			n.same.Store(true)
			return tid
		}
	}
	now := time.Now()
	h, ok := n.m[tid]
	age := now.Sub(n.at)
	if n.m != nil && ((ok && age < nsTIDMaxAge) || (!ok && age < nsTIDMissAge)) {
		return h
	}
	tasks, err := procfs.Tasks(l.pid)
	if err != nil {
		return 0
	}
	slices.Sort(tasks)
	if n.m == nil || !slices.Equal(tasks, n.hosts) {
		m, err := procfs.NamespaceTIDs(l.pid)
		if err != nil {
			return 0
		}
		if m == nil {
			m = map[int]int{}
		}
		n.m, n.hosts = m, tasks
	}
	n.at = now
	return n.m[tid]
}

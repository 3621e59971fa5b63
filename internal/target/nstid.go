package target

import (
	"sync"
	"time"

	"github.com/rbscope/rbscope/internal/procfs"
)

// nsTIDs is the live target's map of namespace thread ids to host ids.
type nsTIDs struct {
	mu      sync.Mutex
	checked bool // whether the process's namespace was looked at
	foreign bool // the process is in another PID namespace
	m       map[int]int
	at      time.Time // when m was read
}

// nsTIDMaxAge is how long a map of thread ids is used before it is read
// again (a thread's namespace id may be reused by a new thread after it
// exits), and nsTIDMissAge how old it must be to be read again for an id
// it lacks (a thread new since), so that a lingering id does not cost a
// read of every thread's status each tick.
const (
	nsTIDMaxAge  = time.Second
	nsTIDMissAge = 20 * time.Millisecond
)

// HostTID translates thread id tid of the target's PID namespace into
// this host's (see Target.HostTID). For a process in rbscope's own
// namespace it returns tid.
func (l *live) HostTID(tid int) int {
	if tid <= 0 {
		return 0
	}
	n := &l.ns
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.checked {
		ns, err := procfs.ReadTaskNSpid(l.pid, l.pid)
		if err != nil {
			return 0 // exited: no thread to name
		}
		n.checked, n.foreign = true, len(ns) > 1
	}
	if !n.foreign {
		return tid
	}
	now := time.Now()
	h, ok := n.m[tid]
	age := now.Sub(n.at)
	if (ok && age < nsTIDMaxAge) || (!ok && n.m != nil && age < nsTIDMissAge) {
		return h
	}
	m, err := procfs.NamespaceTIDs(l.pid)
	if err != nil {
		return 0
	}
	if m == nil {
		m = map[int]int{}
	}
	n.m, n.at = m, now
	return m[tid]
}

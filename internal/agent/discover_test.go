package agent

import (
	"testing"

	"github.com/rbscope/rbscope/internal/procfs"
)

// TestOpenQueue: processes waiting for an open are taken newest and
// oldest in turn, those gone or exec'd since they were queued leave the
// queue at the next prune, and past maxQueued the oldest is dropped and
// may be asked for again.
func TestOpenQueue(t *testing.T) {
	d := newDiscovery(&Agent{})
	for pid := 1; pid <= 6; pid++ {
		s := &seen{ident: procfs.Identity{StartTime: uint64(pid)}}
		d.seen[pid] = s
		d.request(pid, s)
	}
	take := func() int {
		at := d.next()
		if at < 0 {
			return 0
		}
		pid := d.queue[at].pid
		d.take(at)
		return pid
	}
	if a, b := take(), take(); a != 6 || b != 1 {
		t.Errorf("took %d then %d, want the newest (6) then the oldest (1)", a, b)
	}
	// 3 exited, 4 exec'd: neither is opened.
	delete(d.seen, 3)
	d.seen[4] = &seen{ident: procfs.Identity{StartTime: 40}}
	d.prune()
	var got []int
	for pid := take(); pid != 0; pid = take() {
		got = append(got, pid)
	}
	if len(got) != 2 || got[0] != 5 || got[1] != 2 {
		t.Errorf("after the prune took %v, want [5 2]", got)
	}
	if d.inflight != 4 { // 6, 1, 5 and 2 handed to workers
		t.Errorf("inflight %d, want 4", d.inflight)
	}

	d = newDiscovery(&Agent{})
	for pid := 1; pid <= maxQueued+1; pid++ {
		s := &seen{ident: procfs.Identity{StartTime: uint64(pid)}}
		d.seen[pid] = s
		d.request(pid, s)
	}
	if len(d.queue) != maxQueued || d.queue[0].pid != 2 || d.seen[1].opening || d.inflight != maxQueued {
		t.Errorf("past maxQueued: %d queued from pid %d, pid 1 opening %v, inflight %d", len(d.queue), d.queue[0].pid, d.seen[1].opening, d.inflight)
	}
}

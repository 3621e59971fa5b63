package output

import (
	"fmt"
	"sort"

	"github.com/rbscope/rbscope/internal/stack"
)

// activityTally counts each thread's samples by activity.
type activityTally struct {
	threads map[stack.ThreadKey]*threadTally
	order   []stack.ThreadKey
	// onTID is the thread last seen on each native thread (pid, tid):
	// unread samples carry only the tid.
	onTID map[[2]int]stack.ThreadKey
}

type threadTally struct {
	id     stack.ThreadKey
	tid    int // the latest native thread seen, 0 when none
	name   string
	total  int
	counts map[stack.Activity]int
	unread int // samples of total whose stack could not be read
}

func (a *activityTally) add(s *stack.Sample) {
	k := s.Key()
	t := a.thread(k)
	if s.TID != 0 {
		t.tid = s.TID
		if a.onTID == nil {
			a.onTID = map[[2]int]stack.ThreadKey{}
		}
		a.onTID[[2]int{s.Pid, s.TID}] = k
	}
	if s.ThreadName != "" {
		t.name = s.ThreadName
	}
	act := s.Activity
	if act == "" {
		act = stack.ActivityUnknown
	}
	t.counts[act]++
	t.total++
}

func (a *activityTally) thread(id stack.ThreadKey) *threadTally {
	if a.threads == nil {
		a.threads = map[stack.ThreadKey]*threadTally{}
	}
	t := a.threads[id]
	if t == nil {
		t = &threadTally{id: id, tid: id.TID, counts: map[stack.Activity]int{}}
		a.threads[id] = t
		a.order = append(a.order, id)
	}
	return t
}

// addUnread counts the samples whose stack could not be read.
func (a *activityTally) addUnread(us []UnreadThread) {
	for _, u := range us {
		k, ok := a.onTID[[2]int{u.Pid, u.TID}]
		if !ok {
			k = stack.ThreadKey{Pid: u.Pid, TID: u.TID}
		}
		t := a.thread(k)
		if t.name == "" {
			t.name = u.Name
		}
		for act, n := range u.ByActivity {
			if act == "" {
				act = stack.ActivityUnknown
			}
			t.counts[act] += n
			t.total += n
			t.unread += n
		}
	}
}

// known reports whether any sample carried an activity (recordings made
// before activities existed carry none).
func (a *activityTally) known() bool {
	for _, t := range a.threads {
		if t.counts[stack.ActivityUnknown] != t.total {
			return true
		}
	}
	return false
}

// write prints one row per thread (by pid, then tid): its samples and the
// share of each activity.
//
//	thread activity                 samples  running gvl_wait  blocked       gc
//	  worker-1 (pid 4242 tid 4250)      500    40.0%    35.0%    20.0%     5.0%
func (a *activityTally) write(cw *countingWriter) {
	if !a.known() {
		return
	}
	ids := append([]stack.ThreadKey(nil), a.order...)
	sort.SliceStable(ids, func(i, j int) bool {
		if ids[i].Pid != ids[j].Pid {
			return ids[i].Pid < ids[j].Pid
		}
		return a.threads[ids[i]].tid < a.threads[ids[j]].tid
	})
	unknown := false
	unread := 0
	for _, t := range a.threads {
		if t.counts[stack.ActivityUnknown] > 0 {
			unknown = true
		}
		unread += t.unread
	}
	if unread > 0 {
		cw.printf("\nthread activity (share of each thread's samples, %d whose stack could not be read included)\n", unread)
	} else {
		cw.printf("\nthread activity (share of each thread's samples)\n")
	}
	cw.printf("%8s %8s %8s %8s %8s", "samples", "running", "gvl_wait", "blocked", "gc")
	if unknown {
		cw.printf(" %8s", "unknown")
	}
	cw.printf("  thread\n")
	for _, id := range ids {
		t := a.threads[id]
		pct := func(act stack.Activity) string {
			return fmt.Sprintf("%7.1f%%", 100*float64(t.counts[act])/float64(t.total))
		}
		cw.printf("%8d %8s %8s %8s %8s", t.total, pct(stack.ActivityRunning), pct(stack.ActivityGVLWait), pct(stack.ActivityBlocked), pct(stack.ActivityGC))
		if unknown {
			cw.printf(" %8s", pct(stack.ActivityUnknown))
		}
		name := t.name
		if name == "" {
			name = "?"
		}
		cw.printf("  %s (pid %d tid %s)\n", name, id.Pid, stack.TIDText(t.tid))
	}
}

package ruby

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/procfs"
	"github.com/rbscope/rbscope/internal/stack"
	"github.com/rbscope/rbscope/internal/testutil"
)

// TestConsistencyPerRequest: each snapshot says what holds still while it
// reads (Req), whatever the process was opened as. The "threads" scenario
// (two sleepers, a spinner) is stopped with SIGSTOP; then a Running and a
// Stopped snapshot read the same stacks, a HolderStopped one naming the
// GVL's holder too, one naming a sleeper is refused with a *HolderError,
// and one naming no thread is refused.
func TestConsistencyPerRequest(t *testing.T) {
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		rb.SetProfilerEnv(t)
		proc := rb.Start(t, "stacks.rb", "threads")
		reports(t, proc)
		_, p := snapshotLive(t, proc.Pid)
		if err := syscall.Kill(proc.Pid, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		defer syscall.Kill(proc.Pid, syscall.SIGCONT)
		tids, err := procfs.Tasks(proc.Pid)
		if err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
			stopped := 0
			for _, tid := range tids {
				if procfs.TaskState(proc.Pid, tid) == 'T' {
					stopped++
				}
			}
			if stopped == len(tids) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d of %d threads stopped after SIGSTOP", stopped, len(tids))
			}
		}
		running, err := p.SnapshotWith(Req{Consistency: Running})
		if err != nil {
			t.Fatalf("Running snapshot: %v", err)
		}
		stopped, err := p.SnapshotWith(Req{Consistency: Stopped})
		if err != nil {
			t.Fatalf("Stopped snapshot: %v", err)
		}
		if a, b := describe(running), describe(stopped); a != b {
			t.Errorf("a Running and a Stopped snapshot of the stopped process differ:\n%s\n---\n%s", a, b)
		}
		holder := slices.IndexFunc(running, func(th stack.Thread) bool { return th.GVL })
		if holder >= 0 {
			held, err := p.SnapshotWith(Req{Consistency: HolderStopped, Holder: running[holder].TID})
			if err != nil {
				t.Fatalf("HolderStopped snapshot naming the holder, thread %d: %v", running[holder].TID, err)
			}
			if a, b := describe(running), describe(held); a != b {
				t.Errorf("a Running and a HolderStopped snapshot of the stopped process differ:\n%s\n---\n%s", a, b)
			}
		} else {
			t.Logf("no thread held the GVL when the process stopped")
		}
		sleeper, ok := findThread(running, "alpha-worker")
		if !ok {
			t.Fatalf("no alpha-worker thread: %s", describe(running))
		}
		var he *HolderError
		if _, err := p.SnapshotWith(Req{Consistency: HolderStopped, Holder: sleeper.TID}); !errors.As(err, &he) {
			t.Errorf("HolderStopped snapshot naming a sleeping thread: %v, want a *HolderError", err)
		}
		if _, err := p.SnapshotWith(Req{Consistency: HolderStopped}); err == nil || !strings.Contains(err.Error(), "Req.Holder") {
			t.Errorf("HolderStopped snapshot naming no thread: %v, want an error naming Req.Holder", err)
		}
	})
}

// describe is threads' tids, names, errors and frames, one thread a line.
func describe(threads []stack.Thread) string {
	var b strings.Builder
	for _, th := range threads {
		b.WriteString(th.Name)
		b.WriteString(" ")
		b.WriteString(th.Error)
		for _, f := range th.Frames {
			b.WriteString(" < ")
			fmt.Fprintf(&b, "%s (%s:%d)", f.Name, f.Path, f.Line)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// TestSnapshotThread: SnapshotThread reads one thread's stack, the same as
// a whole snapshot's for that thread, with fewer remote reads than it, and
// refuses a native thread no Ruby thread runs on.
func TestSnapshotThread(t *testing.T) {
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		_, all, p, rc := snapshotCounted(t, rb, "threads", "alpha-worker")
		for _, name := range []string{"alpha-worker", "beta-worker"} {
			th, ok := findThread(all, name)
			if !ok {
				t.Fatalf("no %s thread: %s", name, describe(all))
			}
			iov0 := rc.ReadIovecs()
			whole, err := p.Snapshot()
			if err != nil {
				t.Fatal(err)
			}
			iovAll := rc.ReadIovecs() - iov0
			iov0 = rc.ReadIovecs()
			one, err := p.SnapshotThread(Req{}, th.TID)
			if err != nil {
				t.Fatalf("SnapshotThread(%d): %v", th.TID, err)
			}
			iovOne := rc.ReadIovecs() - iov0
			w, _ := findThread(whole, name)
			if a, b := describe([]stack.Thread{w}), describe([]stack.Thread{one}); a != b {
				t.Errorf("%s: SnapshotThread read\n%s, a whole snapshot\n%s", name, b, a)
			}
			t.Logf("%s: %d remote iovecs for the thread, %d for every thread", name, iovOne, iovAll)
			if iovOne >= iovAll {
				t.Errorf("%s: SnapshotThread read %d iovecs, a whole snapshot %d", name, iovOne, iovAll)
			}
		}
		if _, err := p.SnapshotThread(Req{}, 1<<22+7); !errors.Is(err, ErrNoThread) {
			t.Errorf("SnapshotThread of a native thread no Ruby thread runs on: %v, want ErrNoThread", err)
		}
	})
}

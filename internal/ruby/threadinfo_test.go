package ruby

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/stack"
	"github.com/rbscope/rbscope/internal/target"
	"github.com/rbscope/rbscope/internal/testutil"
)

// threadReport is one line of testdata/ruby/names.rb: Ruby's own view of
// one thread.
type threadReport struct {
	TID    int     `json:"tid"`
	Name   *string `json:"name"`   // Thread#name (nil: none)
	Status any     `json:"status"` // Thread#status
	Main   bool    `json:"main"`
	Comm   string  `json:"comm"`  // the kernel's name of its native thread
	Start  *string `json:"start"` // FILE:LINE of its block, from Thread#inspect
}

// threadReports parses names.rb's lines.
func threadReports(t *testing.T, p *testutil.Proc) []threadReport {
	t.Helper()
	var out []threadReport
	for _, l := range p.Lines {
		var r threadReport
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("bad report line %q: %v", l, err)
		}
		out = append(out, r)
	}
	if len(out) != 9 {
		t.Fatalf("names.rb reported %d threads, want 9", len(out))
	}
	return out
}

// TestThreadNamesAndStatuses: every thread of names.rb has Thread#status's
// word as its state (run, sleep, aborting: a thread killed while it runs
// its ensure clause), and its whole name: Thread#name however long; for a
// thread without one, the file:line of its block, as Ruby names its
// native thread before the kernel cuts it to 15 bytes (checked against
// Thread#inspect's location and the cut name in /proc); else (the main
// thread) the kernel's name, said to be so. The stack of the thread in
// its ensure clause is read too, named as Ruby names the clause.
func TestThreadNamesAndStatuses(t *testing.T) {
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		rb.SetProfilerEnv(t)
		proc := rb.Start(t, "names.rb")
		want := threadReports(t, proc)
		tg, err := target.OpenLive(proc.Pid)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tg.Close() })
		p, err := Open(context.Background(), Spec{Target: tg, Consistency: Running})
		if err != nil {
			t.Fatal(err)
		}
		if !p.rt.o.thToKill.ok {
			t.Errorf("layout %s: no to_kill flag: a thread being killed cannot read as aborting", p.LayoutSource())
		}
		// The busy threads' stacks may change while they are read:
		// take snapshots until the one in its ensure clause is read.
		var threads []stack.Thread
		var aborting *stack.Thread
		for i := 0; i < 50 && aborting == nil; i++ {
			if threads, err = p.Snapshot(); err != nil {
				t.Fatal(err)
			}
			for j := range threads {
				if th := &threads[j]; th.Name == "aborting" && th.Error == "" {
					aborting = th
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
		byTID := map[int]stack.Thread{}
		for _, th := range threads {
			byTID[th.TID] = th
		}
		for _, r := range want {
			th, ok := byTID[r.TID]
			if !ok {
				t.Errorf("thread %d (%v) not in the snapshot", r.TID, r.Name)
				continue
			}
			if status, _ := r.Status.(string); th.State != status {
				t.Errorf("thread %d (%s): state %q, Thread#status %v", r.TID, th.Name, th.State, r.Status)
			}
			switch {
			case r.Name != nil:
				if th.Name != *r.Name || th.NameSource != stack.NameRuby {
					t.Errorf("thread %d: name %q from %q, want Thread#name %q", r.TID, th.Name, th.NameSource, *r.Name)
				}
			case r.Main:
				if th.Name != r.Comm || th.NameSource != stack.NameKernel {
					t.Errorf("main thread: name %q from %q, want the kernel's %q", th.Name, th.NameSource, r.Comm)
				}
			default:
				if r.Start == nil || cutLikeRuby(*r.Start) != r.Comm {
					t.Fatalf("names.rb: thread %d started at %v, named %q by the kernel: not Ruby's name", r.TID, r.Start, r.Comm)
				}
				if th.Name != *r.Start || th.NameSource != stack.NameStart {
					t.Errorf("unnamed thread %d: name %q from %q, want %q (the kernel has %q)", r.TID, th.Name, th.NameSource, *r.Start, r.Comm)
				}
			}
		}
		if aborting == nil {
			t.Fatal("the stack of the thread in its ensure clause was never read")
		}
		names := []string{}
		for _, f := range aborting.Frames {
			names = append(names, f.Name)
		}
		if !slices.Contains(names, "ensure in block in <main>") || names[len(names)-1] != "block in <main>" {
			t.Errorf("thread in its ensure clause: %v", names)
		}
	})
}

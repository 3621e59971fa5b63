package ruby

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/stack"
	"github.com/rbscope/rbscope/internal/testutil"
)

// forkScript forks a child that sleeps, and prints the child's pid and
// the line of its sleep before "ready".
const forkScript = `$stdout.sync = true
child = fork do
  sleep # the child's sleep
end
puts "child #{child} #{__LINE__ - 2}"
puts "ready"
sleep
`

// TestForkSharesRuntime: a fork opened after its parent with the same
// Runtimes gets the parent's Runtime itself (made once: one layout
// resolution, one hit), and its stack is named right with it.
func TestForkSharesRuntime(t *testing.T) {
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		proc := rb.StartSource(t, "fork.rb", forkScript)
		script := proc.Cmd.Args[len(proc.Cmd.Args)-1]
		var child, line int
		for _, l := range proc.Lines {
			if _, err := fmt.Sscanf(l, "child %d %d", &child, &line); err == nil {
				break
			}
		}
		if child == 0 {
			t.Fatalf("the script printed no child pid: %q", proc.Lines)
		}
		rts := NewRuntimes()
		parent, forked := openRunningWith(t, proc.Pid, rts), openRunningWith(t, child, rts)
		if parent.Runtime() != forked.Runtime() {
			t.Errorf("the fork has a Runtime of its own (%p, parent's %p)", forked.Runtime(), parent.Runtime())
		}
		if st := rts.Stats(); st.LayoutResolutions != 1 || st.LayoutHits != 1 || st.Builds != 1 {
			t.Errorf("runtimes after a parent and its fork: %+v, want 1 resolution, 1 hit, 1 build", st)
		}
		// The parent prints the child's pid as soon as it forked: the
		// child may not have reached its sleep yet (under load it was
		// still in Kernel#fork), so its stack is read until it has.
		want := "block in <main> (" + script + ":" + strconv.Itoa(line) + ")"
		var threads []stack.Thread
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			var err error
			threads, err = forked.Snapshot()
			if err != nil {
				t.Fatalf("snapshot the fork: %v", err)
			}
			for _, th := range threads {
				for _, f := range th.Frames {
					if f.Kind == stack.KindRuby && f.Name == "block in <main>" && f.Path == script && f.Line == line {
						return
					}
				}
			}
			if time.Now().After(deadline) {
				break
			}
		}
		var got []string
		for _, th := range threads {
			for _, f := range th.Frames {
				got = append(got, fmt.Sprintf("%s (%s:%d)", f.Name, f.Path, f.Line))
			}
		}
		t.Errorf("the fork's stack lacks %s: %s", want, strings.Join(got, "; "))
	})
}

// TestHiddenSerialsShared: on Rubies that keep class paths in hidden
// ivars (before 3.2), the second process of a build takes the symbol
// serials of their names from the first (Runtime.hiddenHint), checked in
// its own symbol table, instead of searching a few hundred serials; its
// stacks are still Ruby's own (caller_locations). Later Rubies never
// search.
func TestHiddenSerialsShared(t *testing.T) {
	testutil.NeedRoot(t)
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		rts := NewRuntimes()
		var ps [2]*Process
		for i := range ps {
			rb.SetProfilerEnv(t)
			proc := rb.Start(t, "stacks.rb", "nested")
			want := reports(t, proc)["main"]
			ps[i] = openRunningWith(t, proc.Pid, rts)
			ths, err := ps[i].Snapshot()
			if err != nil {
				t.Fatal(err)
			}
			for _, th := range ths {
				if !th.Main {
					checkAgainstRuby(t, th, want)
				}
			}
		}
		first, second := ps[0].n, ps[1].n
		if ps[0].Runtime() != ps[1].Runtime() {
			t.Fatal("two processes of one Ruby have Runtimes of their own")
		}
		if !first.rt.hiddenIvarNames {
			if first.serialsSearched != 0 || second.serialsSearched != 0 || first.rt.hiddenHint.Load() != 0 {
				t.Errorf("Ruby %s keeps no hidden ivar names, but symbol serials were searched (%d, %d)", first.rt.version, first.serialsSearched, second.serialsSearched)
			}
			return
		}
		if first.classpathSerial == 0 || first.attachedSerial == 0 || first.serialsSearched == 0 {
			t.Fatalf("first process: serials %d and %d after a search of %d", first.classpathSerial, first.attachedSerial, first.serialsSearched)
		}
		if second.serialsSearched != 0 || second.classpathSerial != first.classpathSerial || second.attachedSerial != first.attachedSerial {
			t.Errorf("second process: serials %d and %d after a search of %d, want the first's %d and %d without a search",
				second.classpathSerial, second.attachedSerial, second.serialsSearched, first.classpathSerial, first.attachedSerial)
		}
	})
}

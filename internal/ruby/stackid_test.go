package ruby

import (
	"slices"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/stack"
	"github.com/rbscope/rbscope/internal/testutil"
)

// stackIDScript has a thread that sleeps in one place for good and one
// that moves between two places every 20 ms.
const stackIDScript = `
def still; sleep; end
def left; sleep 0.02; end
def right; sleep 0.02; end
Thread.new { Thread.current.name = "still"; still }
Thread.new { Thread.current.name = "mover"; loop { left; right } }
sleep 0.2
$stdout.puts "ready"
$stdout.flush
sleep
`

// TestStackIDs snapshots a process many times: a thread whose stack stays
// keeps its stack ID from snapshot to snapshot; a stack that changed takes
// another; an ID is never given to other frames, whichever thread.
func TestStackIDs(t *testing.T) {
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		p := openRunning(t, rb.StartSource(t, "stackid.rb", stackIDScript).Pid)
		byID := map[stack.ID][]stack.Frame{}
		last := map[string]stack.Thread{}
		kept, changed := map[string]int{}, map[string]int{}
		for i := 0; i < 60; i++ {
			ths, err := p.Snapshot()
			if err != nil {
				t.Fatal(err)
			}
			for _, th := range ths {
				if th.Error != "" || len(th.Frames) == 0 {
					continue
				}
				if th.Stack == 0 {
					t.Fatalf("snapshot %d: thread %q has frames and no stack ID", i, th.Name)
				}
				if f, ok := byID[th.Stack]; ok && !slices.Equal(f, th.Frames) {
					t.Fatalf("snapshot %d: stack ID %d names %v and %v", i, th.Stack, f, th.Frames)
				}
				byID[th.Stack] = slices.Clone(th.Frames)
				if prev, ok := last[th.Name]; ok {
					same := slices.Equal(prev.Frames, th.Frames)
					if same != (prev.Stack == th.Stack) && !(same && th.Name == "mover") {
						// (The mover may come back to the frames it
						// left, under a new ID.)
						t.Errorf("snapshot %d: thread %q: frames the same %v, ID %d then %d", i, th.Name, same, prev.Stack, th.Stack)
					}
					if prev.Stack == th.Stack {
						kept[th.Name]++
					} else {
						changed[th.Name]++
					}
				}
				last[th.Name] = th
			}
			time.Sleep(7 * time.Millisecond)
		}
		t.Logf("same ID kept: %v; changed: %v", kept, changed)
		if kept["still"] < 50 || changed["still"] != 0 {
			t.Errorf("the sleeping thread kept its ID %d times and changed it %d times of 59", kept["still"], changed["still"])
		}
		if changed["mover"] < 5 {
			t.Errorf("the moving thread's ID changed %d times in 60 snapshots 7 ms apart (it moves every 20 ms)", changed["mover"])
		}
	})
}

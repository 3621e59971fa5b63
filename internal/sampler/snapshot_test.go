package sampler

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/ruby"
	"github.com/rbscope/rbscope/internal/stack"
	"github.com/rbscope/rbscope/internal/testutil"
)

// TestSnapshotRetriesTornStacks: Snapshot of torn.rb, whose two threads
// change their stacks all the time, reads every thread, the looping ones
// as stacks they can have (as rarely torn as TestTornStacks allows), the
// sleeping main thread in Kernel#sleep. A single read of the same process
// finds a looping thread's stack changing now and then, and reads it
// again (the walker's retries, ruby.Process.Torn) or, when it kept
// changing, keeps it under the (stack changed while read) frame or loses
// it: Snapshot is taken until the walker has read stacks again
// wantRetried times or single reads have come back incomplete wantSingle
// times, and must have read every thread every time, whole.
func TestSnapshotRetriesTornStacks(t *testing.T) {
	testutil.NeedRoot(t)
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		_, p := startTestdata(t, rb, "torn.rb")
		// The main thread may still be printing "ready": wait for its
		// sleep, where it then stays.
		for deadline := time.Now().Add(10 * time.Second); !mainAsleep(p); {
			if time.Now().After(deadline) {
				t.Fatal("torn.rb's main thread never went to sleep")
			}
			time.Sleep(10 * time.Millisecond)
		}
		const wantSingle, wantRetried = 10, 200
		single, rounds, torn, keptTorn := 0, 0, 0, 0
		example := ""
		torn0 := p.Torn()
		for start := time.Now(); single < wantSingle && p.Torn()-torn0 < wantRetried && time.Since(start) < 30*time.Second; rounds++ {
			i := rounds
			threads, err := p.Snapshot()
			if err != nil {
				t.Fatalf("single read: %v", err)
			}
			if threadErrors(p.Target().Pid(), threads) != nil || slices.ContainsFunc(threads, func(th stack.Thread) bool { return HasTorn(th.Frames) }) {
				single++
			}
			threads, err = Snapshot(context.Background(), p)
			var te *ThreadErrors
			if errors.As(err, &te) {
				t.Fatalf("round %d: %v", i, err)
			}
			if err != nil {
				t.Fatal(err)
			}
			looping := 0
			for _, th := range threads {
				switch {
				case th.Error != "":
					t.Fatalf("round %d: thread %d %q unread without an error returned: %s", i, th.TID, th.Name, th.Error)
				case th.Main:
					if len(th.Frames) == 0 || th.Frames[0].Name != "Kernel#sleep" {
						t.Errorf("round %d: main thread:\n%s", i, formatFrames(th.Frames))
					}
				case strings.HasPrefix(th.Name, "torn-"):
					looping++
					if HasTorn(th.Frames) {
						keptTorn++
					}
					if why := tornCheck(th.Frames); why != "" {
						torn++
						if torn == 1 {
							example = fmt.Sprintf("round %d: %s: %s\n%s", i, th.Name, why, formatFrames(th.Frames))
						}
					}
				}
			}
			if looping != 2 {
				t.Fatalf("round %d: %d looping threads, want 2", i, looping)
			}
		}
		retried := p.Torn() - torn0
		t.Logf("%s: %d stack reads read again; %d of %d single reads lost a looping thread or kept it under the torn frame; Snapshot read them all (%d torn, %d kept under the torn frame)", rb.Name, retried, single, rounds, torn, keptTorn)
		if keptTorn > 0 {
			t.Errorf("%d stacks of the looping threads kept under the torn frame: Snapshot did not read them again", keptTorn)
		}
		// A torn copy that passes every check stays possible without a
		// pause (see TestTornStacks), and as rare.
		if share := float64(torn) / float64(2*rounds); share > maxTornShare {
			t.Errorf("%d of %d stacks of the looping threads are torn (more than %.2f%%); the first:\n%s", torn, 2*rounds, 100*maxTornShare, example)
		}
		if single == 0 && retried == 0 {
			t.Errorf("no stack of torn.rb was read again in %d rounds: the retries were not put to the test", rounds)
		}
	})
}

// mainAsleep reports whether a snapshot of p finds its main thread in
// Kernel#sleep.
func mainAsleep(p *ruby.Process) bool {
	threads, err := Snapshot(context.Background(), p)
	if err != nil {
		return false
	}
	for _, th := range threads {
		if th.Main {
			return len(th.Frames) > 0 && th.Frames[0].Name == "Kernel#sleep"
		}
	}
	return false
}

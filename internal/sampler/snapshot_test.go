package sampler

import (
	"context"
	"errors"
	"fmt"
	"math"
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
// times, and at least minRounds times, and must have read every thread
// every time, whole.
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
		// At least minRounds rounds, so that the share of torn stacks
		// tells something (see tornSignificance).
		const wantSingle, wantRetried, minRounds = 10, 200, 100
		single, rounds, torn, keptTorn := 0, 0, 0, 0
		example := ""
		torn0 := p.Torn()
		for start := time.Now(); (rounds < minRounds || single < wantSingle && p.Torn()-torn0 < wantRetried) && time.Since(start) < 30*time.Second; rounds++ {
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
		// pause (see TestTornStacks), and as rare: too many when that
		// many or more would come less than once in 1/tornSignificance
		// runs if a share maxTornShare of stacks were torn.
		if tail := binomialTail(torn, 2*rounds, maxTornShare); tail < tornSignificance {
			t.Errorf("%d of %d stacks of the looping threads are torn: that many or more come with probability %.2g if %.2f%% are (the bound); the first:\n%s", torn, 2*rounds, tail, 100*maxTornShare, example)
		} else if torn > 0 {
			t.Logf("%d of %d stacks torn: that many or more come with probability %.2g if %.2f%% are", torn, 2*rounds, tail, 100*maxTornShare)
		}
		if single == 0 && retried == 0 {
			t.Errorf("no stack of torn.rb was read again in %d rounds: the retries were not put to the test", rounds)
		}
	})
}

// tornSignificance is how unlikely the count of torn stacks in
// TestSnapshotRetriesTornStacks must be, if a share maxTornShare of them
// were torn, to say more are. Its rounds end after 200 reads read again,
// often within 20 rounds (40 stacks): one torn stack is then 2.5 %, while
// a rate of 0.75 % gives at least one in 26 % of runs, and TestTornStacks
// measured 0 to 0.21 % over thousands of samples.
const tornSignificance = 0.001

// binomialTail is the probability of k or more successes in n trials of
// probability p each.
func binomialTail(k, n int, p float64) float64 {
	if k <= 0 {
		return 1
	}
	lnN, _ := math.Lgamma(float64(n + 1))
	sum := 0.0
	for i := k; i <= n; i++ {
		a, _ := math.Lgamma(float64(i + 1))
		b, _ := math.Lgamma(float64(n - i + 1))
		sum += math.Exp(lnN - a - b + float64(i)*math.Log(p) + float64(n-i)*math.Log1p(-p))
	}
	return min(sum, 1)
}

// TestBinomialTail checks binomialTail against sums worked by hand.
func TestBinomialTail(t *testing.T) {
	for _, c := range []struct {
		k, n    int
		p, want float64
	}{
		{0, 10, 0.5, 1},
		{1, 1, 0.3, 0.3},
		{2, 3, 0.5, 0.5}, // (3+1)/8
		{1, 34, 0.0075, 1 - math.Pow(0.9925, 34)}, // at least one
		{11, 10, 0.5, 0},
	} {
		if got := binomialTail(c.k, c.n, c.p); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("binomialTail(%d, %d, %g) = %g, want %g", c.k, c.n, c.p, got, c.want)
		}
	}
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

package sampler

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/stack"
	"github.com/rbscope/rbscope/internal/target"
	"github.com/rbscope/rbscope/internal/testutil"
)

// tornCalls are the calls of a thread of testdata/torn.rb: who calls whom,
// and from which of the caller's lines. A caller's line depends on its
// callee (mid calls leaf from one line, other from the next), so a stack
// that mixes two calls is caught.
var tornCalls = map[[2]string]int{
	{"", "block (2 levels) in <main>"}:           0, // the thread's block
	{"block (2 levels) in <main>", "Object#run"}: 20,
	{"Object#run", "Kernel#loop"}:                17,
	{"Kernel#loop", "block in Object#run"}:       17,
	{"block in Object#run", "Object#mid"}:        17,
	{"Object#mid", "Object#leaf"}:                13,
	{"Object#mid", "Object#other"}:               14,
	{"Object#leaf", "Integer#times"}:             7,
	{"Object#other", "Integer#times"}:            10,
	{"Integer#times", "block in Object#leaf"}:    7,
	{"Integer#times", "block in Object#other"}:   10,
}

// tornInnermost are the lines a torn.rb frame may be on as the innermost
// frame (from its def to its end).
var tornInnermost = map[string][2]int{
	"block (2 levels) in <main>": {20, 20},
	"Object#run":                 {16, 18},
	"Kernel#loop":                {17, 17},
	"block in Object#run":        {17, 17},
	"Object#mid":                 {12, 15},
	"Object#leaf":                {6, 8},
	"Object#other":               {9, 11},
	"Integer#times":              {7, 10},
	"block in Object#leaf":       {7, 7},
	"block in Object#other":      {10, 10},
}

// tornCheck returns why a sample of a torn.rb thread is not a stack the
// thread can have, or "". A stack kept under the (stack changed while read)
// frame holds only the outer frames that held still: its innermost frame
// must be a caller, on one of its call sites.
func tornCheck(fs []stack.Frame) string {
	partial := false
	for len(fs) > 0 && fs[0].IsPseudo() {
		partial = partial || fs[0].Kind == stack.KindTorn
		fs = fs[1:]
	}
	caller, callerInternal := "", false
	for i := range fs {
		f := fs[len(fs)-1-i] // outermost first
		where := fmt.Sprintf("frame %q (%s:%d) at depth %d", f.Name, f.Path, f.Line, i)
		if caller == "Integer#times" && callerInternal && f.Kind == stack.KindCFunc {
			// From 3.3 on, Integer#times is Ruby code (named at its
			// caller's place, see stack.Frame.InternalPath) that calls C
			// methods (block_given?, succ) as well as the block.
			return ""
		}
		if _, ok := tornCalls[[2]string{caller, f.Name}]; !ok {
			return where + fmt.Sprintf(": not called by %q", caller)
		}
		caller = f.Name
		callerInternal = f.InternalPath != "" || strings.HasPrefix(f.Path, stack.InternalPrefix)
		if callerInternal {
			// Kernel#loop and Integer#times are Ruby code from 3.3 on:
			// their lines are in Ruby's own sources.
			continue
		}
		if i < len(fs)-1 {
			callee := fs[len(fs)-2-i].Name
			if want, ok := tornCalls[[2]string{f.Name, callee}]; ok && f.Line != want {
				return where + fmt.Sprintf(": calls %q from line %d, not %d", callee, want, f.Line)
			}
		} else if partial {
			onCall := false
			for call, line := range tornCalls {
				onCall = onCall || (call[0] == f.Name && line == f.Line)
			}
			if !onCall {
				return where + ": innermost frame under the torn frame not on a call site"
			}
		} else if r := tornInnermost[f.Name]; f.Line < r[0] || f.Line > r[1] {
			return where + fmt.Sprintf(": innermost frame outside lines %d..%d", r[0], r[1])
		}
	}
	return ""
}

// Bounds of TestTornStacks in nonblocking mode (blocking mode must have no
// torn stack at all). A running thread's stack is copied twice, its cfp
// read before, between and after the copies, and the copies compared (see
// ruby.Process.settle and framedReads); a thread that loops through the
// same frames about once per copy can leave a slot with the same bytes in
// both copies while it held another frame in between, so a few torn
// copies pass: 0 to 0.21 % of the looping threads' samples here on
// torn.rb, whose loop lasts about as long as a copy (1.3 to 2.9 % without
// the copies compared and the cfp checked, the walker's own checks alone;
// 3.9 to 6 % in one run in ten on YJIT before the copies were spaced at
// random). Ticks that lose a thread to a stack that kept changing were 0.5
// to 17 % (up to 34 % before the cfp was read between the copies, 42 to 67
// % before the copies started below the cfp).
const (
	maxTornShare     = 0.0075
	maxTornErrorRate = 0.25
)

// TestTornStacks samples two threads whose stacks change all the time (mid
// -> leaf or other -> Integer#times in a loop): without pausing, where
// stacks that changed while read are read again or counted as errors and
// the torn ones that pass the checks must stay rare; and pausing, where
// none may be torn. Every stack must be one the thread can have, with
// every caller on its call site.
func TestTornStacks(t *testing.T) {
	testutil.NeedRoot(t)
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		_, p := startTestdata(t, rb, "torn.rb")
		ctx := context.Background()
		for _, blocking := range []bool{false, true} {
			opts, d, mode := RubyOptions{}, 5*time.Second, "nonblocking"
			pz := &countingPauser{p: target.NewPauser()}
			defer pz.p.Close()
			if blocking {
				opts.Pauser, d, mode = pz, 2*time.Second, "blocking"
			}
			src := NewRubySource(p, opts)
			torn0 := p.Torn()
			total, bad, threadSamples, kept := 0, 0, 0, 0
			var examples []string
			st, err := Run(ctx, src, Config{Rate: 1000, Duration: d}, func(ss []stack.Sample) {
				for _, s := range ss {
					total++
					if !strings.HasPrefix(s.ThreadName, "torn-") {
						continue
					}
					threadSamples++
					if HasTorn(s.Frames) {
						kept++
					}
					if why := tornCheck(s.Frames); why != "" {
						bad++
						if len(examples) < 10 {
							examples = append(examples, fmt.Sprintf("%s: %s\n%s", s.ThreadName, why, formatFrames(s.Frames)))
						}
					}
				}
			})
			src.Close()
			if err != nil {
				t.Fatal(err)
			}
			errs := st.ErrorCount()
			// Ticks that lost a thread, or kept its stack under the
			// torn frame.
			errRate := float64(errs+kept) / float64(max(st.Ticks, 1))
			tornShare := float64(bad) / float64(max(threadSamples, 1))
			t.Logf("%s %s: %d samples (%d of the looping threads) in %d ticks; %d torn (%.3f%%); %d kept under the torn frame, %d ticks with errors (%s): %.2f%% of ticks; %d torn reads read again",
				rb.Name, mode, total, threadSamples, st.Ticks, bad, 100*tornShare, kept, errs, st.ErrorSummary(), 100*errRate, p.Torn()-torn0)
			if threadSamples < st.Ticks/2 {
				t.Errorf("%s: only %d samples of the two looping threads in %d ticks", mode, threadSamples, st.Ticks)
			}
			maxShare := maxTornShare
			if blocking {
				// Each pause stops the GVL's holder alone (see
				// RubySource.snapshot), every thread when none holds
				// it: the exactness checked here is that of pausing
				// one thread.
				t.Logf("%s: %d pauses of every thread, %d of %.2f threads on average", mode, pz.all, pz.some, float64(pz.pausedThreads)/float64(max(pz.some, 1)))
				if pz.some < st.Ticks*9/10 || pz.pausedThreads > pz.some*11/10 {
					t.Errorf("%s: %d pauses of %d threads and %d of every thread in %d ticks: want about one thread per tick", mode, pz.some, pz.pausedThreads, pz.all, st.Ticks)
				}
				maxShare = 0
			} else if errRate > maxTornErrorRate {
				t.Errorf("%s: %.1f%% of ticks lost a thread to a changing stack, more than %.0f%%", mode, 100*errRate, 100*maxTornErrorRate)
			}
			if tornShare > maxShare {
				t.Errorf("%s: %d of %d samples are torn stacks (more than %.1f%%); first ones:\n%s",
					mode, bad, threadSamples, 100*maxShare, strings.Join(examples, "\n"))
			}
		}
	})
}

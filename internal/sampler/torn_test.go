package sampler

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/ruby"
	"github.com/rbscope/rbscope/internal/stack"
	"github.com/rbscope/rbscope/internal/testutil"
)

// tornChain is the stack of a thread of testdata/torn.rb, outermost first:
// each frame's name, the line it sits on while it has a callee (a call
// site), and the lines it may be on as the innermost frame.
var tornChain = []struct {
	name      string
	call      int
	innermost [2]int
}{
	{"block (2 levels) in <main>", 13, [2]int{13, 13}},
	{"Object#run", 10, [2]int{9, 11}},
	{"Kernel#loop", 10, [2]int{10, 10}},
	{"block in Object#run", 10, [2]int{10, 10}},
	{"Object#mid", 7, [2]int{6, 8}},
	{"Object#leaf", 4, [2]int{3, 5}},
	{"Integer#times", 4, [2]int{4, 4}},
	{"block in Object#leaf", 4, [2]int{4, 4}},
}

// tornCheck returns why a sample of a torn.rb thread is not a stack the
// thread can have, or "".
func tornCheck(fs []stack.Frame) string {
	if len(fs) > len(tornChain) {
		return fmt.Sprintf("%d frames, at most %d possible", len(fs), len(tornChain))
	}
	for i := range fs {
		f := fs[len(fs)-1-i] // outermost first
		want := tornChain[i]
		where := fmt.Sprintf("frame %q (%s:%d) at depth %d", f.Name, f.Path, f.Line, i)
		if i == len(tornChain)-1 && strings.HasPrefix(f.Path, "<internal:") {
			// From 3.3 on, Integer#times is Ruby code that calls C
			// methods (block_given?, succ) as well as the block.
			continue
		}
		if f.Name != want.name {
			return where + ": expected " + want.name
		}
		if strings.HasPrefix(f.Path, "<internal:") {
			// Kernel#loop and Integer#times are Ruby code from 3.3 on:
			// their lines are in Ruby's own sources.
			continue
		}
		if i < len(fs)-1 {
			if f.Line != want.call {
				return where + fmt.Sprintf(": has a callee but is not on its call site, line %d", want.call)
			}
		} else if f.Line < want.innermost[0] || f.Line > want.innermost[1] {
			return where + fmt.Sprintf(": innermost frame outside lines %d..%d", want.innermost[0], want.innermost[1])
		}
	}
	return ""
}

// TestTornStacksNeverEmitted samples, without pausing, two threads whose
// stacks change all the time (mid -> leaf -> Integer#times in a loop):
// every sample must be a stack the thread can have, with every caller on
// its call site; stacks that changed while read are counted as errors.
func TestTornStacksNeverEmitted(t *testing.T) {
	testutil.NeedRoot(t)
	script, err := filepath.Abs(filepath.Join("testdata", "torn.rb"))
	if err != nil {
		t.Fatal(err)
	}
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		rb.SetProfilerEnv(t)
		proc := rb.Start(t, script)
		ctx := context.Background()
		p, err := OpenRuby(ctx, proc.Pid, ruby.Options{}, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Target().Close()
		src := NewRubySource(p, RubyOptions{})
		defer src.Close()
		total, bad, threadSamples := 0, 0, 0
		var examples []string
		st, err := Run(ctx, src, Config{Rate: 1000, Duration: 5 * time.Second}, func(ss []stack.Sample) {
			for _, s := range ss {
				total++
				if !strings.HasPrefix(s.ThreadName, "torn-") {
					continue
				}
				threadSamples++
				// GC and GVL-wait pseudo-frames sit on top of the Ruby
				// stack; the check is about the Ruby frames beneath.
				frames := s.Frames
				for len(frames) > 0 && frames[0].IsPseudo() {
					frames = frames[1:]
				}
				if why := tornCheck(frames); why != "" {
					bad++
					if len(examples) < 10 {
						examples = append(examples, fmt.Sprintf("%s: %s\n%s", s.ThreadName, why, formatFrames(s.Frames)))
					}
				}
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		errs := st.ErrorCount()
		t.Logf("%s: %d samples (%d of the looping threads) in %d ticks; %d ticks with errors (%.2f%%: %s), %d torn reads read again",
			rb.Name, total, threadSamples, st.Ticks, errs, 100*float64(errs)/float64(max(st.Ticks, 1)), st.ErrorSummary(), p.Torn())
		if threadSamples < st.Ticks/2 {
			t.Errorf("only %d samples of the two looping threads in %d ticks", threadSamples, st.Ticks)
		}
		if bad > 0 {
			t.Errorf("%d of %d samples are torn stacks; first ones:\n%s", bad, threadSamples, strings.Join(examples, "\n"))
		}
	})
}

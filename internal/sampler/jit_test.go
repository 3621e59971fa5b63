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
	"github.com/rbscope/rbscope/internal/target"
	"github.com/rbscope/rbscope/internal/testutil"
)

// jitLines are the lines of each method of testdata/jitlines.rb.
var jitLines = map[string][]int{
	"Object#work":          {2, 3, 4, 5, 6, 7, 8, 9},
	"block in Object#work": {3, 5, 7},
	"Object#spin":          {10, 11, 12},
	"block in Object#spin": {11},
}

// TestJITLines samples a thread spinning in code YJIT compiled early
// (--yjit-call-threshold=1 on the YJIT Rubies; the interpreter on the
// others): no frame may have line 0, and every line must belong to the
// method the frame names. YJIT does not store the pc of the frames it
// pushes, so the walker must not take a stale pc for the frame's own.
func TestJITLines(t *testing.T) {
	testutil.NeedRoot(t)
	script, err := filepath.Abs(filepath.Join("testdata", "jitlines.rb"))
	if err != nil {
		t.Fatal(err)
	}
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		rb.SetProfilerEnv(t)
		args := []string{script}
		if rb.YJIT {
			args = append([]string{"--yjit-call-threshold=1"}, args...)
		}
		proc := rb.StartCmd(t, rb.Command(args...))
		ctx := context.Background()
		p, err := ruby.Open(ctx, ruby.Spec{Pid: proc.Pid, Wait: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Target().Close()
		for _, mode := range []string{"blocking", "nonblocking"} {
			var opts RubyOptions
			if mode == "blocking" {
				pz := target.NewThreadPauser()
				opts.Pauser = pz
				defer pz.Close()
			}
			src := NewRubySource(p, opts)
			lines := map[string]map[int]int{}
			total, bad := 0, 0
			var examples []string
			st, err := Run(ctx, src, Config{Rate: 1000, Duration: 3 * time.Second}, func(ss []stack.Sample) {
				for _, s := range ss {
					if s.ThreadName != "spinner" {
						continue
					}
					total++
					for _, f := range s.Frames {
						if f.IsPseudo() { // GC and GVL-wait frames have no line
							continue
						}
						why := ""
						want, known := jitLines[f.Name]
						switch {
						case f.Line == 0:
							why = "line 0"
						case f.Name == "<cfunc>":
							why = "unnamed C frame"
						case known && f.Kind == stack.KindRuby && !containsInt(want, f.Line):
							why = fmt.Sprintf("line %d is not in %s (lines %v)", f.Line, f.Name, want)
						}
						if why != "" {
							bad++
							if len(examples) < 5 {
								examples = append(examples, why+"\n"+formatFrames(s.Frames))
							}
							break
						}
						if known && f.Kind == stack.KindRuby {
							if lines[f.Name] == nil {
								lines[f.Name] = map[int]int{}
							}
							lines[f.Name][f.Line]++
						}
					}
				}
			})
			src.Close()
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s %s: %d samples of the spinner in %d ticks (errors: %s); lines %v", rb.Name, mode, total, st.Ticks, st.ErrorSummary(), lines)
			if total < st.Ticks/2 {
				t.Errorf("%s: only %d samples of the spinner in %d ticks", mode, total, st.Ticks)
			}
			if bad > 0 {
				t.Errorf("%s: %d samples with a line that is not the frame's:\n%s", mode, bad, strings.Join(examples, "\n"))
			}
			// Each loop of work (lines 3, 5 and 7) runs a third of the time:
			// Object#work is seen on each line. Its block frames are seen
			// there too when paused; reading a running YJIT thread, the
			// blocks' frames are often caught mid-push and read again or
			// dropped as torn, so there only the method's lines are required.
			if w := lines["Object#work"]; w[3] == 0 || w[5] == 0 || w[7] == 0 {
				t.Errorf("%s: Object#work should be seen on lines 3, 5 and 7: %v", mode, w)
			}
			if b := lines["block in Object#work"]; mode == "blocking" && (b[3] == 0 || b[5] == 0 || b[7] == 0) {
				t.Errorf("%s: the blocks should be seen on lines 3, 5 and 7: %v", mode, b)
			}
		}
	})
}

func containsInt(xs []int, x int) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

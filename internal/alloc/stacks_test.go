package alloc

import (
	"strings"
	"testing"

	"github.com/rbscope/rbscope/internal/testutil"
)

// TestStacks: Widgets allocated in C#inner, called from B#middle, called
// from A#outer, carry stacks with that chain in order, in both modes.
func TestStacks(t *testing.T) {
	needBPF(t)
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		for _, c := range []struct {
			name string
			args []string
			opts Options
		}{
			{"exact", []string{"20000"}, Options{Exact: true, StackPeriod: 16}},
			// Long enough for several counting windows.
			{"default", []string{"10000", "2.5"}, Options{}},
		} {
			t.Run(c.name, func(t *testing.T) {
				path := script(t, "stacks.rb")
				p := startRuby(t, rb, append([]string{path}, c.args...)...)
				p.expect(t, "ready")
				tr := attachOrMissing(t, p.cmd.Process.Pid, c.opts)
				p.send(t)
				p.expect(t, "done")
				tr.Stop()
				r, err := tr.Snapshot()
				if err != nil {
					t.Fatal(err)
				}
				var widgets, chained uint64
				var example string
				for _, s := range r.Stacks {
					if s.Class != "Widget" {
						continue
					}
					widgets += s.Samples
					var names []string
					for _, f := range s.Frames {
						names = append(names, f.Name)
					}
					joined := strings.Join(names, " < ")
					if example == "" {
						example = joined
					}
					if strings.Contains(joined, "C#inner < B#middle < A#outer") {
						chained += s.Samples
					}
				}
				t.Logf("%d stacks sampled (%d walk errors: %s); Widget stack: %s", r.StackSamples, r.StackErrors, r.StackError, example)
				if widgets < 20 {
					t.Fatalf("%d Widget stacks sampled (of %d)", widgets, r.StackSamples)
				}
				if chained < widgets*95/100 {
					t.Errorf("%d of %d Widget stacks have C#inner < B#middle < A#outer; e.g. %s", chained, widgets, example)
				}
			})
		}
	})
}

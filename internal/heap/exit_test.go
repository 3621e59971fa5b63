package heap

import (
	"context"
	"strings"
	"syscall"
	"testing"

	"github.com/rbscope/rbscope/internal/ruby"
	"github.com/rbscope/rbscope/internal/target"
	"github.com/rbscope/rbscope/internal/testutil"
)

// TestProcessExitsMidCensus kills the process after the census's first
// batch of pages: the census fails with ExitedError and says how far
// it got, paused or not; nothing is made up.
func TestProcessExitsMidCensus(t *testing.T) {
	testutil.NeedRoot(t)
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		rb.SetProfilerEnv(t)
		for _, stop := range []bool{false, true} {
			proc := rb.Start(t, "heap_census.rb")
			tg, err := target.OpenLive(proc.Pid)
			if err != nil {
				t.Fatal(err)
			}
			defer tg.Close()
			p, err := ruby.Open(context.Background(), ruby.Spec{Target: tg, Consistency: ruby.Running})
			if err != nil {
				t.Fatal(err)
			}
			h, err := Open(p)
			if err != nil {
				t.Fatal(err)
			}
			batches := 0
			afterBatch = func() {
				if batches++; batches == 1 {
					syscall.Kill(proc.Pid, syscall.SIGKILL)
					if !stop {
						proc.Cmd.Wait()
					}
				}
			}
			c, err := h.Census(context.Background(), Options{Stop: stop})
			afterBatch = nil
			if stop && err == nil {
				// Killed while paused, the process may take longer to die
				// than the census to read the rest: then the census is
				// whole.
				if c.Partial || c.Bad != 0 || c.PagesBad != 0 {
					t.Errorf("stop: census after SIGKILL is partial without an error: %s", c.Why)
				}
				t.Logf("stop: the census finished before the process died")
				continue
			}
			if err == nil || !target.IsExited(err) || !strings.Contains(err.Error(), "census stopped after") {
				t.Errorf("census of a process that exited: %v, want ExitedError saying how far it got", err)
			}
			t.Logf("stop=%v: %v", stop, err)
		}
	})
}

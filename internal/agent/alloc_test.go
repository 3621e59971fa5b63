package agent

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/pyroscopetest"
	"github.com/rbscope/rbscope/internal/testutil"
)

// TestAgentAlloc runs one agent with --alloc over a job of every Ruby under
// test at once: each job (alloc's exiting.rb) waits until the agent has
// attached to it, allocates a steady mix for 2 s, prints what Ruby counted
// (GC.stat(:total_allocated_objects) around the loop, and the Widgets it
// made) and exits. The allocation profiles read back from a real Pyroscope
// under each job's service name (from PYROSCOPE_APPLICATION_NAME) hold the
// Widgets made and the job's total within 5 % (the default mode's
// estimate, scaled by Ruby's own counter), the Widget stacks run through
// the job's loop, and the agent stops counting each job when it exits.
func TestAgentAlloc(t *testing.T) {
	testutil.NeedRoot(t)
	rubies := testutil.Rubies(t)
	srv := pyroscopetest.Start(t)
	debugRoots(t, rubies)
	script := filepath.Join(testutil.RepoRoot(t), "internal", "alloc", "testdata", "exiting.rb")
	type job struct {
		rb      testutil.RubyUnderTest
		service string
		*testutil.Script
	}
	var jobs []job
	for _, rb := range rubies {
		service := "agentalloc_" + strings.ReplaceAll(rb.Name, ".", "_")
		cmd := rb.Command(script, "2")
		cmd.Env = append(os.Environ(), "PYROSCOPE_APPLICATION_NAME="+service)
		j := job{rb, service, testutil.StartScript(t, cmd)}
		j.Expect(t, "ready")
		jobs = append(jobs, j)
	}
	start := time.Now()
	a := startAgent(t, Config{
		URL: srv.URL(), Interval: 2 * time.Second, Alloc: true,
		Include: regexp.MustCompile(regexp.QuoteMeta(script)),
	})
	waitPids(t, a.Agent, len(jobs), 5*time.Second)
	for deadline := time.Now().Add(60 * time.Second); a.Stats().AllocTracked < len(jobs); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("allocations counted in %d processes after 60 s, want %d (stats %+v)", a.Stats().AllocTracked, len(jobs), a.Stats())
		}
	}
	for _, j := range jobs {
		j.Send(t, "go")
	}
	type truth struct{ allocated, widgets int64 }
	truths := make([]truth, len(jobs))
	for i, j := range jobs {
		l := j.ExpectPrefix(t, "stat ")
		var before, after, gc0, gc1, n int64
		if _, err := fmt.Sscanf(l, "stat %d %d %d %d %d", &before, &after, &gc0, &gc1, &n); err != nil {
			t.Fatalf("%s: the job said %q: %v", j.rb.Name, l, err)
		}
		truths[i] = truth{after - before, n}
	}
	// Each count ends with its job (Ruby's teardown probe) and pushes its
	// last interval.
	for deadline := time.Now().Add(30 * time.Second); a.Stats().AllocTracked > 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("allocations still counted in %d processes 30 s after their jobs exited", a.Stats().AllocTracked)
		}
	}
	if err := a.stop(t); err != nil {
		t.Fatalf("agent: %v", err)
	}
	st := a.Stats()
	t.Logf("agent stats: %+v", st)
	if st.AllocErrors != 0 || st.AllocProfiles < int64(len(jobs)) || st.Upload.Dropped != 0 {
		t.Errorf("allocation counts failed %d, %d allocation profiles queued for %d jobs, %d profiles dropped",
			st.AllocErrors, st.AllocProfiles, len(jobs), st.Upload.Dropped)
	}
	ctx := context.Background()
	from, end := start.Add(-time.Minute), time.Now().Add(time.Minute)
	var typeID string
	for deadline := time.Now().Add(30 * time.Second); typeID == ""; time.Sleep(200 * time.Millisecond) {
		types, err := srv.ProfileTypes(ctx, from, end)
		for _, id := range types {
			if strings.HasPrefix(id, "memory:alloc_objects:") {
				typeID = id
			}
		}
		if typeID == "" && time.Now().After(deadline) {
			t.Fatalf("the server has no alloc_objects profile: types %v (%v)", types, err)
		}
	}
	for i, j := range jobs {
		t.Run(j.rb.Name, func(t *testing.T) {
			tr := truths[i]
			var got pyroscopetest.Counts
			var err error
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
				got, err = srv.QueryType(ctx, typeID, pyroscopetest.AppSelector(j.service), from, end)
				if err == nil && float64(got.Total) >= 0.95*float64(tr.allocated) || time.Now().After(deadline) {
					break
				}
			}
			if err != nil {
				t.Fatal(err)
			}
			w := got.Self["Widget"]
			t.Logf("server %s: %d allocations (%d Widgets); the job: %d allocated (GC.stat), %d Widgets", typeID, got.Total, w, tr.allocated, tr.widgets)
			if d := float64(w)/float64(tr.widgets) - 1; math.Abs(d) > 0.05 {
				t.Errorf("%d Widgets on the server, the job made %d (%+.1f%%)", w, tr.widgets, 100*d)
			}
			if d := float64(got.Total)/float64(tr.allocated) - 1; math.Abs(d) > 0.05 {
				t.Errorf("%d allocations on the server, GC.stat says the job allocated %d (%+.1f%%)", got.Total, tr.allocated, 100*d)
			}
			var inLoop int64
			for s, n := range got.Stacks {
				if strings.HasSuffix(s, ";Widget") && strings.HasPrefix(s, "<main>") {
					inLoop += n
				}
			}
			if float64(inLoop) < 0.9*float64(w) {
				t.Errorf("%d of %d Widgets under <main>'s loop: %v", inLoop, w, got.Stacks)
			}
		})
	}
}

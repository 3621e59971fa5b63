package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/pyroscopetest"
	"github.com/rbscope/rbscope/internal/testutil"
)

// TestAgentContainer: a Ruby in a container of its own (own PID and mount
// namespaces, a Debian rootfs whose Ruby is at a path the host does not
// have, a pod's cgroup) is found by the agent from the host, its profiles
// carry the service name from its own environment, its container id and
// its pod UID, and their frames are the ones the script's
// caller_locations reports.
func TestAgentContainer(t *testing.T) {
	testutil.NeedRoot(t)
	srv := pyroscopetest.Start(t)
	c := testutil.StartContainerRuby(t, "container.rb", testutil.ContainerOptions{
		Env: []string{"PYROSCOPE_APPLICATION_NAME=shop_ct"}, Pod: true,
	})
	if c.ID == "" || c.PodUID == "" {
		t.Fatalf("container id %q, pod uid %q", c.ID, c.PodUID)
	}
	// Ruby's own view of the two sleeping threads (printed before ready).
	var truth []string
	for _, line := range c.Lines {
		var r struct {
			Frames []struct {
				Label string `json:"label"`
			} `json:"frames"`
		}
		if json.Unmarshal([]byte(line), &r) == nil && len(r.Frames) > 0 {
			truth = append(truth, r.Frames[0].Label) // the method that called report
		}
	}
	if len(truth) == 0 {
		t.Fatalf("container.rb printed no report: %q", c.Lines)
	}
	start := time.Now()
	a := startAgent(t, Config{URL: srv.URL(), Interval: 2 * time.Second,
		Include: regexp.MustCompile(`/app/container\.rb`)})
	pids := waitPids(t, a.Agent, 1, 5*time.Second)
	if len(pids) != 1 || pids[0] != c.Pid {
		t.Fatalf("agent samples %v, want the container's Ruby, host pid %d", pids, c.Pid)
	}
	time.Sleep(5 * time.Second)
	if err := a.stop(t); err != nil {
		t.Fatalf("agent: %v", err)
	}
	ctx := context.Background()
	from, end := start.Add(-time.Minute), time.Now().Add(time.Minute)
	sel := fmt.Sprintf(`{service_name="shop_ct", container_id=%q, pod_uid=%q}`, c.ID, c.PodUID)
	cpu, err := srv.WaitForTotal(sel, from, end, 1, 30*time.Second)
	if err != nil {
		t.Fatalf("cpu profile of %s: %v", sel, err)
	}
	wall, err := srv.QueryType(ctx, wallType, sel, from, end)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: cpu %d samples %v; wall %d samples", sel, cpu.Total, cpu.Stacks, wall.Total)
	// The spinning thread is on a CPU in Shop.spin's loop.
	if n := cpu.Inclusive["Shop.spin"]; float64(n) < 0.9*float64(cpu.Total) {
		t.Errorf("Shop.spin in %d of %d cpu samples: %v", n, cpu.Total, cpu.Stacks)
	}
	// The sleeping threads are in the wall profile where Ruby says.
	for _, label := range truth {
		found := false
		for name := range wall.Inclusive {
			found = found || name == label || regexp.MustCompile(`[#.]`+regexp.QuoteMeta(label)+`$`).MatchString(name)
		}
		if !found {
			t.Errorf("no frame of %q (Ruby's caller_locations) in the wall profile: %v", label, wall.Stacks)
		}
	}
	for _, name := range []string{"Shop::Cart#total", "Kernel#sleep"} {
		if wall.Inclusive[name] == 0 {
			t.Errorf("no %s in the wall profile: %v", name, wall.Stacks)
		}
	}
}

package agent

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/procfs"
	"github.com/rbscope/rbscope/internal/testutil"
)

// TestAgentFilters runs three Ruby processes and agents with each filter:
// --exclude, --user, --cgroup and --max-processes pick the processes they
// say, and a process left out by --max-processes is taken once another
// exits.
func TestAgentFilters(t *testing.T) {
	testutil.NeedRoot(t)
	rb := testutil.SystemRuby(t)
	dir := t.TempDir()
	pids := map[string]int{}
	for _, name := range []string{"alpha", "beta", "gamma"} {
		script := filepath.Join(dir, name+".rb")
		if err := os.WriteFile(script, []byte("$stdout.puts 'ready'; $stdout.flush; loop { sleep 0.01 }\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		pids[name] = rb.Start(t, script).Pid
	}
	all := []int{pids["alpha"], pids["beta"], pids["gamma"]}
	slices.Sort(all)
	cg, err := procfs.CgroupPath(pids["alpha"])
	if err != nil {
		t.Fatal(err)
	}
	include := regexp.MustCompile(regexp.QuoteMeta(dir))
	// settle runs an agent with cfg for two scans and returns what it
	// samples then.
	settle := func(cfg Config) (*running, []int) {
		cfg.URL, cfg.Include, cfg.Interval, cfg.FlushTimeout = acceptAll(t), include, 2*time.Second, 5*time.Second
		cfg.Rescan = 100 * time.Millisecond
		a := startAgent(t, cfg)
		for a.Stats().Scans < 3 {
			time.Sleep(20 * time.Millisecond)
		}
		time.Sleep(200 * time.Millisecond)
		return a, a.Pids()
	}
	for _, c := range []struct {
		name string
		cfg  Config
		want []int
	}{
		{"exclude", Config{Exclude: regexp.MustCompile(`beta\.rb`)}, without(all, pids["beta"])},
		{"user-root", Config{Users: []int{0}}, all},
		{"user-nobody", Config{Users: []int{65534}}, nil},
		{"cgroup-ours", Config{Cgroup: regexp.MustCompile("^" + regexp.QuoteMeta(cg) + "$")}, all},
		{"cgroup-other", Config{Cgroup: regexp.MustCompile(`^/no/such/cgroup$`)}, nil},
	} {
		a, got := settle(c.cfg)
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: sampling %v, want %v (stats %+v)", c.name, got, c.want, a.Stats())
		}
		a.stop(t)
	}

	a, got := settle(Config{MaxProcesses: 2})
	if len(got) != 2 || a.Stats().OverLimit == 0 {
		t.Fatalf("--max-processes 2: sampling %v, %d refusals", got, a.Stats().OverLimit)
	}
	left := without(all, got...)
	if err := syscall.Kill(got[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * time.Second)
	for !slices.Contains(a.Pids(), left[0]) || slices.Contains(a.Pids(), got[0]) {
		if time.Now().After(deadline) {
			t.Fatalf("after %d exited: sampling %v, want %d taken instead", got[0], a.Pids(), left[0])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// without returns list without the values drop.
func without(list []int, drop ...int) []int {
	var out []int
	for _, x := range list {
		if !slices.Contains(drop, x) {
			out = append(out, x)
		}
	}
	return out
}

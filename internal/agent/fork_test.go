package agent

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/testutil"
)

// masterScript is shaped like a Puma master in cluster mode: it forks 4
// workers, forks a new one for each that dies, and appends "n pid time"
// (CLOCK_REALTIME, in the parent, just after the fork returned) to
// ARGV[0] for each fork.
const masterScript = `
def serve
  loop do
    i = 0
    while i < 20_000
      i += 1
    end
    sleep 0.02
  end
end

log = ARGV[0]
workers = {}
start = lambda do |n|
  pid = fork { serve }
  t = Process.clock_gettime(Process::CLOCK_REALTIME)
  File.open(log, "a") { |f| f.puts "#{n} #{pid} #{t}" }
  workers[pid] = n
end
4.times { |n| start.(n) }
$stdout.puts "ready"
$stdout.flush
loop do
  pid = Process.wait
  n = workers.delete(pid)
  start.(n) if n
end
`

// fork is one fork a master reported.
type fork struct {
	worker, pid int
	at          time.Time
}

// forks reads the forks a master logged so far.
func forks(t *testing.T, path string) []fork {
	b, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []fork
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 {
			continue
		}
		n, _ := strconv.Atoi(f[0])
		pid, _ := strconv.Atoi(f[1])
		sec, _ := strconv.ParseFloat(f[2], 64)
		out = append(out, fork{n, pid, time.Unix(0, int64(sec*1e9))})
	}
	return out
}

// acceptAll stands in for Pyroscope where what is pushed is not what a
// test checks (discovery here): it takes every profile.
func acceptAll(t *testing.T) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestAgentPumaFork runs a Puma-shaped master on every Ruby under test
// at once, under one agent: each master and its 4 forked workers are
// sampled within 2 s of the agent's start (they run before it), a killed
// worker's replacement within 2 s of its fork, the killed one is dropped, and no fork resolves its Ruby build's
// layout again: one resolution per build, every other process shares it.
func TestAgentPumaFork(t *testing.T) {
	testutil.NeedRoot(t)
	rubies := testutil.Rubies(t)
	debugRoots(t, rubies)
	dir := t.TempDir()
	type master struct {
		rb  testutil.RubyUnderTest
		pid int
		log string
	}
	var masters []master
	builds := map[string]bool{}
	for _, rb := range rubies {
		script := filepath.Join(dir, "master_"+rb.Name+".rb")
		if err := os.WriteFile(script, []byte(masterScript), 0o644); err != nil {
			t.Fatal(err)
		}
		log := filepath.Join(dir, rb.Name+".forks")
		p := rb.StartCmd(t, rb.Command(script, log))
		masters = append(masters, master{rb, p.Pid, log})
		// A build is the binary the VM is in, by build id: a stripped
		// copy (3.4.5-stripped) is the same build as its original.
		vm := rb.Exe
		if rb.Shared {
			vm = rb.LibRuby(t)
		}
		builds[testutil.FileBuildID(t, vm)] = true
	}
	agentStart := time.Now()
	a := startAgent(t, Config{URL: acceptAll(t), Interval: 2 * time.Second, FlushTimeout: 5 * time.Second,
		Include: regexp.MustCompile(regexp.QuoteMeta(dir))})
	// seenAt records when each pid was first sampled.
	seenAt := map[int]time.Time{}
	watch := func(until func() bool, timeout time.Duration) {
		deadline := time.Now().Add(timeout)
		for !until() && time.Now().Before(deadline) {
			now := time.Now()
			for _, pid := range a.Pids() {
				if _, ok := seenAt[pid]; !ok {
					seenAt[pid] = now
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	allSeen := func(pids []int) func() bool {
		return func() bool {
			for _, pid := range pids {
				if _, ok := seenAt[pid]; !ok {
					return false
				}
			}
			return true
		}
	}
	var all []int
	for _, m := range masters {
		all = append(all, m.pid)
		for _, f := range forks(t, m.log) {
			all = append(all, f.pid)
		}
	}
	watch(allSeen(all), 10*time.Second)
	// check: a worker is sampled within 2 s of its fork, or of the
	// agent's start for one forked before.
	check := func(m master, f fork) {
		at, ok := seenAt[f.pid]
		from, what := f.at, "its fork"
		if from.Before(agentStart) {
			from, what = agentStart, "the agent's start"
		}
		switch {
		case !ok:
			t.Errorf("%s: worker %d (pid %d) forked at %s never sampled", m.rb.Name, f.worker, f.pid, f.at.Format(time.StampMilli))
		case at.Sub(from) > 2*time.Second:
			t.Errorf("%s: worker %d (pid %d) sampled %v after %s", m.rb.Name, f.worker, f.pid, at.Sub(from), what)
		default:
			t.Logf("%s: worker %d (pid %d) sampled %v after %s", m.rb.Name, f.worker, f.pid, at.Sub(from).Round(time.Millisecond), what)
		}
	}
	for _, m := range masters {
		if _, ok := seenAt[m.pid]; !ok {
			t.Errorf("%s: master %d never sampled", m.rb.Name, m.pid)
		}
		fs := forks(t, m.log)
		if len(fs) != 4 {
			t.Fatalf("%s: master logged %d forks, want 4", m.rb.Name, len(fs))
		}
		for _, f := range fs {
			check(m, f)
		}
	}
	st := a.Stats()
	t.Logf("runtimes after %d processes: %+v", len(all), st.Runtime)
	// One resolution per Ruby build (the *-yjit and *-nodebug
	// configurations run the same binaries as their siblings, the
	// *-stripped one a stripped copy with the same build id).
	if st.Runtime.LayoutResolutions != int64(len(builds)) || st.Runtime.LayoutHits != int64(len(all)-len(builds)) {
		t.Errorf("%d layout resolutions and %d shared for %d processes of %d builds: want %d and %d",
			st.Runtime.LayoutResolutions, st.Runtime.LayoutHits, len(all), len(builds), len(builds), len(all)-len(builds))
	}

	// Kill worker 0 of every master: each master forks a new one.
	var killed, reforks []int
	for _, m := range masters {
		victim := forks(t, m.log)[0].pid
		killed = append(killed, victim)
		if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(reforks) < len(masters) && time.Now().Before(deadline) {
		reforks = reforks[:0]
		for _, m := range masters {
			if fs := forks(t, m.log); len(fs) > 4 {
				reforks = append(reforks, fs[4].pid)
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	gone := func() bool {
		pids := a.Pids()
		for _, pid := range killed {
			if slices.Contains(pids, pid) {
				return false
			}
		}
		return allSeen(reforks)()
	}
	watch(gone, 10*time.Second)
	for _, m := range masters {
		fs := forks(t, m.log)
		if len(fs) != 5 {
			t.Errorf("%s: master logged %d forks, want 5", m.rb.Name, len(fs))
			continue
		}
		check(m, fs[4])
	}
	if pids := a.Pids(); slices.ContainsFunc(killed, func(pid int) bool { return slices.Contains(pids, pid) }) {
		t.Errorf("killed workers %v still sampled: %v", killed, pids)
	}
	st2 := a.Stats()
	t.Logf("runtimes after the re-forks: %+v; %d exited", st2.Runtime, st2.Exited)
	if st2.Runtime.LayoutResolutions != st.Runtime.LayoutResolutions || st2.Runtime.SymbolLoads != st.Runtime.SymbolLoads ||
		st2.Runtime.LayoutHits != st.Runtime.LayoutHits+int64(len(masters)) {
		t.Errorf("re-forked workers resolved their layout again: before %+v, after %+v", st.Runtime, st2.Runtime)
	}
}

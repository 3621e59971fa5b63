package agent

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/pyroscopetest"
	"github.com/rbscope/rbscope/internal/rtprio"
	"github.com/rbscope/rbscope/internal/testutil"
)

// running is an agent started by a test.
type running struct {
	*Agent
	cancel context.CancelFunc
	done   chan error
}

// startAgent runs an agent with cfg until the test ends (or stop).
func startAgent(t *testing.T, cfg Config) *running {
	t.Helper()
	testutil.NeedRoot(t)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{Agent: a, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- a.Run(ctx) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// stop stops the agent (as SIGTERM does) and returns Run's error.
func (r *running) stop(t *testing.T) error {
	t.Helper()
	if r.cancel == nil {
		return nil
	}
	r.cancel()
	r.cancel = nil
	select {
	case err := <-r.done:
		return err
	case <-time.After(2 * time.Minute):
		t.Fatal("agent did not stop within 2 minutes")
		return nil
	}
}

// testWriter sends log lines to t.Log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// debugRoots points rbscope at every Ruby under test's debug files at
// once (one agent profiles them all) and gives it a private layout cache.
func debugRoots(t *testing.T, rubies []testutil.RubyUnderTest) {
	var roots []string
	for _, rb := range rubies {
		if rb.DebugRoot != "" {
			roots = append(roots, rb.DebugRoot)
		}
	}
	t.Setenv("RBSCOPE_DEBUG_ROOT", strings.Join(roots, ":"))
	t.Setenv("RBSCOPE_CACHE_DIR", t.TempDir())
}

// spinScript spins in heavy_work and light_work on the main thread,
// measuring each one's CPU time with the thread's own CPU clock (the
// truth the cpu profile is compared with), and naps on a second thread
// (all wall time, no CPU). It writes "heavy light" CPU seconds to ARGV[0]
// every half second.
const spinScript = `
# heavy_work and light_work last about 6 and 2 ms on every Ruby: N
# iterations take 2 ms, measured once the loop is compiled where a JIT
# compiles it (see the cpu profile's check of samples outside the two).
def spin(n)
  i = 0
  while i < n
    i += 1
  end
end
200.times { spin(1_000) }
t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
spin(1_000_000)
N = [(1_000_000 * 0.002 / (Process.clock_gettime(Process::CLOCK_MONOTONIC) - t)).round, 10_000].max

def heavy_work
  i = 0
  n = 3 * N
  while i < n
    i += 1
  end
end

def light_work
  i = 0
  n = N
  while i < n
    i += 1
  end
end

def nap
  sleep 0.02
end

# The sleeper's own CPU time (its wake-ups are real CPU), for the bound on
# its share of the cpu profile.
$nap_cpu = 0.0
Thread.new do
  Thread.current.name = "sleeper"
  loop do
    nap
    $nap_cpu = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID)
  end
end
Thread.current.name = "spinner"
out = ARGV[0]
heavy = light = 0.0
last = Process.clock_gettime(Process::CLOCK_MONOTONIC)
# SIGUSR1 (handled on the main thread): write the main thread's CPU time,
# the monotonic clock and the CPU seconds heavy_work and light_work took so
# far to ARGV[0].sig (a window's edges).
Signal.trap("USR1") do
  File.write(out + ".sig.tmp", "#{Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID)} #{Process.clock_gettime(Process::CLOCK_MONOTONIC)} #{heavy} #{light}")
  File.rename(out + ".sig.tmp", out + ".sig")
end
$stdout.puts "ready"
$stdout.flush
loop do
  t0 = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID)
  heavy_work
  t1 = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID)
  light_work
  t2 = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID)
  heavy += t1 - t0
  light += t2 - t1
  now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
  if now - last > 0.5
    File.write(out + ".tmp", "#{heavy} #{light} #{$nap_cpu}")
    File.rename(out + ".tmp", out)
    last = now
  end
end
`

// wallType is the profile type of the agent's wall profiles, in samples.
const wallType = "wall:samples:count:wall:nanoseconds"

// TestAgentPyroscope runs one agent over a process of every Ruby under
// test at once and reads each one's profiles back from a real Pyroscope:
// per service_name, the cpu profile's split between two methods matches
// the split of CPU time the script measured itself, the wall profile holds
// the sleeping thread the cpu profile leaves out, the labels (pid,
// ruby_version, hostname, a tag, activity, thread_name) select the same
// samples, and the server holds every sample the agent pushed, once.
func TestAgentPyroscope(t *testing.T) {
	testutil.NeedRoot(t)
	if err := rtprio.Check(); err != nil {
		testutil.Missing(t, "real-time priority for the agent's clock: %v", err)
	}
	rubies := testutil.Rubies(t)
	srv := pyroscopetest.Start(t)
	debugRoots(t, rubies)
	dir := t.TempDir()
	type proc struct {
		rb      testutil.RubyUnderTest
		pid     int
		service string
		truth   string
	}
	var procs []proc
	for _, rb := range rubies {
		service := "agentspin_" + rb.Name
		script := filepath.Join(dir, service+".rb")
		if err := os.WriteFile(script, []byte(spinScript), 0o644); err != nil {
			t.Fatal(err)
		}
		truth := filepath.Join(dir, service+".cpu")
		p := rb.StartCmd(t, rb.Command(script, truth))
		procs = append(procs, proc{rb, p.Pid, service, truth})
	}
	start := time.Now()
	a := startAgent(t, Config{
		URL: srv.URL(), Interval: 2 * time.Second, Tags: map[string]string{"suite": "agent"},
		Include: regexp.MustCompile(regexp.QuoteMeta(dir)),
		// Five spinning scripts keep both CPUs busy: an ordinary clock's
		// reads wait for the kernel to preempt a script, mostly at its
		// next system call (the clock_gettime after light_work), and the
		// cpu profile leans towards heavy_work. Measured under two CPU
		// hogs, 3 runs x 4 Rubies without YJIT: heavy_work 72.9-83.4 %
		// (mean 79.8) of the two for the script's 75.0 %; with the clock
		// at real-time priority 68.1-77.1 % (mean 74.9).
		Realtime: true,
	})
	// Every process is found at start.
	waitPids(t, a.Agent, len(procs), 5*time.Second)
	// A window of whole intervals [k, m): the scripts' CPU times at its
	// edges, and the agent's ticks in it.
	k := time.Now().Add(500 * time.Millisecond).Truncate(2 * time.Second).Add(2 * time.Second)
	m := k.Add(10 * time.Second)
	// At each edge, per process: the main thread's CPU clock, the
	// monotonic clock, heavy_work's and light_work's CPU seconds.
	edge := func(at time.Time) (int64, [][4]float64) {
		time.Sleep(time.Until(at.Add(20 * time.Millisecond)))
		ticks := a.Stats().Ticks
		var out [][4]float64
		for _, p := range procs {
			os.Remove(p.truth + ".sig")
			syscall.Kill(p.pid, syscall.SIGUSR1)
		}
		for _, p := range procs {
			var v [4]float64
			for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
				b, err := os.ReadFile(p.truth + ".sig")
				if err == nil {
					if _, err := fmt.Sscan(string(b), &v[0], &v[1], &v[2], &v[3]); err != nil {
						t.Fatalf("%s.sig: %q: %v", p.truth, b, err)
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s wrote no %s.sig", p.service, p.truth)
				}
			}
			out = append(out, v)
		}
		return ticks, out
	}
	ticksK, atK := edge(k)
	ticksM, atM := edge(m)
	time.Sleep(time.Second)
	if err := a.stop(t); err != nil {
		t.Fatalf("agent: %v", err)
	}
	st := a.Stats()
	t.Logf("agent stats: %+v", st)
	if st.Upload.Dropped != 0 || st.ProfileErrors != 0 || st.Upload.PushedSamples != st.Upload.Samples {
		t.Errorf("profiles lost: %+v", st.Upload)
	}
	ctx := context.Background()
	end := time.Now().Add(time.Minute)
	from := start.Add(-time.Minute)
	if types, err := srv.ProfileTypes(ctx, from, end); err != nil || !contains(types, wallType) || !contains(types, pyroscopetest.ProfileTypeSamples) {
		t.Errorf("profile types %v (%v): want %s and %s", types, err, wallType, pyroscopetest.ProfileTypeSamples)
	}
	host, _ := os.Hostname()
	// Every sample pushed is on the server, once.
	allCPU, allWall := serverCounts(t, srv, `{suite="agent"}`, from, end, st.Upload.PushedSamples, 30*time.Second)
	if got := allCPU.Total + allWall.Total; got != st.Upload.PushedSamples {
		t.Errorf("server holds %d samples of these services (cpu %d, wall %d), the agent pushed %d",
			got, allCPU.Total, allWall.Total, st.Upload.PushedSamples)
	}
	for i, p := range procs {
		t.Run(p.rb.Name, func(t *testing.T) {
			sel := pyroscopetest.AppSelector(p.service)
			cpu, err := srv.WaitForTotal(sel, from, end, 1, 20*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			wall, err := srv.QueryType(ctx, wallType, sel, from, end)
			if err != nil {
				t.Fatal(err)
			}
			h, l := cpu.Self["Object#heavy_work"], cpu.Self["Object#light_work"]
			b, err := os.ReadFile(p.truth)
			if err != nil {
				t.Fatal(err)
			}
			var th, tl, tn float64
			if _, err := fmt.Sscan(string(b), &th, &tl, &tn); err != nil {
				t.Fatalf("%s: %q: %v", p.truth, b, err)
			}
			t.Logf("cpu: %d samples, heavy %d, light %d: heavy %.1f%% of the two, the script's CPU clock since it started %.1f%%; wall: %d samples",
				cpu.Total, h, l, 100*float64(h)/float64(h+l), 100*th/(th+tl), wall.Total)
			t.Logf("cpu self %v; wall self %v", cpu.Self, wall.Self)
			// In the window, the cpu profile counts the main thread at
			// the ticks it was on a CPU: about the share of the window
			// its own CPU clock says it ran, times the agent's ticks.
			// Counting its time waiting for a CPU as well (what the cpu
			// profile did before it read the context switches) gives
			// 3-10 times that on this loaded machine: the upper bound.
			// Below, a tick late enough that the thread was switched out
			// and in again before it was read is dropped (moved on):
			// 15-25 % of them under this load; and Poisson noise.
			win, err := srv.Query(ctx, fmt.Sprintf(`{service_name=%q, thread_name="spinner"}`, p.service), k, m.Add(-time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			ran := (atM[i][0] - atK[i][0]) / (atM[i][1] - atK[i][1])
			exp := ran * float64(ticksM-ticksK)
			t.Logf("window %s..%s: %d ticks; the main thread on a CPU %.1f%% of the time by its clock: %.0f samples expected, %d in the cpu profile",
				k.Format("15:04:05"), m.Format("15:04:05"), ticksM-ticksK, 100*ran, exp, win.Total)
			if lo, hi := 0.6*exp-3*math.Sqrt(exp), 1.25*exp+3*math.Sqrt(exp); float64(win.Total) < lo || float64(win.Total) > hi {
				t.Errorf("the cpu profile holds %d samples of the main thread in the window, want %.0f to %.0f", win.Total, lo, hi)
			}
			if h+l < 10 {
				t.Fatalf("cpu profile holds %d samples of heavy_work and light_work: %v", h+l, cpu.Self)
			}
			// The script spends well under 1 % of its CPU time outside
			// the two methods (three clock reads per round of about 8 ms;
			// a file written every 0.5 s): a sample named elsewhere is a
			// frame lost or a read delayed to a system call. The agent
			// reads its targets one after another, some 0.3 ms after the
			// deadline for the last: a thread on a CPU then has gone on,
			// and where the kernel preempts it at its next system call
			// (a clock read) is read there. With fixed loop counts the
			// rounds took 1.4 ms on 3.4.5 --yjit, and 9 % of its cpu
			// samples (24 of 263, a cold CI run) were in
			// Process.clock_gettime.
			if float64(h+l) < 0.9*float64(cpu.Total) {
				t.Errorf("heavy_work and light_work hold %d of the cpu profile's %d samples (want 90 %% or more): %v", h+l, cpu.Total, cpu.Self)
			}
			// In the window, the split of the main thread's samples between
			// heavy_work and light_work against the split of the CPU time
			// the script measured between the window's edges. Measured
			// over the same span: the whole profile against the script's
			// time since it started moved with the script's warm-up (3.4.5
			// --yjit's share 68-80 % from run to run; sd 2.8-3.1 points
			// over 6 Rubies x 5 runs against the binomial 2.5). The
			// samples are a random draw of that time: familyZ standard
			// deviations of the share over wh+wl samples, so that the six
			// Rubies of a run together fail on noise alone about as often
			// as one 3-sigma check (0.27 %; 3 sigma for each failed ~2 %
			// of runs), and a point for the edges (each misses the call in
			// progress, up to 6 ms of about 3 s).
			wh, wl := win.Self["Object#heavy_work"], win.Self["Object#light_work"]
			dh, dl := atM[i][2]-atK[i][2], atM[i][3]-atK[i][3]
			if wh+wl < 10 || dh+dl <= 0 {
				t.Fatalf("window: %d samples of heavy_work and light_work, %.3f s of their CPU time by the script's clock: %v", wh+wl, dh+dl, win.Self)
			}
			got, want := 100*float64(wh)/float64(wh+wl), 100*dh/(dh+dl)
			bound := 100*familyZ(len(procs))*math.Sqrt(want/100*(1-want/100)/float64(wh+wl)) + 1
			t.Logf("window: heavy %d, light %d: heavy %.1f%% of the two, the script's CPU clock %.1f%% (bound %.1f points)", wh, wl, got, want, bound)
			// Under YJIT too: the frames YJIT pushes without storing their
			// pc are named (see ruby.rubyMagic); 114 of 245 cpu samples
			// went to heavy_work's and light_work's caller before.
			if math.Abs(got-want) > bound {
				t.Errorf("in the window heavy_work is %.1f%% of the cpu profile's heavy+light samples, %.1f%% of the script's CPU time (bound %.1f points)", got, want, bound)
			}
			main := "<main>;Kernel#loop;block in <main>;Object#heavy_work"
			if n := cpu.Stacks[main]; float64(n) < 0.95*float64(h) {
				t.Errorf("stack %s holds %d of heavy_work's %d samples: %v", main, n, h, cpu.Stacks)
			}
			// The sleeping thread: in the wall profile, and in the cpu one
			// no more than its wake-ups' own CPU time. That bound is set
			// by the sleeper's CPU clock against the spinner's: a fixed
			// share of the total (2 %) tripped at a load of 7, where the
			// spinner got 4.5 % of a CPU and the wake-ups weighed more.
			expNap := float64(cpu.Total) * tn / (th + tl + tn)
			if n := cpu.Inclusive["Object#nap"]; float64(n) > 2*expNap+3*math.Sqrt(expNap)+2 {
				t.Errorf("cpu profile holds %d samples of the sleeping thread (of %d); its CPU clock says %.1f", n, cpu.Total, expNap)
			}
			nap := wall.Inclusive["Object#nap"]
			if float64(nap) < 0.3*float64(wall.Total) {
				t.Errorf("wall profile holds %d samples of Object#nap of %d: want about half", nap, wall.Total)
			}
			// Labels select the same samples.
			lsel := fmt.Sprintf(`{service_name=%q, pid="%d", ruby_version=%q, hostname=%q, suite="agent"}`, p.service, p.pid, p.rb.Version, host)
			byLabel, err := srv.Query(ctx, lsel, from, end)
			if err != nil {
				t.Fatal(err)
			}
			if byLabel.Total != cpu.Total {
				t.Errorf("%s selects %d cpu samples, want %d", lsel, byLabel.Total, cpu.Total)
			}
			bsel := fmt.Sprintf(`{service_name=%q, activity="blocked", thread_name="sleeper"}`, p.service)
			blocked, err := srv.QueryType(ctx, wallType, bsel, from, end)
			if err != nil {
				t.Fatal(err)
			}
			if blocked.Total == 0 || float64(blocked.Inclusive["Object#nap"]) < 0.95*float64(blocked.Total) {
				t.Errorf("%s: %d wall samples, %d in Object#nap", bsel, blocked.Total, blocked.Inclusive["Object#nap"])
			}
		})
	}
}

// familyZ is how many standard deviations each of n independent checks
// of a run may allow so that together they fail on noise alone as often
// as one 3-sigma check, 0.27 % of runs (Sidak's correction: 3.0 for one,
// 3.5 for six).
func familyZ(n int) float64 {
	alpha := math.Erfc(3 / math.Sqrt2)
	each := 1 - math.Pow(1-alpha, 1/float64(n))
	return math.Sqrt2 * math.Erfcinv(each)
}

// serverCounts polls the server until the cpu and wall profiles of sel
// hold want samples together or timeout passes (Pyroscope makes what it
// took queryable shortly after, not at once), and returns both.
func serverCounts(t *testing.T, srv *pyroscopetest.Server, sel string, from, end time.Time, want int64, timeout time.Duration) (cpu, wall pyroscopetest.Counts) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(timeout)
	for {
		var err error
		cpu, err = srv.Query(ctx, sel, from, end)
		if err == nil {
			wall, err = srv.QueryType(ctx, wallType, sel, from, end)
		}
		if err == nil && cpu.Total+wall.Total >= want {
			return cpu, wall
		}
		if time.Now().After(deadline) {
			if err != nil {
				t.Fatal(err)
			}
			return cpu, wall
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// waitPids waits until the agent samples at least n processes.
func waitPids(t *testing.T, a *Agent, n int, timeout time.Duration) []int {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		pids := a.Pids()
		if len(pids) >= n {
			return pids
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent samples %v after %v, want %d processes (stats %+v)", pids, timeout, n, a.Stats())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// scrape reads the agent's /metrics, one value per series.
func scrape(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	io.Copy(io.Discard, resp.Body)
	return out
}

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/procfs"
	"github.com/rbscope/rbscope/internal/recording"
	"github.com/rbscope/rbscope/internal/stack"
	"github.com/rbscope/rbscope/internal/testutil"
)

// railsApp returns the directory of the Rails fixture that
// scripts/rails-app.sh builds (scripts/test.sh builds it before the
// tests; a test never builds it itself).
func railsApp(t *testing.T) string {
	t.Helper()
	out, err := exec.Command(filepath.Join(testutil.RepoRoot(t), "scripts", "rails-app.sh"), "dir").Output()
	if err != nil {
		testutil.Missing(t, "the Rails fixture (run scripts/rails-app.sh build): %v", err)
	}
	return strings.TrimSpace(string(out))
}

// railsServer is the fixture served by puma (production, 5 threads, on
// 127.0.0.1), with the test hooks of config/initializers/rbscope.rb
// writing into Dir.
type railsServer struct {
	Pid  int
	URL  string // http://127.0.0.1:PORT
	Dir  string // RBSCOPE_FIXTURE_DIR
	cmd  *exec.Cmd
	done chan struct{}
}

var listenRE = regexp.MustCompile(`Listening on http://127\.0\.0\.1:([0-9]+)`)

// startRails starts puma on the fixture app with Ruby rb and waits until
// it listens (puma prints the port the kernel picked). The server is
// stopped (SIGTERM, then SIGKILL) when the test ends.
func startRails(t *testing.T, rb testutil.RubyUnderTest, app string) *railsServer {
	t.Helper()
	dir := t.TempDir()
	cmd := rb.Command("-S", "puma", "-C", "config/puma.rb")
	cmd.Dir = app
	cmd.Env = append(os.Environ(), "RAILS_ENV=production", "RAILS_LOG_TO_STDOUT=1", "PORT=0",
		"RBSCOPE_FIXTURE_DIR="+dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatalf("start puma: %v", err)
	}
	s := &railsServer{Pid: cmd.Process.Pid, Dir: dir, cmd: cmd, done: make(chan struct{})}
	port := make(chan string, 1)
	var boot strings.Builder
	go func() {
		defer close(s.done)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		found := false
		for sc.Scan() {
			if found {
				continue // the request log: drained, not kept
			}
			boot.WriteString(sc.Text() + "\n")
			if m := listenRE.FindStringSubmatch(sc.Text()); m != nil {
				found = true
				port <- m[1]
			}
		}
		io.Copy(io.Discard, out)
	}()
	t.Cleanup(func() {
		syscall.Kill(-s.Pid, syscall.SIGTERM)
		select {
		case <-s.done:
		case <-time.After(10 * time.Second):
			syscall.Kill(-s.Pid, syscall.SIGKILL)
		}
		cmd.Wait()
	})
	select {
	case p := <-port:
		s.URL = "http://127.0.0.1:" + p
	case <-s.done:
		t.Fatalf("puma exited before it listened:\n%s", boot.String())
	case <-time.After(120 * time.Second):
		t.Fatalf("puma did not listen within 120 s:\n%s", boot.String())
	}
	return s
}

// load requests /posts and /page in turn from 8 connections at once (as
// `ab -c 8` does) until ctx ends or max requests are done, and returns
// the count of requests that succeeded and the first failure.
func (s *railsServer) load(ctx context.Context, max int64) (ok int64, err error) {
	var n, good atomic.Int64
	var first atomic.Value
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 60 * time.Second}
	for c := 0; c < 8; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			paths := []string{"/posts", "/page"}
			for i := c; ctx.Err() == nil && n.Add(1) <= max; i++ {
				req, _ := http.NewRequestWithContext(ctx, "GET", s.URL+paths[i%2], nil)
				resp, err := client.Do(req)
				if err != nil {
					if ctx.Err() == nil {
						first.CompareAndSwap(nil, err)
					}
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					first.CompareAndSwap(nil, fmt.Errorf("GET %s: %s", paths[i%2], resp.Status))
					continue
				}
				good.Add(1)
			}
		}(c)
	}
	wg.Wait()
	if e, _ := first.Load().(error); e != nil {
		err = e
	}
	return good.Load(), err
}

// waitFor waits up to limit for the file path to exist.
func waitFor(t *testing.T, path string, limit time.Duration) []byte {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		b, err := os.ReadFile(path)
		if err == nil {
			return b
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not appear within %v", path, limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// railsTruth is what Rbscope.truth writes: Ruby's own view of an
// action's stack (caller_locations(0) inside the action).
type railsTruth struct {
	Thread string `json:"thread"`
	Frames []struct {
		Label string `json:"label"`
		Path  string `json:"path"`
		Line  int    `json:"line"`
	} `json:"frames"`
}

// railsWindow is what the app writes when a measurement window closes:
// stackprof's frames and the clocks at both ends.
type railsWindow struct {
	Start, Stop   railsClocks
	Threads       []string `json:"threads"`
	Samples       int      `json:"samples"`
	GCSamples     int      `json:"gc_samples"`
	MissedSamples int      `json:"missed_samples"`
	// WaitShare is the time the app's threads spent runnable without a
	// CPU over the window (schedstat), as a share of the window: the
	// test's measure, not the app's.
	WaitShare float64 `json:"-"`
	Frames    []struct {
		Name    string `json:"name"`
		File    string `json:"file"`
		Samples int    `json:"samples"`
	} `json:"frames"`
}

type railsClocks struct {
	RealtimeNs int64   `json:"realtime_ns"`
	CPUms      float64 `json:"cpu_ms"`
	GCTimems   float64 `json:"gc_time_ms"`
	GCCount    int     `json:"gc_count"`
}

// qualifierRE matches the class part of a qualified method name
// ("ActiveSupport::Callbacks#", "Process."), which Ruby 3.1's
// caller_locations labels leave out.
var qualifierRE = regexp.MustCompile(`(?:[A-Z]\w*(?:::[A-Z]\w*)*|#<[^>]*>)[#.]`)

func unqualified(name string) string { return qualifierRE.ReplaceAllString(name, "") }

// TestRecordRails profiles a real Rails 6.1 app (scripts/rails-app.sh:
// Debian's rails, sqlite3 and puma, 12 Ruby threads) under load from 8
// connections, in blocking and nonblocking mode, with `--mode cpu` at
// 250 Hz and --realtime, while
// stackprof (:cpu, 1 kHz of CPU time) profiles the same app over the same
// window (the app's initializer starts and stops it on SIGWINCH; rbscope's
// samples are cut to the window by their time stamps). It checks:
//
//   - the stacks: every sample in an action holds, from the action
//     outwards, exactly the frames Ruby's caller_locations gave inside it
//     (paths, lines, names), and the framework frames inwards (Active
//     Record's, Action View's, the partials' templates);
//   - the shares: the 10 functions with the most self samples, for either
//     profiler, have shares within 3 points of each other;
//   - GC: the share of samples in GC (those whose stack could not be read
//     included) against GC.stat(:time) over the process's CPU time, within
//     3 points, in a second window without stackprof (whose CPU timer
//     skews the clock GC.stat(:time) reads).
//
// At ordinary priority (--realtime=false), on a kernel that preempts
// ordinary threads lazily (this project's 6.x VM) and a busy machine, the
// shares part: the sampler's wake-up on the CPU of the thread holding the
// GVL does not preempt it at once, it runs on to its next system-call
// exit and is preempted (nonblocking) or stopped (blocking) there, so
// samples pile up on system calls: Process.clock_gettime
// (ActiveSupport::Notifications' CPU clock, a real system call) took 5-19 %
// of rbscope's samples against 0.1-0.8 % of stackprof's (11-14 % against
// 0.5-0.7 % still, with --mode cpu's on-CPU check). That is what --realtime
// is for (see record.Realtime), and what record says when the machine was
// busy.
//
// Debian's Ruby only: the app's gems are Debian's, built for Debian's Ruby
// 3.1. The 3.3.8 family cannot use them: the native extensions (sqlite3,
// puma, nio4r, nokogiri, websocket-driver) are linked against
// libruby-3.1.so and installed for the 3.1.0 ABI, and Debian's binary
// packages carry no C sources to build them again for 3.3.8 offline.
func TestRecordRails(t *testing.T) {
	rb := testutil.SystemRuby(t)
	bin := recBinary(t)
	app := railsApp(t)
	if _, err := rb.Command("-e", "require 'stackprof'").CombinedOutput(); err != nil {
		testutil.Missing(t, "ruby-stackprof for Debian's Ruby (scripts/install-deps.sh)")
	}
	srv := startRails(t, rb, app)

	// Every Ruby thread is found (puma with 5 threads makes 12), checked
	// against Thread.list below.
	out, err := exec.Command(bin, "snapshot", "--pid", strconv.Itoa(srv.Pid), "--format", "json").Output()
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	var snap struct {
		Threads []struct {
			Name string `json:"name"`
		} `json:"threads"`
	}
	if err := json.Unmarshal(out, &snap); err != nil {
		t.Fatalf("snapshot JSON: %v", err)
	}

	// Warm up: the first requests compile templates and fill caches.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	n, err := srv.load(ctx, 200)
	cancel()
	if err != nil || n == 0 {
		t.Fatalf("warm-up: %d requests, %v", n, err)
	}
	truths := map[string]railsTruth{}
	for _, action := range []string{"index", "page"} {
		var tr railsTruth
		if err := json.Unmarshal(waitFor(t, filepath.Join(srv.Dir, "truth-"+action+".json"), 10*time.Second), &tr); err != nil {
			t.Fatal(err)
		}
		truths[action] = tr
	}

	for _, sub := range []struct {
		name     string
		blocking bool
	}{{"blocking", true}, {"nonblocking", false}} {
		t.Run(sub.name, func(t *testing.T) {
			blocking := sub.blocking
			prof, clocks := railsWindowRecord(t, rb, bin, srv, blocking)
			w, samples := prof.w, prof.samples
			if len(w.Threads) != len(snap.Threads) {
				t.Errorf("snapshot found %d threads, Thread.list has %d (%q)", len(snap.Threads), len(w.Threads), w.Threads)
			}
			names := map[string]bool{}
			for _, th := range snap.Threads {
				names[th.Name] = true
			}
			for _, name := range w.Threads {
				if name != "" && !names[name] {
					t.Errorf("Thread.list has %q, the snapshot's threads are %v", name, names)
				}
			}
			railsCheckStacks(t, samples, truths, blocking)
			railsCheckShares(t, samples, w)
			railsCheckGC(t, clocks, prof)
		})
	}
}

// railsCut is one measurement window of the app: its in-process
// readings, rbscope's samples inside it and, by activity, the samples
// whose stack rbscope could not read (torn, nonblocking) in it, prorated.
type railsCut struct {
	w       railsWindow
	samples []stack.Sample
	unread  map[stack.Activity]float64
}

// railsWindowRecord records the app with rbscope --mode cpu under load
// over two windows: one while stackprof runs inside it (the stacks and
// the shares are checked there), then one with the clocks only (GC is
// checked there: see config/initializers/rbscope.rb for why not under
// stackprof).
func railsWindowRecord(t *testing.T, rb testutil.RubyUnderTest, bin string, srv *railsServer, blocking bool) (prof, clocks railsCut) {
	t.Helper()
	dir := t.TempDir()
	raw := filepath.Join(dir, "rec.raw.gz")
	ctx, cancel := context.WithTimeout(context.Background(), 180*time.Second)
	defer cancel()
	var loaded int64
	var loadErr error
	loadDone := make(chan struct{})
	go func() {
		defer close(loadDone)
		loaded, loadErr = srv.load(ctx, 100000)
	}()
	// --realtime: the suite runs on machines busier than their cores,
	// where an ordinary sampler's samples lean towards system calls (see
	// TestRecordRails).
	args := []string{"record", "--pid", strconv.Itoa(srv.Pid), "--realtime", "--mode", "cpu", "--rate", "250",
		"--duration", "150s", "--format", "summary", "-o", filepath.Join(dir, "summary.txt"), "--raw", raw}
	if !blocking {
		args = append(args, "--nonblocking")
	}
	rec := exec.Command(bin, args...)
	rec.Env = rb.ProfilerEnv(t)
	var stderr strings.Builder
	rec.Stderr = &stderr
	if err := rec.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rec.Process.Kill(); rec.Wait() })
	// The windows open once rbscope samples (its raw recording exists).
	waitFor(t, raw, 30*time.Second)
	time.Sleep(300 * time.Millisecond)
	wp := railsMeasure(t, srv, true)
	wc := railsMeasure(t, srv, false)
	rec.Process.Signal(os.Interrupt)
	if err := rec.Wait(); err != nil {
		t.Fatalf("record: %v\n%s", err, stderr.String())
	}
	cancel()
	<-loadDone
	if loadErr != nil {
		t.Errorf("load: %v", loadErr)
	}
	all, st := railsReadRaw(t, raw)
	var ticks int
	if m := regexp.MustCompile(`\(([0-9]+) ticks`).FindStringSubmatch(stderr.String()); m != nil {
		ticks, _ = strconv.Atoi(m[1])
	}
	t.Logf("%d requests; rbscope %d samples in %d ticks\n%s", loaded, len(all), ticks, lastLines(stderr.String(), 3))
	cut := func(name string, w railsWindow) railsCut {
		c := railsCut{w: w, unread: map[stack.Activity]float64{}}
		for _, s := range all {
			if ns := s.Time.UnixNano(); ns >= w.Start.RealtimeNs && ns <= w.Stop.RealtimeNs {
				c.samples = append(c.samples, s)
			}
		}
		for _, u := range st.Unread {
			for act, n := range u.ByActivity {
				c.unread[act] += float64(n) * float64(len(c.samples)) / float64(max(len(all), 1))
			}
		}
		// The app's CPU and its threads' wait for a CPU say how loaded the
		// machine was: loaded past its cores, the GVL's holder spends much
		// of its time runnable but off a CPU (Ruby says it runs, the
		// kernel's CPU clock does not count it).
		secs := float64(w.Stop.RealtimeNs-w.Start.RealtimeNs) / 1e9
		t.Logf("%s window %.2f s: stackprof %d samples (%d GC, %d missed), rbscope %d samples; process CPU %.0f ms (%.0f%% of a core), its threads waited for a CPU %.0f%% of it; GC.stat(:time) %.0f ms, %d GCs (load average %s)",
			name, secs, w.Samples, w.GCSamples, w.MissedSamples, len(c.samples), w.Stop.CPUms-w.Start.CPUms, (w.Stop.CPUms-w.Start.CPUms)/secs/10,
			100*w.WaitShare, w.Stop.GCTimems-w.Start.GCTimems, w.Stop.GCCount-w.Start.GCCount, loadAverage())
		if len(c.samples) < 300 {
			t.Fatalf("only %d rbscope samples in the %s window:\n%s", len(c.samples), name, stderr.String())
		}
		return c
	}
	return cut("stackprof", wp), cut("clocks", wc)
}

// railsWindowCPU is the app's CPU time a measurement window spans. The
// checks' bounds are fixed (3 points, the issue's), so the windows must
// hold enough samples for 3 points to stand above the noise: with 2.5 s
// (before) a window under a CPU hog per core held ~700 rbscope samples
// (250 Hz, Mode cpu) and ~550 stackprof ones (its 1 kHz CPU timer fires
// at the kernel's ticks: ~205 samples per CPU second here), and the
// difference of a 13 % share between the two had a standard deviation of
// 1.8 points, so 3 points was 1.7 sigma ((marking) 12.6 % against 9.5 %
// failed a hog run); GC's share against GC.stat(:time), 1.4 points
// (2.1 sigma). 10 s gives about four times the samples: 1.0 and 0.7
// points.
const railsWindowCPU = 10 * time.Second

// railsMeasure opens a measurement window in the app (SIGWINCH), with
// stackprof or with the clocks only, and closes it once the app has used
// railsWindowCPU of CPU, after at least 5 s and at most 45 s (a loaded
// machine gives it less than a core). It returns the app's readings.
func railsMeasure(t *testing.T, srv *railsServer, stackprof bool) railsWindow {
	t.Helper()
	flag := filepath.Join(srv.Dir, "window-clocks")
	if stackprof {
		os.Remove(flag)
	} else if err := os.WriteFile(flag, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(srv.Dir, "window.json"))
	cpu0 := railsCPUTicks(t, srv.Pid)
	t0, wait0 := time.Now(), railsWaitNs(t, srv.Pid)
	if err := syscall.Kill(srv.Pid, syscall.SIGWINCH); err != nil {
		t.Fatal(err)
	}
	for time.Since(t0) < 5*time.Second || (railsCPUTicks(t, srv.Pid)-cpu0 < uint64(railsWindowCPU/(10*time.Millisecond)) && time.Since(t0) < 45*time.Second) {
		time.Sleep(250 * time.Millisecond)
	}
	if err := syscall.Kill(srv.Pid, syscall.SIGWINCH); err != nil {
		t.Fatal(err)
	}
	waitShare := float64(railsWaitNs(t, srv.Pid)-wait0) / float64(time.Since(t0))
	var w railsWindow
	if err := json.Unmarshal(waitFor(t, filepath.Join(srv.Dir, "window.json"), 30*time.Second), &w); err != nil {
		t.Fatalf("window.json: %v", err)
	}
	w.WaitShare = waitShare
	return w
}

// railsReadRaw reads a raw recording's samples and its trailer's counters.
func railsReadRaw(t *testing.T, path string) ([]stack.Sample, recording.Stats) {
	t.Helper()
	rd, err := recording.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	var out []stack.Sample
	for {
		s, err := rd.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("read %s: %v", path, err)
		}
		out = append(out, s)
	}
	st, ok := rd.Stats()
	if !ok {
		t.Fatalf("%s has no trailer", path)
	}
	return out, st
}

// railsWaitNs returns the time the threads of process pid have spent
// runnable, waiting for a CPU (their schedstat).
func railsWaitNs(t *testing.T, pid int) uint64 {
	t.Helper()
	tids, err := procfs.Tasks(pid)
	if err != nil {
		t.Fatal(err)
	}
	var sum uint64
	for _, tid := range tids {
		if st, err := procfs.ReadTaskSchedstat(pid, tid); err == nil {
			sum += st.WaitNs // (a thread gone meanwhile counts nothing)
		}
	}
	return sum
}

// railsCPUTicks returns the CPU time the process pid has used, in clock
// ticks (1/100 s).
func railsCPUTicks(t *testing.T, pid int) uint64 {
	t.Helper()
	st, err := procfs.ReadStat(pid)
	if err != nil {
		t.Fatalf("the app's CPU time: %v", err)
	}
	return st.UTime + st.STime
}

func loadAverage() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	return strings.Join(f[:min(3, len(f))], " ")
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// railsCheckStacks: each sample inside an action has, from the action
// outwards, Ruby's own frames for it (caller_locations); inwards, the
// framework's frames show up.
func railsCheckStacks(t *testing.T, samples []stack.Sample, truths map[string]railsTruth, blocking bool) {
	t.Helper()
	inner := map[string][]string{
		// path fragments some sample in the action must have inwards
		"index": {"/activerecord-", "/activemodel-", "/activesupport-6.1.7.10/lib/active_support/core_ext/object/json.rb"},
		"page":  {"/actionview-", "/app/views/posts/page.html.erb", "/app/views/posts/_post.html.erb", "/app/views/posts/_comment.html.erb"},
	}
	for action, tr := range truths {
		name := "PostsController#" + action
		var in, bad int
		var firstBad string
		seen := map[string]bool{}
		threads := map[string]int{}
		for i := range samples {
			s := &samples[i]
			at := -1
			for j, f := range s.Frames {
				if f.Name == name {
					at = j
					break
				}
			}
			if at < 0 {
				continue
			}
			in++
			threads[s.ThreadName]++
			if m := railsMismatch(s.Frames[at:], tr); m != "" {
				bad++
				if firstBad == "" {
					firstBad = m
				}
			}
			for _, f := range s.Frames[:at] {
				for _, frag := range inner[action] {
					if strings.Contains(f.Path, frag) {
						seen[frag] = true
					}
				}
			}
		}
		t.Logf("%s: %d samples, by thread %v", name, in, threads)
		if in < 20 {
			t.Errorf("%s: only %d samples in the action", name, in)
			continue
		}
		// Blocking mode reads stopped stacks: every one must match.
		// Nonblocking mode rejects torn copies, but a few may pass (see
		// the README); at most 1%.
		if bad > 0 && (blocking || bad*100 > in) {
			t.Errorf("%s: %d of %d samples differ from Ruby's caller_locations; the first: %s", name, bad, in, firstBad)
		}
		for _, frag := range inner[action] {
			if !seen[frag] {
				t.Errorf("%s: no sample has a frame in %s inwards of the action", name, frag)
			}
		}
		for th := range threads {
			if !strings.HasPrefix(th, "puma srv tp ") {
				t.Errorf("%s sampled on thread %q, not a puma pool thread", name, th)
			}
		}
	}
}

// railsMismatch compares frames (the action's and its callers', innermost
// first) with Ruby's caller_locations from inside the action: the action
// frame's line moves, its callers' paths, lines and names must agree.
func railsMismatch(frames []stack.Frame, tr railsTruth) string {
	if len(frames) != len(tr.Frames) {
		return fmt.Sprintf("%d frames from the action outwards, Ruby says %d:\n%s", len(frames), len(tr.Frames), dump(frames))
	}
	if frames[0].Path != tr.Frames[0].Path {
		return fmt.Sprintf("action frame %s at %s, Ruby says %s", frames[0].Name, frames[0].Path, tr.Frames[0].Path)
	}
	for i := 1; i < len(frames); i++ {
		g, w := frames[i], tr.Frames[i]
		if strings.HasPrefix(w.Path, stack.InternalPrefix) {
			// A method defined inside Ruby is shown at its caller's
			// place, its own kept aside.
			if g.InternalPath != w.Path || g.InternalLine != w.Line {
				return fmt.Sprintf("frame %d: %s (internal %s:%d), Ruby says %s (%s:%d)", i, g.Name, g.InternalPath, g.InternalLine, w.Label, w.Path, w.Line)
			}
			for _, outer := range tr.Frames[i+1:] {
				if !strings.HasPrefix(outer.Path, stack.InternalPrefix) {
					w.Path, w.Line = outer.Path, outer.Line
					break
				}
			}
		}
		if unqualified(g.Name) != unqualified(w.Label) || g.Path != w.Path || g.Line != w.Line {
			return fmt.Sprintf("frame %d: %s (%s:%d), Ruby says %s (%s:%d)", i, g.Name, g.Path, g.Line, w.Label, w.Path, w.Line)
		}
	}
	return ""
}

func dump(fs []stack.Frame) string {
	var b strings.Builder
	for _, f := range fs {
		fmt.Fprintf(&b, "  %s (%s:%d) %s\n", f.Name, f.Path, f.Line, f.Kind)
	}
	return b.String()
}

// railsCheckShares: the top 10 self functions of either profiler have
// the same share in both, within 3 points, in either mode. (Nonblocking
// was only logged until --mode cpu kept the threads switched out and in
// again since the tick's deadline, which it dropped as moved on: String#
// split at 4.1 % against stackprof's 0.5 % in 1 run of 3 then. Since,
// three runs put every top-10 function within 1.4 points of stackprof
// nonblocking, 1.9 blocking.)
func railsCheckShares(t *testing.T, samples []stack.Sample, w railsWindow) {
	t.Helper()
	rb := map[string]float64{}
	for i := range samples {
		if len(samples[i].Frames) > 0 {
			rb[samples[i].Frames[0].Name]++
		}
	}
	for k := range rb {
		rb[k] = 100 * rb[k] / float64(len(samples))
	}
	sp := map[string]float64{}
	if w.Samples < 300 {
		t.Fatalf("stackprof took only %d samples in the window", w.Samples)
	}
	for _, f := range w.Frames {
		sp[f.Name] += 100 * float64(f.Samples) / float64(w.Samples)
	}
	top := map[string]bool{}
	for _, m := range []map[string]float64{rb, sp} {
		for _, k := range topKeys(m, 10) {
			top[k] = true
		}
	}
	keys := topKeys(rb, len(rb))
	for k := range top {
		if _, ok := rb[k]; !ok {
			keys = append(keys, k)
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%7s %9s  %s\n", "rbscope", "stackprof", "self function")
	var bad []string
	for _, k := range keys {
		if !top[k] {
			continue
		}
		fmt.Fprintf(&b, "%6.1f%% %8.1f%%  %s\n", rb[k], sp[k], k)
		if math.Abs(rb[k]-sp[k]) > 3 {
			bad = append(bad, fmt.Sprintf("%s: rbscope %.1f%%, stackprof %.1f%%", k, rb[k], sp[k]))
		}
	}
	t.Logf("top self functions (rbscope %d samples, stackprof %d):\n%s", len(samples), w.Samples, b.String())
	if len(bad) > 0 {
		t.Errorf("shares more than 3 points apart: %s", strings.Join(bad, "; "))
	}
}

// topKeys returns the k keys of m with the largest values (ties by name).
func topKeys(m map[string]float64, k int) []string {
	keys := make([]string, 0, len(m))
	for key := range m {
		keys = append(keys, key)
	}
	sort.Slice(keys, func(i, j int) bool {
		if m[keys[i]] != m[keys[j]] {
			return m[keys[i]] > m[keys[j]]
		}
		return keys[i] < keys[j]
	})
	return keys[:min(k, len(keys))]
}

// railsCheckGC: the share of rbscope's samples in GC against the share
// of the process's CPU time GC.stat(:time) counts, over the clocks-only
// window (under stackprof, GC.stat(:time) read 13-14 % where rbscope and
// stackprof both read 15-18 %: see config/initializers/rbscope.rb). The
// samples whose stack could not be read count with the activity read
// before it: left out, they would lean the share towards GC (a running
// thread's stack changes under the reader, one in GC not).
// (Nonblocking, a stack that keeps changing is kept under a
// "(stack changed while read)" frame, with its activity: it was dropped
// before, a third of a loaded window's samples on these 150-frame stacks,
// and the share then read up to 4 points high.)
func railsCheckGC(t *testing.T, clocks, prof railsCut) {
	t.Helper()
	share := func(c railsCut) (float64, float64) {
		gc := c.unread[stack.ActivityGC]
		for i := range c.samples {
			if c.samples[i].Activity == stack.ActivityGC {
				gc++
			}
		}
		n := float64(len(c.samples)) + c.unread[stack.ActivityGC] + c.unread[stack.ActivityRunning]
		return 100 * gc / n, n
	}
	got, n := share(clocks)
	cpu := clocks.w.Stop.CPUms - clocks.w.Start.CPUms
	want := 100 * (clocks.w.Stop.GCTimems - clocks.w.Start.GCTimems) / cpu
	pgot, _ := share(prof)
	t.Logf("GC: rbscope %.1f%% of %.0f samples; GC.stat(:time) %.1f%% of %.0f ms CPU (while stackprof ran: rbscope %.1f%%, stackprof %.1f%%, GC.stat(:time) %.1f%%)",
		got, n, want, cpu, pgot, 100*float64(prof.w.GCSamples)/float64(max(prof.w.Samples, 1)),
		100*(prof.w.Stop.GCTimems-prof.w.Start.GCTimems)/(prof.w.Stop.CPUms-prof.w.Start.CPUms))
	if math.Abs(got-want) > 3 {
		t.Errorf("GC share %.1f%%, GC.stat(:time) says %.1f%% of the process's CPU time: more than 3 points apart", got, want)
	}
}

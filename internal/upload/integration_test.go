package upload

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/pyroscopetest"
	"github.com/rbscope/rbscope/internal/ruby"
	"github.com/rbscope/rbscope/internal/sampler"
	"github.com/rbscope/rbscope/internal/stack"
	"github.com/rbscope/rbscope/internal/testutil"
)

// local counts what a test gave the uploader, as the server should count
// it.
type local struct {
	mu    sync.Mutex
	total int64
	self  map[string]int64
}

func (l *local) add(s stack.Sample) {
	if len(s.Frames) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.self == nil {
		l.self = map[string]int64{}
	}
	l.total++
	l.self[s.Frames[0].Name]++
}

// sameAsServer checks the server's counts against l: equal totals, equal
// per-function samples, shares within 2 points.
func (l *local) sameAsServer(t *testing.T, c pyroscopetest.Counts) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.Total != l.total {
		t.Errorf("server holds %d samples, %d were sent", c.Total, l.total)
	}
	for name, n := range l.self {
		if c.Self[name] != n {
			t.Errorf("%s: server %d samples, sent %d", name, c.Self[name], n)
		}
		ls := 100 * float64(n) / float64(l.total)
		if d := math.Abs(c.Share(name) - ls); d > 2 {
			t.Errorf("%s: server share %.1f%%, local %.1f%%", name, c.Share(name), ls)
		}
	}
	for name := range c.Self {
		if l.self[name] == 0 {
			t.Errorf("server has %s (%d samples), never sent", name, c.Self[name])
		}
	}
}

// feed adds synthetic samples i in [from, to) of a 100 Hz stream starting
// at t0, in real time (each when its time comes).
func feed(u *Uploader, l *local, t0 time.Time, from, to int) {
	for i := from; i < to; i++ {
		s := synth(t0, i)
		if d := time.Until(s.Time); d > 0 {
			time.Sleep(d)
		}
		u.Add(s)
		l.add(s)
	}
}

func waitCounts(t *testing.T, s *pyroscopetest.Server, app string, from time.Time, want int64) pyroscopetest.Counts {
	t.Helper()
	c, err := s.WaitForTotal(pyroscopetest.AppSelector(app), from.Add(-time.Minute), time.Now().Add(time.Minute), want, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func closeWithin(t *testing.T, u *Uploader, d time.Duration) Stats {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if err := u.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	return u.Stats()
}

const spinScript = `
def heavy
  i = 0
  while i < 300_000
    i += 1
  end
end

def light
  i = 0
  while i < 100_000
    i += 1
  end
end

Thread.current.name = "spinner"
$stdout.puts "ready"
$stdout.flush
loop do
  heavy
  light
end
`

// startRuby runs a script, waits for its "ready" line and kills it when
// the test ends.
func startRuby(t *testing.T, script string) int {
	t.Helper()
	if os.Geteuid() != 0 {
		testutil.Missing(t, "reading another process needs CAP_SYS_PTRACE: run as root")
	}
	return testutil.SystemRuby(t).StartSource(t, "spin.rb", script).Pid
}

// TestRubyToPyroscope samples a real Ruby process the way record does
// (the walker behind the sampler, its batches handed to Add), pushes to a
// real Pyroscope and reads back: same method names, same sample counts,
// same proportions, labels pid and thread_name usable in queries.
func TestRubyToPyroscope(t *testing.T) {
	pid := startRuby(t, spinScript)
	srv := pyroscopetest.Start(t)
	p, err := ruby.Open(context.Background(), ruby.Spec{Pid: pid, Wait: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Target().Close()
	const app = "rbscope-ruby-it"
	u, err := New(Config{URL: srv.URL(), AppName: app, Tags: map[string]string{"env": "ci"}, Interval: time.Second, SampleRate: 100, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	var l local
	threadNames := map[string]bool{}
	start := time.Now()
	sst, err := sampler.Run(context.Background(), sampler.NewRubySource(p, sampler.RubyOptions{}),
		sampler.Config{Rate: 100, Duration: 3 * time.Second}, func(b []stack.Sample) {
			for _, s := range b {
				u.Add(s)
				l.add(s)
				if len(s.Frames) > 0 {
					threadNames[s.ThreadName] = true
				}
			}
		})
	if err != nil {
		t.Fatal(err)
	}
	st := closeWithin(t, u, 30*time.Second)
	t.Logf("sampler %d samples, %d errors; sent %d: %v; stats %+v", sst.Samples, sst.ErrorCount(), l.total, l.self, st)
	if l.total < 100 {
		t.Fatalf("only %d samples taken from ruby", l.total)
	}
	if st.PushedSamples != l.total || st.Dropped != 0 {
		t.Errorf("stats %+v, want %d samples pushed, none dropped", st, l.total)
	}
	if l.self["Object#heavy"] == 0 || l.self["Object#light"] == 0 || !threadNames["spinner"] || len(threadNames) != 1 {
		t.Errorf("walker samples lack Object#heavy/Object#light on thread spinner: %v, threads %v", l.self, threadNames)
	}
	c := waitCounts(t, srv, app, start, l.total)
	l.sameAsServer(t, c)
	if c.Inclusive["<main>"] != c.Total {
		t.Errorf("<main> in %d of %d server samples", c.Inclusive["<main>"], c.Total)
	}

	// The labels select the same data.
	host, _ := os.Hostname()
	sel := fmt.Sprintf(`{service_name=%q, pid=%q, thread_name="spinner", env="ci", hostname=%q}`, app, strconv.Itoa(pid), host)
	byLabel, err := srv.Query(context.Background(), sel, start.Add(-time.Minute), time.Now().Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if byLabel.Total != c.Total {
		t.Errorf("%s selects %d samples, want %d", sel, byLabel.Total, c.Total)
	}
}

// TestServerStartsLate: the uploader starts before its server; nothing is
// lost.
func TestServerStartsLate(t *testing.T) {
	srv := pyroscopetest.Prepare(t)
	const app = "late"
	u, err := New(Config{URL: srv.URL(), AppName: app, Interval: time.Second, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	var l local
	t0 := time.Now()
	feed(u, &l, t0, 0, 250)
	if st := u.Stats(); st.Pushed != 0 || st.Retried == 0 || st.Queued == 0 {
		t.Errorf("before the server: stats %+v, want retries and a queue", st)
	}
	if err := srv.Run(); err != nil {
		t.Fatal(err)
	}
	feed(u, &l, t0, 250, 400)
	st := closeWithin(t, u, 60*time.Second)
	if st.PushedSamples != 400 || st.Dropped != 0 {
		t.Errorf("stats %+v, want 400 samples pushed, none dropped", st)
	}
	l.sameAsServer(t, waitCounts(t, srv, app, t0, 400))
}

// TestServerRestartsMidStream: the server goes away (graceful stop) and
// comes back while samples flow; nothing is lost.
func TestServerRestartsMidStream(t *testing.T) {
	srv := pyroscopetest.Start(t)
	const app = "restart"
	u, err := New(Config{URL: srv.URL(), AppName: app, Interval: time.Second, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	var l local
	t0 := time.Now()
	feed(u, &l, t0, 0, 200)
	srv.Stop()
	feed(u, &l, t0, 200, 450)
	if err := srv.Run(); err != nil {
		t.Fatal(err)
	}
	feed(u, &l, t0, 450, 600)
	st := closeWithin(t, u, 60*time.Second)
	if st.PushedSamples != 600 || st.Dropped != 0 || st.Retried == 0 {
		t.Errorf("stats %+v, want 600 samples pushed after retries, none dropped", st)
	}
	l.sameAsServer(t, waitCounts(t, srv, app, t0, 600))
}

// TestServerCrashes: the server is killed (SIGKILL) mid-stream. Pyroscope
// v1.12 loses what it held only in memory, acknowledged or not (its
// ingester has no write-ahead log); everything the uploader pushed from
// then on, the backlog first, arrives exactly.
func TestServerCrashes(t *testing.T) {
	srv := pyroscopetest.Start(t)
	const app = "crash"
	u, err := New(Config{URL: srv.URL(), AppName: app, Interval: time.Second, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	var l local
	t0 := time.Now()
	feed(u, &l, t0, 0, 200)
	time.Sleep(500 * time.Millisecond) // let the pushes of the full intervals finish
	before := u.Stats().PushedSamples
	srv.Kill()
	feed(u, &l, t0, 200, 400)
	if err := srv.Run(); err != nil {
		t.Fatal(err)
	}
	feed(u, &l, t0, 400, 500)
	st := closeWithin(t, u, 60*time.Second)
	if st.PushedSamples != 500 || st.Dropped != 0 {
		t.Errorf("stats %+v, want 500 samples pushed, none dropped", st)
	}
	c := waitCounts(t, srv, app, t0, 500-before)
	if c.Total != 500-before {
		t.Errorf("server holds %d samples; %d were pushed after the crash", c.Total, 500-before)
	}
}

// TestFlakyProxy puts a proxy between uploader and server that, in turn,
// fails a push with a 500 (without forwarding it), forwards one after a
// delay, forwards one but answers only after the uploader gave up waiting
// (so it is sent twice), and forwards one at once. The server ends with
// exactly what was sent: Pyroscope keeps one profile per series and
// timestamp, which makes the repeated push harmless.
func TestFlakyProxy(t *testing.T) {
	srv := pyroscopetest.Start(t)
	target, err := url.Parse(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	var n, failed, slowed, lost atomic.Int64
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch n.Add(1) % 4 {
		case 0:
			failed.Add(1)
			http.Error(w, "proxy: upstream unavailable", http.StatusInternalServerError)
			return
		case 1:
			slowed.Add(1)
			time.Sleep(200 * time.Millisecond)
		case 2:
			lost.Add(1)
			rec := httptest.NewRecorder()
			rp.ServeHTTP(rec, r)
			time.Sleep(1200 * time.Millisecond) // the uploader's timeout is 1s
			w.WriteHeader(rec.Code)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	defer proxy.Close()
	const app = "flaky"
	u, err := New(Config{URL: proxy.URL, AppName: app, Interval: time.Second, Timeout: time.Second, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	var l local
	t0 := time.Now().Add(-time.Minute).Truncate(time.Second)
	for i := range 1200 { // 12 one-second intervals
		s := synth(t0, i)
		u.Add(s)
		l.add(s)
	}
	st := closeWithin(t, u, 120*time.Second)
	t.Logf("proxy: %d requests, %d failed, %d slowed, %d answered too late; stats %+v", n.Load(), failed.Load(), slowed.Load(), lost.Load(), st)
	if st.PushedSamples != 1200 || st.Pushed != 12 || st.Dropped != 0 || st.Retried < failed.Load()+lost.Load() || lost.Load() == 0 {
		t.Errorf("stats %+v, want 12 profiles (1200 samples) pushed, a retry per failure (%d) and late answer (%d)", st, failed.Load(), lost.Load())
	}
	l.sameAsServer(t, waitCounts(t, srv, app, t0, 1200))
}

// TestQueueCapsWhileServerDown: with the real server stopped, the queue
// stays within its caps and drops oldest first; once the server is back,
// what was kept arrives exactly, and kept + dropped = sent.
func TestQueueCapsWhileServerDown(t *testing.T) {
	srv := pyroscopetest.Start(t)
	srv.Stop()
	const app = "caps"
	const memCap, diskCap = 4 << 10, 8 << 10
	u, err := New(Config{URL: srv.URL(), AppName: app, Interval: time.Second, QueueDir: t.TempDir(),
		MaxMemoryBytes: memCap, MaxQueueBytes: diskCap, Logf: t.Logf, Replay: true})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now().Add(-10 * time.Minute).Truncate(time.Second)
	const n = 30000 // 300 one-second intervals
	var maxQueued int64
	for i := range n {
		u.Add(synth(t0, i))
		if i%100 == 0 {
			time.Sleep(time.Millisecond) // let the encoder keep up, as it does at 100 Hz
			maxQueued = max(maxQueued, u.Stats().QueuedBytes)
		}
	}
	// Wait for the encoder: every interval but the open last one queued
	// or dropped.
	var down Stats
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		down = u.Stats()
		if down.DroppedSamples+down.QueuedSamples == n-100 || time.Now().After(deadline) {
			break
		}
	}
	maxQueued = max(maxQueued, down.QueuedBytes)
	if maxQueued > memCap+diskCap || down.Dropped == 0 || down.Pushed != 0 {
		t.Errorf("while down: max %d bytes queued (caps %d+%d), stats %+v; want drops within caps", maxQueued, memCap, diskCap, down)
	}
	if err := srv.Run(); err != nil {
		t.Fatal(err)
	}
	st := closeWithin(t, u, 60*time.Second)
	t.Logf("while down %+v; at the end %+v", down, st)
	if st.PushedSamples+st.DroppedSamples != n || st.Queued != 0 || st.Rejected != 0 {
		t.Errorf("pushed %d + dropped %d samples != %d sent, or some refused: %+v", st.PushedSamples, st.DroppedSamples, n, st)
	}
	// Once the server is back nothing more is lost, but for one interval
	// the last push (at Close) may displace while the queue is still full.
	if st.DroppedSamples-down.DroppedSamples > 100 || st.PushedSamples < down.QueuedSamples {
		t.Errorf("pushed %d samples (%d were queued when the server came back), dropped %d more after",
			st.PushedSamples, down.QueuedSamples, st.DroppedSamples-down.DroppedSamples)
	}
	c := waitCounts(t, srv, app, t0, st.PushedSamples)
	if c.Total != st.PushedSamples {
		t.Errorf("server holds %d samples, uploader pushed %d", c.Total, st.PushedSamples)
	}
	// Oldest dropped first: what arrived is the newest intervals.
	early, err := srv.Query(context.Background(), pyroscopetest.AppSelector(app), t0.Add(-time.Minute), t0.Add(100*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if early.Total != 0 {
		t.Errorf("%d samples of the oldest 100s arrived; the oldest should have been dropped", early.Total)
	}
}

package upload

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/pprof/profile"

	"github.com/rbscope/rbscope/internal/output"
	"github.com/rbscope/rbscope/internal/stack"
)

// synthStacks are three stacks sampled in proportions 6:3:1, the first two
// on the main thread, the third on a named worker thread.
var synthStacks = []struct {
	weight int
	thread string
	tid    int
	frames []stack.Frame
}{
	{6, "main", 100, []stack.Frame{
		{Name: "Integer#times", Path: "/app/w.rb", Line: 2, Kind: stack.KindCFunc},
		{Name: "Object#heavy", Path: "/app/w.rb", Line: 2, Kind: stack.KindRuby},
		{Name: "<main>", Path: "/app/w.rb", Line: 9, Kind: stack.KindRuby},
	}},
	{3, "main", 100, []stack.Frame{
		{Name: "Object#light", Path: "/app/w.rb", Line: 5, Kind: stack.KindRuby},
		{Name: "<main>", Path: "/app/w.rb", Line: 10, Kind: stack.KindRuby},
	}},
	{1, "", 101, []stack.Frame{
		{Name: "Kernel#sleep", Path: "/app/w.rb", Line: 14, Kind: stack.KindCFunc},
		{Name: "block in <main>", Path: "/app/w.rb", Line: 14, Kind: stack.KindRuby},
	}},
}

// synth returns sample i of a 100 Hz stream starting at t0.
func synth(t0 time.Time, i int) stack.Sample {
	k := i % 10
	var which int
	switch {
	case k < 6:
		which = 0
	case k < 9:
		which = 1
	default:
		which = 2
	}
	st := synthStacks[which]
	act := stack.ActivityRunning
	if st.frames[0].Name == "Kernel#sleep" {
		act = stack.ActivityBlocked
	}
	return stack.Sample{
		Activity:   act,
		Time:       t0.Add(time.Duration(i) * 10 * time.Millisecond),
		Pid:        4242,
		TID:        st.tid,
		ThreadName: st.thread,
		OnCPU:      true,
		Frames:     st.frames,
	}
}

func TestEncodeProfile(t *testing.T) {
	t0 := time.Unix(1700000000, 0)
	iv := interval{start: t0, end: t0.Add(10 * time.Second)}
	for i := range 100 {
		iv.samples = append(iv.samples, synth(t0, i))
	}
	iv.samples = append(iv.samples, stack.Sample{Time: t0, Pid: 4242, TID: 102}) // no frames
	data, n, err := encodeProfile(iv, 100)
	if err != nil {
		t.Fatal(err)
	}
	if n != 100 {
		t.Errorf("encoded %d samples, want 100 (the frameless one skipped)", n)
	}
	p, err := profile.ParseData(data)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.SampleType) != 2 || p.SampleType[0].Type != "samples" || p.SampleType[1].Type != "cpu" || p.SampleType[1].Unit != "nanoseconds" {
		t.Errorf("sample types %v", p.SampleType)
	}
	if p.Period != 10_000_000 || p.PeriodType.Type != "cpu" {
		t.Errorf("period %d %v, want 10ms cpu", p.Period, p.PeriodType)
	}
	if p.TimeNanos != t0.UnixNano() || p.DurationNanos != int64(10*time.Second) {
		t.Errorf("time %d duration %d, want %d, 10s", p.TimeNanos, p.DurationNanos, t0.UnixNano())
	}
	self := map[string]int64{}
	threads := map[string]int64{}
	acts := map[string]int64{}
	for _, s := range p.Sample {
		self[s.Location[0].Line[0].Function.Name] += s.Value[0]
		if s.Value[1] != s.Value[0]*10_000_000 {
			t.Errorf("cpu value %d for %d samples", s.Value[1], s.Value[0])
		}
		if got := s.Label["pid"]; len(got) != 1 || got[0] != "4242" {
			t.Errorf("pid label %v", got)
		}
		if len(s.NumLabel) != 0 {
			t.Errorf("numeric labels left: %v", s.NumLabel)
		}
		threads[strings.Join(s.Label["thread_name"], ",")] += s.Value[0]
		acts[strings.Join(s.Label["activity"], ",")] += s.Value[0]
	}
	if acts[string(stack.ActivityRunning)] != 90 || acts[string(stack.ActivityBlocked)] != 10 {
		t.Errorf("activity labels %v, want running 90, blocked 10", acts)
	}
	want := map[string]int64{"Integer#times": 60, "Object#light": 30, "Kernel#sleep": 10}
	for k, v := range want {
		if self[k] != v {
			t.Errorf("self %s = %d, want %d (all %v)", k, self[k], v, self)
		}
	}
	if threads["main"] != 90 || threads["tid-101"] != 10 {
		t.Errorf("thread_name labels %v, want main 90, tid-101 10", threads)
	}
	if _, n, err := encodeProfile(interval{start: t0, end: t0.Add(time.Second)}, 100); err != nil || n != 0 {
		t.Errorf("empty interval: %d samples, %v", n, err)
	}
}

func TestConfig(t *testing.T) {
	bad := []Config{
		{AppName: "a"},
		{URL: "ftp://x", AppName: "a"},
		{URL: "http://u:p@127.0.0.1:1", AppName: "a"},
		{URL: "http://127.0.0.1:1"},
		{URL: "http://127.0.0.1:1", AppName: "my app"},
		{URL: "http://127.0.0.1:1", AppName: "a", Tags: map[string]string{"env": "a,b"}},
		{URL: "http://127.0.0.1:1", AppName: "a", Tags: map[string]string{"bad-key": "x"}},
		{URL: "http://127.0.0.1:1", AppName: "a", Tags: map[string]string{"pid": "1"}},
	}
	for _, c := range bad {
		if _, err := c.withDefaults(); err == nil {
			t.Errorf("%+v: no error", c)
		}
	}
	c, err := Config{URL: "http://127.0.0.1:1/", AppName: "shop/web-1", Tags: map[string]string{"env": "prod", "hostname": "h1"}}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if c.URL != "http://127.0.0.1:1" || c.Interval != DefaultInterval || c.SampleRate != DefaultSampleRate {
		t.Errorf("defaults: %+v", c)
	}
	if got := seriesName(c.AppName, c.Tags); got != "shop/web-1{env=prod,hostname=h1}" {
		t.Errorf("series name %q", got)
	}
	if k, v, err := ParseTag("region=eu-west-1"); err != nil || k != "region" || v != "eu-west-1" {
		t.Errorf("ParseTag: %q %q %v", k, v, err)
	}
	for _, s := range []string{"novalue", "=x", "k=", "k=a}b"} {
		if _, _, err := ParseTag(s); err == nil {
			t.Errorf("ParseTag(%q): no error", s)
		}
	}
	t.Setenv(EnvAuthToken, "tok")
	t.Setenv(EnvBasicAuthUser, "u")
	if _, err := (Config{URL: "http://127.0.0.1:1", AppName: "a"}).withDefaults(); err == nil {
		t.Error("token and basic auth both set: no error")
	}
}

// recorder is an ingest endpoint on 127.0.0.1 that keeps what it gets.
type recorder struct {
	mu   sync.Mutex
	reqs []*http.Request
	body [][]byte
}

func (r *recorder) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	b, _ := io.ReadAll(req.Body)
	r.mu.Lock()
	r.reqs = append(r.reqs, req)
	r.body = append(r.body, b)
	r.mu.Unlock()
}

func TestAuthAndQuery(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{EnvAuthToken: "s3cret"}, "Bearer s3cret"},
		{map[string]string{EnvBasicAuthUser: "ann", EnvBasicAuthPassword: "pw"}, "Basic " + base64.StdEncoding.EncodeToString([]byte("ann:pw"))},
		{nil, ""},
	} {
		for _, k := range []string{EnvAuthToken, EnvBasicAuthUser, EnvBasicAuthPassword, EnvTenantID} {
			t.Setenv(k, tc.env[k])
		}
		t.Setenv(EnvTenantID, "team-a")
		rec := &recorder{}
		srv := httptest.NewServer(rec)
		u, err := New(Config{URL: srv.URL, AppName: "authapp", Tags: map[string]string{"env": "ci"}, SampleRate: 50, Logf: t.Logf})
		if err != nil {
			t.Fatal(err)
		}
		t0 := time.Unix(1700000003, 0)
		for i := range 20 {
			u.Add(synth(t0, i))
		}
		if err := u.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		srv.Close()
		if len(rec.reqs) != 1 {
			t.Fatalf("%d requests, want 1", len(rec.reqs))
		}
		r := rec.reqs[0]
		if got := r.Header.Get("Authorization"); got != tc.want {
			t.Errorf("Authorization %q, want %q", got, tc.want)
		}
		if got := r.Header.Get("X-Scope-OrgID"); got != "team-a" {
			t.Errorf("X-Scope-OrgID %q", got)
		}
		q := r.URL.Query()
		host, _ := os.Hostname()
		want := map[string]string{"name": "authapp{env=ci,hostname=" + host + "}", "from": "1700000000", "until": "1700000010",
			"sampleRate": "50", "spyName": "rbscope", "format": "pprof"}
		for k, v := range want {
			if q.Get(k) != v {
				t.Errorf("query %s=%q, want %q", k, q.Get(k), v)
			}
		}
		if r.URL.Path != "/ingest" {
			t.Errorf("path %q", r.URL.Path)
		}
		if _, err := profile.ParseData(rec.body[0]); err != nil {
			t.Errorf("body is not a pprof: %v", err)
		}
		st := u.Stats()
		if st.Samples != 20 || st.Pushed != 1 || st.PushedSamples != 20 || st.Queued != 0 {
			t.Errorf("stats %+v", st)
		}
	}
}

func TestRejectedNotRetried(t *testing.T) {
	var calls int
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		calls++
		mu.Unlock()
		http.Error(w, "invalid profile", http.StatusBadRequest)
	}))
	defer srv.Close()
	var logs bytes.Buffer
	var lmu sync.Mutex
	u, err := New(Config{URL: srv.URL, AppName: "rej", Interval: time.Second, Logf: func(f string, a ...any) {
		lmu.Lock()
		defer lmu.Unlock()
		logs.WriteString(strings.TrimSpace(strings.ReplaceAll(f, "%", "")) + "\n")
	}})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1700000000, 0)
	for i := range 300 { // three 1s intervals
		u.Add(synth(t0, i))
	}
	_ = u.Close(context.Background())
	st := u.Stats()
	if calls != 3 || st.Rejected != 3 || st.Retried != 0 || st.DroppedSamples != 300 {
		t.Errorf("calls %d, stats %+v; want 3 calls, 3 rejected, 300 samples dropped", calls, st)
	}
	if n := strings.Count(logs.String(), "server refused"); n != 1 {
		t.Errorf("%d refusal warnings, want 1 (rate-limited): %s", n, logs.String())
	}
}

// TestUniqueTimestamps: the profiles of one interval (an early cut, late
// samples) get distinct timestamps, since Pyroscope keeps one profile per
// series and timestamp.
func TestUniqueTimestamps(t *testing.T) {
	rec := &recorder{}
	srv := httptest.NewServer(rec)
	defer srv.Close()
	u, err := New(Config{URL: srv.URL, AppName: "stamps", MaxIntervalSamples: 30, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1700000000, 0)
	for i := range 100 { // one second: four profiles of the same 10s interval
		u.Add(synth(t0, i))
	}
	u.Add(stack.Sample{Time: t0, Pid: 1, ThreadName: "late", Frames: synthStacks[0].frames}) // joins the last
	if err := u.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	seen := map[int64]bool{}
	var total int64
	for i, b := range rec.body {
		p, err := profile.ParseData(b)
		if err != nil {
			t.Fatal(err)
		}
		if seen[p.TimeNanos] {
			t.Errorf("profile %d reuses timestamp %d", i, p.TimeNanos)
		}
		seen[p.TimeNanos] = true
		if from := rec.reqs[i].URL.Query().Get("from"); from != "1700000000" {
			t.Errorf("profile %d: from=%s, want the interval's start", i, from)
		}
		for _, s := range p.Sample {
			total += s.Value[0]
		}
	}
	if len(rec.body) != 4 || total != 101 { // 30+30+30+(10+1)
		t.Errorf("%d profiles, %d samples; want 4, 101", len(rec.body), total)
	}
}

// deadURL is a loopback URL nothing listens on.
func deadURL(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return "http://" + addr
}

// TestQueueBoundedWhileDown adds far more than the queue holds while no
// server listens: Add returns, the queue stays under its caps, the oldest
// profiles go, counted, with warnings; Close returns within its deadline and
// keeps the rest in the queue dir, which a later uploader adopts.
func TestQueueBoundedWhileDown(t *testing.T) {
	dir := t.TempDir()
	var mu sync.Mutex
	var warnings []string
	logf := func(f string, a ...any) {
		mu.Lock()
		defer mu.Unlock()
		warnings = append(warnings, fmt.Sprintf(f, a...))
	}
	const memCap, diskCap = 8 << 10, 24 << 10
	url := deadURL(t)
	u, err := New(Config{URL: url, AppName: "down", Interval: 100 * time.Millisecond,
		QueueDir: dir, MaxMemoryBytes: memCap, MaxQueueBytes: diskCap, Logf: logf, Replay: true})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1700000000, 0)
	const n = 20000 // 2000 intervals of 10 samples, ~600 bytes each
	maxQueued := int64(0)
	addStart := time.Now()
	for i := range n {
		u.Add(synth(t0, i))
		if i%500 == 0 {
			if b := u.Stats().QueuedBytes; b > maxQueued {
				maxQueued = b
			}
		}
	}
	t.Logf("%d Adds took %v", n, time.Since(addStart))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	err = u.Close(ctx)
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("Close took %v with a 2s deadline", took)
	}
	if err == nil || !strings.Contains(err.Error(), "kept in "+dir) {
		t.Errorf("Close: %v, want profiles kept in %s", err, dir)
	}
	st := u.Stats()
	t.Logf("Close took %v; stats %+v, max queued %d bytes", time.Since(start), st, maxQueued)
	if maxQueued > memCap+diskCap || st.QueuedBytes > diskCap {
		t.Errorf("queue grew to %d bytes (ends with %d), caps %d + %d", maxQueued, st.QueuedBytes, memCap, diskCap)
	}
	if st.Dropped == 0 || st.Pushed != 0 || st.Retried == 0 {
		t.Errorf("stats %+v: want drops, retries, nothing pushed", st)
	}
	if st.DroppedSamples+st.QueuedSamples != n {
		t.Errorf("dropped %d + queued %d samples != %d added", st.DroppedSamples, st.QueuedSamples, n)
	}
	joined := strings.Join(warnings, "\n")
	if !strings.Contains(joined, "cannot push to") || !strings.Contains(joined, "queue full") {
		t.Errorf("warnings lack the outage or the drops:\n%s", joined)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*"+fileExt))
	if len(files) != st.Queued {
		t.Errorf("%d files in the queue dir, %d queued", len(files), st.Queued)
	}

	// One uploader per queue dir.
	u1, err := New(Config{URL: url, AppName: "down", QueueDir: dir, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{URL: url, AppName: "down", QueueDir: dir, Logf: t.Logf}); err == nil || !strings.Contains(err.Error(), "in use by another rbscope") {
		t.Errorf("second uploader on one queue dir: %v", err)
	}
	ctx1, cancel1 := context.WithTimeout(context.Background(), 100*time.Millisecond)
	_ = u1.Close(ctx1)
	cancel1()

	// A later uploader adopts them, oldest first, and pushes them.
	rec := &recorder{}
	srv := httptest.NewServer(rec)
	defer srv.Close()
	u2, err := New(Config{URL: srv.URL, AppName: "down", QueueDir: dir, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	if err := u2.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	st2 := u2.Stats()
	if st2.PushedSamples != st.QueuedSamples || st2.Queued != 0 {
		t.Errorf("second uploader pushed %d samples, %d queued; want %d, 0", st2.PushedSamples, st2.Queued, st.QueuedSamples)
	}
	var last int64
	for _, r := range rec.reqs {
		from := r.URL.Query().Get("from")
		if !strings.HasPrefix(r.URL.Query().Get("name"), "down{") {
			t.Errorf("name %q", r.URL.Query().Get("name"))
		}
		var f int64
		for _, c := range from {
			f = f*10 + int64(c-'0')
		}
		if f < last {
			t.Errorf("pushed out of order: from %d after %d", f, last)
		}
		last = f
	}
	if files, _ := filepath.Glob(filepath.Join(dir, "*"+fileExt)); len(files) != 0 {
		t.Errorf("queue dir not empty after delivery: %v", files)
	}
}

func TestQueueFiles(t *testing.T) {
	m := meta{Name: "a{b=c}", From: 1, Until: 2, Rate: 100, Samples: 7}
	b, err := encodeEntry(m, []byte("profile"))
	if err != nil {
		t.Fatal(err)
	}
	got, data, err := decodeEntry(b)
	if err != nil || got != m || string(data) != "profile" {
		t.Fatalf("round trip: %+v %q %v", got, data, err)
	}
	if int64(len(b)) != fileSize(m, []byte("profile")) {
		t.Errorf("fileSize %d, file %d", fileSize(m, []byte("profile")), len(b))
	}
	for _, bad := range [][]byte{nil, []byte("RBQ1"), b[:10], append([]byte("XXXX"), b[4:]...)} {
		if _, _, err := decodeEntry(bad); err == nil {
			t.Errorf("decodeEntry(%q): no error", bad)
		}
	}
	// A corrupt file in the dir is reported and removed, the rest adopted.
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "00000000000000000001"+fileExt), []byte("junk"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "00000000000000000002"+fileExt), b, 0o600); err != nil {
		t.Fatal(err)
	}
	var warned bool
	q, err := newQueue(dir, 1<<20, 1<<20, func(string, ...any) { warned = true })
	if err != nil {
		t.Fatal(err)
	}
	n, size, samples := q.stats()
	if n != 1 || size != int64(len(b)) || samples != 7 || !warned || q.nextSeq != 3 {
		t.Errorf("adopted %d entries, %d bytes, %d samples, warned %v, next %d", n, size, samples, warned, q.nextSeq)
	}
}

func FuzzDecodeEntry(f *testing.F) {
	b, _ := encodeEntry(meta{Name: "a{}", From: 1, Until: 2, Rate: 100, Samples: 3}, []byte{0x1f, 0x8b})
	f.Add(b)
	f.Add([]byte("RBQ1\xff\xff\xff\xff"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, data, err := decodeEntry(b)
		if err != nil {
			return
		}
		if m.Name == "" || m.Rate <= 0 || len(data) > len(b) {
			t.Errorf("accepted %+v", m)
		}
	})
}

// BenchmarkAdd measures Add's cost per sample against the cost of copying
// a sample into a slice (the baseline), with a server that never answers.
func BenchmarkAdd(b *testing.B) {
	t0 := time.Now()
	b.Run("baseline-append", func(b *testing.B) {
		var s []stack.Sample
		for i := 0; b.Loop(); i++ {
			s = append(s, synth(t0, i))
			if len(s) == 1000 {
				s = s[:0]
			}
		}
	})
	b.Run("add", func(b *testing.B) { // 1s intervals: the encoder runs meanwhile
		u, err := New(Config{URL: "http://127.0.0.1:9", AppName: "bench", Interval: time.Second, Logf: func(string, ...any) {}})
		if err != nil {
			b.Fatal(err)
		}
		for i := 0; b.Loop(); i++ {
			u.Add(synth(t0, i))
		}
		b.StopTimer()
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_ = u.Close(ctx)
	})
}

// BenchmarkEncode measures turning one 10s interval (1000 samples) into a
// pushed profile against the pprof writer alone (the baseline): the
// difference is the relabelling for Pyroscope (reparse, rewrite).
func BenchmarkEncode(b *testing.B) {
	t0 := time.Unix(1700000000, 0)
	iv := interval{start: t0, end: t0.Add(10 * time.Second), stamp: t0}
	for i := range 1000 {
		iv.samples = append(iv.samples, synth(t0, i))
	}
	b.Run("baseline-output-pprof", func(b *testing.B) {
		for b.Loop() {
			w, err := output.New("pprof", output.Options{RateHz: 100, Start: t0})
			if err != nil {
				b.Fatal(err)
			}
			for _, s := range iv.samples {
				w.Add(s)
			}
			if _, err := w.WriteTo(io.Discard); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encode", func(b *testing.B) {
		for b.Loop() {
			if _, _, err := encodeProfile(iv, 100); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestQueueKeepsInflight: a full queue drops its oldest entry, except the
// one being pushed (its push may succeed; dropping it would count it
// twice, as pushed and as dropped).
func TestQueueKeepsInflight(t *testing.T) {
	q, err := newQueue("", 100, 0, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	m := func(i int) meta { return meta{Name: "a{}", From: int64(i), Until: int64(i), Rate: 100, Samples: i} }
	data := make([]byte, 40)
	for i := 1; i <= 2; i++ {
		if lost := q.push(m(i), data); len(lost) != 0 {
			t.Fatalf("push %d dropped %v", i, lost)
		}
	}
	q.begin(q.head())
	if lost := q.push(m(3), data); len(lost) != 1 || lost[0].From != 2 {
		t.Errorf("with 1 in flight, push 3 dropped %v, want entry 2", lost)
	}
	if lost := q.push(m(4), make([]byte, 70)); len(lost) != 2 || lost[0].From != 3 || lost[1].From != 4 {
		t.Errorf("push 4 (too big beside the one in flight) dropped %v, want 3 then 4 itself", lost)
	}
	q.end()
	if lost := q.push(m(5), data); len(lost) != 0 {
		t.Errorf("push 5 dropped %v", lost)
	}
	if lost := q.push(m(6), data); len(lost) != 1 || lost[0].From != 1 {
		t.Errorf("nothing in flight: push 6 dropped %v, want entry 1", lost)
	}
	if n, size, _ := q.stats(); n != 2 || size != 80 {
		t.Errorf("queue holds %d entries, %d bytes; want 2, 80", n, size)
	}
}

// TestPushRecordingBackpressure pushes a recording twenty times larger
// than the memory queue: PushRecording reads only as fast as the server
// takes it, so nothing is dropped.
func TestPushRecordingBackpressure(t *testing.T) {
	var mu sync.Mutex
	var got int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		p, err := profile.ParseData(b)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		time.Sleep(2 * time.Millisecond) // a server slower than the reader
		mu.Lock()
		for _, s := range p.Sample {
			got += s.Value[0]
		}
		mu.Unlock()
	}))
	defer srv.Close()
	t0 := time.Unix(1700000000, 0)
	const n = 20000 // 200 one-second profiles of about 600 bytes
	i := 0
	next := func() (stack.Sample, error) {
		if i == n {
			return stack.Sample{}, io.EOF
		}
		i++
		return synth(t0, i-1), nil
	}
	st, err := PushRecording(context.Background(), Config{URL: srv.URL, AppName: "replay", Interval: time.Second,
		MaxMemoryBytes: 6 << 10, Logf: t.Logf}, next)
	if err != nil {
		t.Fatal(err)
	}
	if st.PushedSamples != n || st.Dropped != 0 || got != n {
		t.Errorf("stats %+v, server got %d; want all %d pushed, none dropped", st, got, n)
	}
}

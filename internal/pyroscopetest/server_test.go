package pyroscopetest

import (
	"bytes"
	"context"
	"net/http"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/google/pprof/profile"
)

// pushRaw posts a hand-built pprof to the ingest API: three stacks with 7,
// 5 and 2 samples.
func pushRaw(t *testing.T, base, app string, at time.Time) {
	t.Helper()
	fn := func(id uint64, name string) *profile.Function {
		return &profile.Function{ID: id, Name: name, SystemName: name, Filename: "/app/x.rb"}
	}
	main, work, sleep := fn(1, "<main>"), fn(2, "Object#work"), fn(3, "Kernel#sleep")
	loc := func(id uint64, f *profile.Function, line int64) *profile.Location {
		return &profile.Location{ID: id, Line: []profile.Line{{Function: f, Line: line}}}
	}
	lmain, lwork, lsleep := loc(1, main, 10), loc(2, work, 3), loc(3, sleep, 4)
	p := &profile.Profile{
		SampleType: []*profile.ValueType{{Type: "samples", Unit: "count"}, {Type: "cpu", Unit: "nanoseconds"}},
		PeriodType: &profile.ValueType{Type: "cpu", Unit: "nanoseconds"},
		Period:     1e7,
		TimeNanos:  at.UnixNano(),
		Function:   []*profile.Function{main, work, sleep},
		Location:   []*profile.Location{lmain, lwork, lsleep},
		Sample: []*profile.Sample{
			{Location: []*profile.Location{lwork, lmain}, Value: []int64{7, 7e7}},
			{Location: []*profile.Location{lsleep, lwork, lmain}, Value: []int64{5, 5e7}},
			{Location: []*profile.Location{lmain}, Value: []int64{2, 2e7}},
		},
	}
	if err := p.CheckValid(); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := p.Write(&buf); err != nil {
		t.Fatal(err)
	}
	q := url.Values{"name": {app + "{env=test}"}, "from": {strconv.FormatInt(at.Unix(), 10)},
		"until": {strconv.FormatInt(at.Unix()+1, 10)}, "spyName": {"rbscope"}, "format": {"pprof"}, "sampleRate": {"100"}}
	resp, err := http.Post(base+"/ingest?"+q.Encode(), "application/octet-stream", &buf)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("ingest: %s", resp.Status)
	}
}

func checkCounts(t *testing.T, c Counts) {
	t.Helper()
	if c.Total != 14 {
		t.Errorf("total %d samples, want 14", c.Total)
	}
	wantSelf := map[string]int64{"Object#work": 7, "Kernel#sleep": 5, "<main>": 2}
	for k, v := range wantSelf {
		if c.Self[k] != v {
			t.Errorf("self[%s] = %d, want %d (all: %v)", k, c.Self[k], v, c.Self)
		}
	}
	if c.Inclusive["<main>"] != 14 || c.Inclusive["Object#work"] != 12 {
		t.Errorf("inclusive = %v, want <main> 14, Object#work 12", c.Inclusive)
	}
	if c.Stacks["<main>;Object#work;Kernel#sleep"] != 5 {
		t.Errorf("stacks = %v, want <main>;Object#work;Kernel#sleep 5", c.Stacks)
	}
	if got := c.Share("Object#work"); got != 50 {
		t.Errorf("share of Object#work = %v%%, want 50%%", got)
	}
}

// TestServer starts the real server, checks that it listens and talks on
// loopback only, pushes a known profile, reads it back exactly, and reads
// it back again after a restart.
func TestServer(t *testing.T) {
	s := Start(t)
	socks, err := Sockets(s.Pid())
	if err != nil {
		t.Fatal(err)
	}
	listening := 0
	for _, so := range socks {
		if so.Listening() {
			listening++
			if !so.Loopback() {
				t.Errorf("pyroscope listens on %s %s, not loopback", so.Proto, so.Local)
			}
		}
		if !so.RemoteOK() {
			t.Errorf("pyroscope talks to %s %s", so.Proto, so.Remote)
		}
	}
	if listening < 3 { // http, grpc, memberlist
		t.Errorf("pyroscope has %d listening sockets, want at least 3: %v", listening, socks)
	}

	at := time.Now().Truncate(time.Second)
	pushRaw(t, s.URL(), "pyroscopetest", at)
	from, until := at.Add(-time.Minute), at.Add(time.Minute)
	c, err := s.WaitForTotal(AppSelector("pyroscopetest"), from, until, 14, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	checkCounts(t, c)
	other, err := s.Query(context.Background(), AppSelector("nobody"), from, until)
	if err != nil || other.Total != 0 {
		t.Errorf("another app: %d samples, %v; want 0", other.Total, err)
	}

	s.Restart()
	c, err = s.WaitForTotal(AppSelector("pyroscopetest"), from, until, 14, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	checkCounts(t, c)
}

// TestSameTimestampKeptOnce documents what the uploader relies on: the
// server keeps one profile per series and timestamp, so a push repeated
// after a lost answer is not counted twice (and two different profiles of
// one series must never share a timestamp).
func TestSameTimestampKeptOnce(t *testing.T) {
	s := Start(t)
	at := time.Now().Truncate(time.Second)
	pushRaw(t, s.URL(), "dedup", at)
	pushRaw(t, s.URL(), "dedup", at)
	pushRaw(t, s.URL(), "dedup", at.Add(time.Millisecond))
	time.Sleep(time.Second)
	c, err := s.WaitForTotal(AppSelector("dedup"), at.Add(-time.Minute), at.Add(time.Minute), 28, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if c.Total != 28 {
		t.Errorf("three pushes, two timestamps: server holds %d samples, want 28", c.Total)
	}
}

package agent

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/pyroscopetest"
	"github.com/rbscope/rbscope/internal/testutil"
)

// TestAgentOutage stops the Pyroscope server for a while and starts it
// again, under two agents sampling the same Ruby process: one with the
// default buffer, which must deliver every profile of the outage once the
// server is back (the server then holds exactly the samples the agent
// took), and one with a buffer of a few profiles, which drops the oldest,
// counts them in /metrics, and delivers the rest.
//
// The outage lasts 12 s with 2 s profiles, so six intervals wait in the
// buffer, and the uploader's backoff (up to 8 s by then) is tried against
// a dead server several times: what a 60 s outage exercises, in a fifth
// of the time. Only the length of the backlog differs.
func TestAgentOutage(t *testing.T) {
	testutil.NeedRoot(t)
	rb := testutil.SystemRuby(t)
	srv := pyroscopetest.Start(t)
	dir := t.TempDir()
	script := filepath.Join(dir, "outage.rb")
	if err := os.WriteFile(script, []byte(spinScript), 0o644); err != nil {
		t.Fatal(err)
	}
	rb.StartCmd(t, rb.Command(script, filepath.Join(dir, "truth")))
	include := regexp.MustCompile(regexp.QuoteMeta(dir))
	start := time.Now()
	big := startAgent(t, Config{URL: srv.URL(), Interval: 2 * time.Second, Include: include,
		Tags: map[string]string{"agent": "big"}})
	const tiny = 3 << 10
	small := startAgent(t, Config{URL: srv.URL(), Interval: 2 * time.Second, Include: include, Buffer: tiny,
		Tags: map[string]string{"agent": "small"}, MetricsAddr: "127.0.0.1:0"})
	waitPids(t, big.Agent, 1, 5*time.Second)
	waitPids(t, small.Agent, 1, 5*time.Second)
	time.Sleep(4 * time.Second)
	srv.Stop()
	// What the server took before it stopped may be lost with it:
	// Pyroscope v1.12 keeps it in memory (no write-ahead log) and a push
	// that arrives while it shuts down is answered and not always kept
	// (seen here: one interval of both agents, some runs). What the
	// outage is about is what was pushed after: all of it must arrive.
	pushedBefore := map[string]int64{"big": big.Stats().Upload.PushedSamples, "small": small.Stats().Upload.PushedSamples}
	down := time.Now()
	time.Sleep(12 * time.Second)
	during := big.Stats().Upload
	m := scrape(t, small.MetricsAddr())
	t.Logf("server down 12 s: big agent queued %d profiles (%d bytes); small agent metrics: queued %v bytes, dropped %v profiles",
		during.Queued, during.QueuedBytes, m["rbscope_agent_queued_bytes"], m["rbscope_agent_dropped_profiles_total"])
	if m["rbscope_agent_queued_bytes"] > tiny {
		t.Errorf("small agent holds %v bytes, over its buffer of %d", m["rbscope_agent_queued_bytes"], tiny)
	}
	srv.Run()
	up := time.Now()
	time.Sleep(4 * time.Second)
	m = scrape(t, small.MetricsAddr())
	if err := big.stop(t); err != nil {
		t.Errorf("big agent: %v", err)
	}
	if err := small.stop(t); err != nil {
		t.Errorf("small agent: %v", err)
	}
	bs, ss := big.Stats(), small.Stats()
	t.Logf("big: %+v", bs.Upload)
	t.Logf("small: %+v", ss.Upload)
	if during.Queued < 6 {
		t.Errorf("big agent queued %d profiles during the outage, want 6 intervals' worth at least", during.Queued)
	}
	if bs.Upload.Dropped != 0 || bs.Upload.PushedSamples != bs.Upload.Samples || bs.Upload.Retried == 0 {
		t.Errorf("big agent: %+v: want every sample pushed after retries, none dropped", bs.Upload)
	}
	if m["rbscope_agent_dropped_profiles_total"] == 0 || float64(ss.Upload.Dropped) < m["rbscope_agent_dropped_profiles_total"] {
		t.Errorf("small agent: /metrics says %v profiles dropped, stats %d: want some", m["rbscope_agent_dropped_profiles_total"], ss.Upload.Dropped)
	}
	if ss.Upload.PushedSamples+ss.Upload.DroppedSamples != ss.Upload.Samples {
		t.Errorf("small agent: %d samples pushed + %d dropped != %d taken", ss.Upload.PushedSamples, ss.Upload.DroppedSamples, ss.Upload.Samples)
	}
	ctx := context.Background()
	from, end := start.Add(-time.Minute), time.Now().Add(time.Minute)
	for _, c := range []struct {
		agent  string
		pushed int64
	}{{"big", bs.Upload.PushedSamples}, {"small", ss.Upload.PushedSamples}} {
		sel := `{service_name="outage", agent="` + c.agent + `"}`
		cpu, wall := serverCounts(t, srv, sel, from, end, c.pushed, 30*time.Second)
		got := cpu.Total + wall.Total
		t.Logf("%s: server holds %d samples (cpu %d, wall %d); the agent pushed %d, %d of them before the stop",
			sel, got, cpu.Total, wall.Total, c.pushed, pushedBefore[c.agent])
		if got > c.pushed || got < c.pushed-pushedBefore[c.agent] {
			t.Errorf("%s: server holds %d samples, want the %d pushed after the stop, up to all %d",
				sel, got, c.pushed-pushedBefore[c.agent], c.pushed)
		}
	}
	// The big agent's outage profiles are there.
	out, err := srv.QueryType(ctx, wallType, `{service_name="outage", agent="big"}`, down.Add(time.Second), up.Add(-time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if out.Total < 500 {
		t.Errorf("server holds %d wall samples of the outage's 12 s, want ~1200 per thread", out.Total)
	}
}

package main

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/pyroscopetest"
	"github.com/rbscope/rbscope/internal/recording"
	"github.com/rbscope/rbscope/internal/stack"
	"github.com/rbscope/rbscope/internal/upload"
)

// upWrite writes a closed recording of n samples at 100 Hz from t0, made
// on host "build-7": seven in ten in Foo#bar, three in Kernel#sleep.
func upWrite(t *testing.T, t0 time.Time, n int) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "rec.raw.gz")
	w, err := recording.Create(path, recording.Header{RateHz: 100, Start: t0, Pids: []int{777},
		Command: []string{"ruby", "bin/shop.rb"}, RubyVersion: "3.1.2", Hostname: "build-7"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		s := stack.Sample{Time: t0.Add(time.Duration(i) * 10 * time.Millisecond), Pid: 777, TID: 777, ThreadName: "main",
			Frames: []stack.Frame{
				{Name: "Foo#bar", Path: "/app/foo.rb", Line: 4, Kind: stack.KindRuby},
				{Name: "<main>", Path: "/app/foo.rb", Line: 9, Kind: stack.KindRuby},
			}}
		if i%10 >= 7 {
			s.Frames = []stack.Frame{
				{Name: "Kernel#sleep", Path: "/app/foo.rb", Line: 6, Kind: stack.KindCFunc},
				{Name: "<main>", Path: "/app/foo.rb", Line: 6, Kind: stack.KindRuby},
			}
		}
		if err := w.Add(s); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(recording.Stats{End: t0.Add(time.Duration(n) * 10 * time.Millisecond)}); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestReportUpload(t *testing.T) {
	srv := pyroscopetest.Start(t)
	t0 := time.Now().Add(-5 * time.Minute).Truncate(10 * time.Second)
	path := upWrite(t, t0, 1000)
	_, stderr, code := run(t, "report", "--input", path, "--upload", srv.URL(), "--tag", "env=ci", "--upload-interval", "2s")
	if code != 0 || !strings.Contains(stderr, "pushed 1000 samples in 5 profiles to "+srv.URL()+" as shop") {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	sel := `{service_name="shop", env="ci", hostname="build-7", pid="777", thread_name="main"}`
	c, err := srv.WaitForTotal(sel, t0.Add(-time.Minute), t0.Add(time.Minute), 1000, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if c.Total != 1000 || c.Self["Foo#bar"] != 700 || c.Self["Kernel#sleep"] != 300 {
		t.Errorf("server holds %d samples, self %v; want 1000: Foo#bar 700, Kernel#sleep 300", c.Total, c.Self)
	}

	// A recording older than the server accepts: refused, said so.
	old := upWrite(t, time.Now().Add(-3*time.Hour), 100)
	_, stderr, code = run(t, "report", "--input", old, "--upload", srv.URL(), "--app-name", "old")
	if code == 0 || !strings.Contains(stderr, "reject-older-than") {
		t.Errorf("old recording: exit %d, stderr %q", code, stderr)
	}
	other, err := srv.Query(context.Background(), pyroscopetest.AppSelector("old"), time.Now().Add(-4*time.Hour), time.Now())
	if err != nil || other.Total != 0 {
		t.Errorf("old recording: server holds %d samples (%v)", other.Total, err)
	}
}

func TestReportUploadErrors(t *testing.T) {
	path := upWrite(t, time.Now().Add(-time.Minute), 50)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + l.Addr().String()
	l.Close()
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--upload", dead, "--tag", "novalue"}, 2, "want key=value"},
		{[]string{"--upload", dead, "--format", "pprof"}, 2, "drop --format"},
		{[]string{"--upload", "http://user:pw@127.0.0.1:1"}, 1, "do not show in ps"},
		{[]string{"--upload", dead, "--app-name", "bad name"}, 1, "not allowed"},
		{[]string{"--upload", dead, "--upload-timeout", "1s"}, 1, "not pushed in time: dropped"},
	} {
		args := append([]string{"report", "--input", path}, tc.args...)
		_, stderr, code := run(t, args...)
		last := strings.TrimSpace(stderr)
		if i := strings.LastIndex(last, "\n"); i >= 0 {
			last = last[i+1:] // warnings of the outage come first
		}
		if code != tc.code || !strings.Contains(last, tc.want) || !strings.HasPrefix(last, "rbscope: ") {
			t.Errorf("%v: exit %d, stderr %q; want exit %d and a last line with %q", tc.args, code, stderr, tc.code, tc.want)
		}
	}
}

func TestDefaultAppName(t *testing.T) {
	for cmd, want := range map[string]string{
		"ruby bin/shop.rb":              "shop",
		"ruby3.1 bin/shop.rb":           "shop",
		"ruby -Ilib app.rb --port 3000": "app",
		"bundle exec puma":              "puma",
		"/usr/local/bin/puma -C x.rb":   "puma",
		"ruby":                          "ruby",
		"":                              "ruby",
		"ruby weird$name!.rb":           "weird_name",
	} {
		if got := upload.DefaultAppName(strings.Fields(cmd)); got != want {
			t.Errorf("DefaultAppName(%q) = %q, want %q", cmd, got, want)
		}
	}
}

// TestLiveUploadHelpers drives the helpers record uses: start, Add, finish.
func TestLiveUploadHelpers(t *testing.T) {
	srv := pyroscopetest.Start(t)
	o := uploadOpts{url: srv.URL(), tags: []string{"env=ci"}, interval: time.Second, timeout: 30 * time.Second}
	var stderr strings.Builder
	up, err := o.start(&stderr, 100, []string{"ruby", "/srv/app/worker.rb"})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now().Add(-time.Minute).Truncate(time.Second)
	for i := range 250 {
		up.Add(stack.Sample{Time: t0.Add(time.Duration(i) * 10 * time.Millisecond), Pid: 1, TID: 1, ThreadName: "main",
			Frames: []stack.Frame{{Name: "Worker#run", Path: "/srv/app/worker.rb", Line: 3, Kind: stack.KindRuby}}})
	}
	if err := o.finish(&stderr, up); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stderr.String(), "as worker{env=ci,hostname=") || !strings.Contains(stderr.String(), "pushed 250 samples in 3 profiles") {
		t.Errorf("stderr %q", stderr.String())
	}
	c, err := srv.WaitForTotal(`{service_name="worker", env="ci"}`, t0.Add(-time.Minute), time.Now(), 250, 10*time.Second)
	if err != nil || c.Self["Worker#run"] != 250 {
		t.Errorf("server: %v, %v; want 250 samples of Worker#run", c.Self, err)
	}
	none := uploadOpts{}
	if up, err := none.start(&stderr, 100, nil); up != nil || err != nil {
		t.Errorf("no --upload: %v, %v", up, err)
	}
	if err := none.finish(&stderr, nil); err != nil {
		t.Error(err)
	}
}

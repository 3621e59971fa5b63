package main

import (
	"errors"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/pyroscopetest"
	"github.com/rbscope/rbscope/internal/recording"
	"github.com/rbscope/rbscope/internal/testutil"
)

// TestRecordUpload records a real Ruby process with --upload to a real
// Pyroscope server, then queries the server back: the methods and their
// shares must match the local raw recording within 2 points.
func TestRecordUpload(t *testing.T) {
	recBinary(t)
	srv := pyroscopetest.Start(t)
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		proc := rb.Start(t, "split.rb")
		app := "ci-record-" + rb.Name
		dir := t.TempDir()
		raw := filepath.Join(dir, "rec.raw.gz")
		start := time.Now()
		res := recRun(t, rb, "record", "--pid", strconv.Itoa(proc.Pid), "--duration", "6s", "--nonblocking",
			"--upload", srv.URL(), "--app-name", app, "--tag", "suite=cli", "--upload-interval", "2s",
			"--raw", raw, "--format", "collapsed", "--output", filepath.Join(dir, "out.txt"))
		stderr := res.stderr
		if res.err != nil {
			t.Fatalf("record: %v: %s", res.err, stderr)
		}
		// The local view: innermost Ruby method of every sample.
		rd, err := recording.Open(raw)
		if err != nil {
			t.Fatal(err)
		}
		local := map[string]int64{}
		var total int64
		for {
			s, err := rd.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			total++
			for _, f := range s.Frames {
				if f.Name == "Object#heavy" || f.Name == "Object#light" {
					local[f.Name]++
					break
				}
			}
		}
		if total < 100 || local["Object#heavy"] == 0 || local["Object#light"] == 0 {
			t.Fatalf("local recording: %d samples, %v", total, local)
		}
		sel := `{service_name="` + app + `", suite="cli"}`
		c, err := srv.WaitForTotal(sel, start.Add(-time.Minute), time.Now().Add(time.Minute), total, 20*time.Second)
		if err != nil {
			t.Fatalf("server: %v (local %d samples)", err, total)
		}
		if c.Total != total {
			t.Errorf("server holds %d samples, the local recording %d", c.Total, total)
		}
		for _, m := range []string{"Object#heavy", "Object#light"} {
			l := float64(local[m]) / float64(total) * 100
			s := float64(c.Inclusive[m]) / float64(c.Total) * 100
			if d := l - s; d > 2 || d < -2 {
				t.Errorf("%s: %.1f%% locally, %.1f%% in Pyroscope", m, l, s)
			}
		}
		if !strings.Contains(stderr, "pushed ") {
			t.Errorf("record did not say what it pushed: %s", stderr)
		}
	})
}

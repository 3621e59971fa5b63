package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"

	"github.com/rbscope/rbscope/internal/record"
	"github.com/rbscope/rbscope/internal/recording"
	"github.com/rbscope/rbscope/internal/stack"
	"github.com/rbscope/rbscope/internal/testutil"
)

var repT0 = time.Date(2026, 11, 21, 9, 0, 0, 0, time.UTC)

// repSample is the i-th sample of a 70/30 recording: seven in ten on the
// main thread in Foo#bar, three on a worker in Kernel#sleep.
func repSample(i int) stack.Sample {
	s := stack.Sample{Time: repT0.Add(time.Duration(i) * 10 * time.Millisecond), Pid: 777}
	if i%10 < 7 {
		s.TID, s.ThreadName = 777, "main"
		s.Frames = []stack.Frame{
			{Name: "Foo#bar", Path: "/app/foo.rb", Line: 4, Kind: stack.KindRuby},
			{Name: "<main>", Path: "/app/foo.rb", Line: 9, Kind: stack.KindRuby},
		}
	} else {
		s.TID, s.ThreadName = 778, "worker"
		s.Frames = []stack.Frame{
			{Name: "Kernel#sleep", Path: "/app/foo.rb", Line: 6, Kind: stack.KindCFunc},
			{Name: "block in <main>", Path: "/app/foo.rb", Line: 6, Kind: stack.KindRuby},
		}
	}
	return s
}

// repWrite writes a recording of n samples flushed every 10; close says
// whether it is closed cleanly.
func repWrite(t *testing.T, path string, n int, close bool) {
	t.Helper()
	w, err := recording.Create(path, recording.Header{RateHz: 100, Start: repT0, Pids: []int{777}, Command: []string{"ruby", "foo.rb"}, RubyVersion: "3.1.2"})
	if err != nil {
		t.Fatal(err)
	}
	w.FlushSamples = 10
	for i := 0; i < n; i++ {
		if err := w.Add(repSample(i)); err != nil {
			t.Fatal(err)
		}
	}
	if close {
		if err := w.Close(recording.Stats{}); err != nil {
			t.Fatal(err)
		}
	} else if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
}

// repRun runs the rbscope binary in dir.
func repRun(t *testing.T, dir string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(binPath, args...)
	cmd.Dir = dir
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return o.String(), e.String(), code
}

const repCollapsed = "<main>;Foo#bar 70\nblock in <main>;Kernel#sleep 30\n"

func TestReport(t *testing.T) {
	dir := t.TempDir()
	raw := filepath.Join(dir, "rec.raw.gz")
	repWrite(t, raw, 100, true)

	out, errOut, code := repRun(t, dir, "report", "--input", raw, "--format", "collapsed", "--output", "-")
	if code != 0 || out != repCollapsed || errOut != "" {
		t.Fatalf("collapsed to stdout: code %d stdout %q stderr %q", code, out, errOut)
	}
	out, errOut, code = repRun(t, dir, "report", raw, "--format", "collapsed", "--output", "-")
	if code != 0 || out != repCollapsed || errOut != "" {
		t.Fatalf("the recording as the argument: code %d stdout %q stderr %q", code, out, errOut)
	}
	out, _, code = repRun(t, dir, "report", "-i", raw, "-f", "summary", "--top", "1", "-o", "-")
	want := "rbscope: ruby foo.rb summary: pid 777, 1.00 s, 100 samples at 100 Hz\n" +
		"  % self  % total     self    total  function\n" +
		"   70.00    70.00       70       70  Foo#bar (/app/foo.rb)\n"
	if code != 0 || out != want {
		t.Fatalf("summary: code %d\n%s\nwant:\n%s", code, out, want)
	}

	// Default output name: the input's, in the current directory.
	work := t.TempDir()
	_, errOut, code = repRun(t, work, "report", "--input", raw, "--format", "pprof")
	if code != 0 || errOut != "wrote pprof (100 samples) to rec.pb.gz\n" {
		t.Fatalf("pprof: code %d stderr %q", code, errOut)
	}
	data, err := os.ReadFile(filepath.Join(work, "rec.pb.gz"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := profile.ParseData(data)
	if err != nil {
		t.Fatal(err)
	}
	flat := map[string]int64{}
	for _, s := range p.Sample {
		flat[s.Location[0].Line[0].Function.Name] += s.Value[0]
	}
	if flat["Foo#bar"] != 70 || flat["Kernel#sleep"] != 30 || p.Period != 10_000_000 {
		t.Fatalf("pprof flat %v period %d", flat, p.Period)
	}

	// Every format renders to its default name.
	for _, f := range []string{"flamegraph", "speedscope", "callgrind", "summary-by-line"} {
		_, errOut, code := repRun(t, work, "report", "--input", raw, "--format", f)
		if code != 0 || !strings.HasPrefix(errOut, "wrote "+f+" (100 samples) to rec.") {
			t.Fatalf("%s: code %d stderr %q", f, code, errOut)
		}
		name := strings.TrimSpace(errOut[strings.LastIndex(errOut, " ")+1:])
		b, err := os.ReadFile(filepath.Join(work, name))
		want := "Foo#bar"
		if f == "summary-by-line" {
			want = "   70.00    70.00       70       70  /app/foo.rb:4\n"
		}
		if err != nil || !bytes.Contains(b, []byte(want)) {
			t.Fatalf("%s: %s lacks %q (%v)", f, name, want, err)
		}
	}
}

func TestReportCutShort(t *testing.T) {
	dir := t.TempDir()
	// Never closed: every block is there, the trailer is not.
	raw := filepath.Join(dir, "killed.raw.gz")
	repWrite(t, raw, 100, false)
	out, errOut, code := repRun(t, dir, "report", "-i", raw, "-f", "collapsed", "-o", "-")
	if code != 0 || out != repCollapsed || !strings.Contains(errOut, "ends without its trailer") || !strings.Contains(errOut, "100 samples") {
		t.Fatalf("unclosed: code %d stdout %q stderr %q", code, out, errOut)
	}
	// Torn inside the last block: the 90 samples before it are kept.
	b, err := os.ReadFile(raw)
	if err != nil {
		t.Fatal(err)
	}
	torn := filepath.Join(dir, "torn.raw.gz")
	if err := os.WriteFile(torn, b[:len(b)-5], 0o644); err != nil {
		t.Fatal(err)
	}
	out, errOut, code = repRun(t, dir, "report", "-i", torn, "-f", "collapsed", "-o", "-")
	if code != 0 || out != "<main>;Foo#bar 63\nblock in <main>;Kernel#sleep 27\n" ||
		!strings.Contains(errOut, "damaged after 90 samples") || !strings.Contains(errOut, "truncated") {
		t.Fatalf("torn: code %d stdout %q stderr %q", code, out, errOut)
	}
}

func TestReportBadInput(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.raw.gz")
	repWrite(t, empty, 0, true)
	notRec := filepath.Join(dir, "notes.txt")
	os.WriteFile(notRec, []byte("hello, not a recording\n"), 0o644)
	good := filepath.Join(dir, "good.raw.gz")
	repWrite(t, good, 10, true)
	for _, c := range []struct {
		args []string
		want string
		code int
	}{
		{[]string{"report"}, "needs --input", 2},
		{[]string{"report", "-i", filepath.Join(dir, "missing.raw.gz")}, "no such file", 1},
		{[]string{"report", "-i", notRec}, "not an rbscope recording", 1},
		{[]string{"report", "-i", good, "-f", "svg"}, `unknown format "svg"`, 2},
		{[]string{"report", good, "-i", empty}, "reads one recording", 2},
		{[]string{"report", good, empty}, "accepts at most 1 arg", 2},
		{[]string{"report", "-i", empty, "-f", "summary"}, "holds no samples", 1},
		{[]string{"report", "-i", good, "-o", filepath.Join(dir, "no", "such", "dir", "x.html")}, "no such file", 1},
	} {
		_, errOut, code := repRun(t, dir, c.args...)
		oneLineError(t, errOut, code, c.want)
		if code != c.code {
			t.Errorf("%v: exit %d, want %d", c.args, code, c.code)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "empty.summary.txt")); !os.IsNotExist(err) {
		t.Errorf("an empty recording left an output file: %v", err)
	}
}

// TestReportRealRuby records a real Ruby program, then re-renders the raw
// recording as pprof and checks what go tool pprof reads back.
func TestReportRealRuby(t *testing.T) {
	testutil.NeedRoot(t)
	goBin, err := exec.LookPath("go")
	if err != nil {
		testutil.Missing(t, "the go command (for go tool pprof)")
	}
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		rb.SetProfilerEnv(t)
		dir := t.TempDir()
		script := filepath.Join(dir, "spin.rb")
		os.WriteFile(script, []byte(`def spin_alpha
  x = 0
  200_000.times { x += 1 }
  x
end
sleep 0.01 until File.exist?(ARGV[0]) # rbscope has opened this Ruby: its raw recording exists
t = Time.now
spin_alpha while Time.now - t < 1.5
File.write(ARGV[1], "#{t.to_r.to_f} #{Time.now.to_r.to_f}")
`), 0o644)
		raw := filepath.Join(dir, "spin.raw.gz")
		window := filepath.Join(dir, "window.txt")
		_, errOut, code := repRun(t, dir, append([]string{"record", "--raw", raw, "--format", "collapsed", "--output", filepath.Join(dir, "spin.collapsed.txt"), "--"}, rb.Argv(script, raw, window)...)...)
		if code != 0 {
			t.Fatalf("record: exit %d\n%s", code, errOut)
		}
		// While the script spun (its own clock), spin_alpha is on every
		// stack but those of the loop's condition. Before, Ruby was still
		// booting (RubyGems loads slowly on a loaded machine) or waiting.
		var from, to float64
		if b, err := os.ReadFile(window); err != nil {
			t.Fatalf("the script wrote no window: %v", err)
		} else if _, err := fmt.Sscanf(string(b), "%f %f", &from, &to); err != nil {
			t.Fatalf("window %q: %v", b, err)
		}
		_, samples := recReadRaw(t, raw)
		var in, spin int
		for _, s := range samples {
			at := float64(s.Time.UnixNano()) / 1e9
			if at < from || at > to {
				continue
			}
			in++
			if hasFrame(s, "Object#spin_alpha") {
				spin++
			}
		}
		if in < 20 || float64(spin) < 0.9*float64(in) {
			t.Errorf("%d of the %d samples taken while the script spun are in Object#spin_alpha", spin, in)
		}
		_, errOut, code = repRun(t, dir, "report", "-i", raw, "-f", "pprof")
		if code != 0 || !strings.Contains(errOut, "to spin.pb.gz") {
			t.Fatalf("report: exit %d %s", code, errOut)
		}
		out, err := exec.Command(goBin, "tool", "pprof", "-top", filepath.Join(dir, "spin.pb.gz")).CombinedOutput()
		if err != nil {
			t.Fatalf("go tool pprof: %v\n%s", err, out)
		}
		// "0     0%   100%        130 86.67%  Object#spin_alpha": pprof
		// counts spin_alpha's samples as the recording does.
		var cum float64
		for _, l := range strings.Split(string(out), "\n") {
			f := strings.Fields(l)
			if len(f) == 6 && f[5] == "Object#spin_alpha" {
				cum, _ = strconv.ParseFloat(f[3], 64)
			}
		}
		all := 0
		for _, s := range samples {
			if hasFrame(s, "Object#spin_alpha") {
				all++
			}
		}
		if int(cum) != all {
			t.Fatalf("pprof has %.0f samples in Object#spin_alpha, the recording %d:\n%s", cum, all, out)
		}
		if !strings.Contains(string(out), "block in Object#spin_alpha") || !strings.Contains(string(out), "Integer#times") {
			t.Fatalf("pprof lacks the block or Integer#times:\n%s", out)
		}
	})
}

// TestReportModeCPU: report --mode cpu keeps the samples of threads on a
// CPU that are not waiting for the GVL (running, in GC, or blocked in a C
// function that runs on a CPU), and warns when the recording's on-CPU
// flags are the kernel's run state (made without --mode cpu), not when
// they come from its context switches.
func TestReportModeCPU(t *testing.T) {
	dir := t.TempDir()
	frames := func(name string) []stack.Frame {
		return []stack.Frame{{Name: name, Path: "/app/foo.rb", Line: 4, Kind: stack.KindRuby}}
	}
	// 10 ticks of three threads: main runs Ruby, on a CPU at 6 of them
	// (waiting for a CPU at 4, holding the GVL); zlib is blocked in a C
	// function releasing the GVL, on a CPU at 3; waiter waits for the
	// GVL, the kernel running it at 5.
	write := func(path string, opts map[string]string) {
		w, err := recording.Create(path, recording.Header{RateHz: 100, Start: repT0, Pids: []int{777}, Command: []string{"ruby", "foo.rb"}, Options: opts})
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 10; i++ {
			at := repT0.Add(time.Duration(i) * 10 * time.Millisecond)
			for _, s := range []stack.Sample{
				{TID: 777, ThreadName: "main", Activity: stack.ActivityRunning, GVL: true, OnCPU: i < 6, Frames: frames("Foo#main")},
				{TID: 778, ThreadName: "zlib", Activity: stack.ActivityBlocked, OnCPU: i < 3, Frames: frames("Foo#deflate")},
				{TID: 779, ThreadName: "waiter", Activity: stack.ActivityGVLWait, OnCPU: i < 5, Frames: frames("Foo#wait")},
			} {
				s.Time, s.Pid = at, 777
				if err := w.Add(s); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := w.Close(recording.Stats{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, cpuRecorded := range []bool{true, false} {
		raw := filepath.Join(dir, fmt.Sprintf("cpu-%v.raw.gz", cpuRecorded))
		opts := map[string]string{"mode": "wall"}
		if cpuRecorded {
			opts = map[string]string{"mode": "cpu", record.OnCPUOption: record.OnCPUSwitches}
		}
		write(raw, opts)
		out, errOut, code := repRun(t, dir, "report", "--input", raw, "--mode", "cpu", "--format", "collapsed", "--output", "-")
		if code != 0 || out != "Foo#main 6\nFoo#deflate 3\n" && out != "Foo#deflate 3\nFoo#main 6\n" {
			t.Errorf("recorded in cpu mode %v: code %d stdout %q stderr %q", cpuRecorded, code, out, errOut)
		}
		if warned := strings.Contains(errOut, "was not recorded with --mode cpu"); warned == cpuRecorded {
			t.Errorf("recorded in cpu mode %v: stderr %q", cpuRecorded, errOut)
		}
	}
}

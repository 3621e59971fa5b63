package output

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/rbscope/rbscope/internal/stack"
	"github.com/rbscope/rbscope/internal/testutil"
)

func TestFormats(t *testing.T) {
	want := []string{"callgrind", "collapsed", "flamegraph", "pprof", "speedscope", "summary", "summary-by-line"}
	if got := Formats(); !reflect.DeepEqual(got, want) {
		t.Fatalf("Formats() = %v", got)
	}
	for _, f := range want {
		if DefaultExtension(f) == "" || Describe(f) == "" {
			t.Errorf("%s: no extension or description", f)
		}
	}
	if DefaultExtension("flamegraph") != ".html" || DefaultExtension("pprof") != ".pb.gz" {
		t.Errorf("extensions %q %q", DefaultExtension("flamegraph"), DefaultExtension("pprof"))
	}
	if _, err := New("svg", Options{}); err == nil || !strings.Contains(err.Error(), "flamegraph") {
		t.Fatalf("unknown format error %v", err)
	}
}

func TestCollapsed(t *testing.T) {
	got := string(render(t, "collapsed", synthOptions()))
	want := "<main>;Object#fib;Object#fib;Object#fib 10\n" +
		"<main>;Outer::Inner#level2;Array#each;Outer::Inner#level3 60\n" +
		"block in <main>;Worker#run;Kernel#loop;block in Worker#run;Kernel#sleep 30\n"
	if got != want {
		t.Fatalf("collapsed:\n%s\nwant:\n%s", got, want)
	}
	o := synthOptions()
	o.Lines = true
	got = string(render(t, "collapsed", o))
	want = "<main> (/app/main.rb:3);Outer::Inner#level2 (/app/lib/outer.rb:7);Array#each;Outer::Inner#level3 (/app/lib/outer.rb:12) 60\n" +
		"<main> (/app/main.rb:5);Object#fib (/app/main.rb:3);Object#fib (/app/main.rb:3);Object#fib (/app/main.rb:2) 10\n" +
		"block in <main> (/app/main.rb:9);Worker#run (/app/worker.rb:4);Kernel#loop;block in Worker#run (/app/worker.rb:5);Kernel#sleep 30\n"
	if got != want {
		t.Fatalf("collapsed with lines:\n%s\nwant:\n%s", got, want)
	}
	// Separators inside names must not break the format.
	w, _ := New("collapsed", Options{})
	w.Add(stack.Sample{Frames: []stack.Frame{{Name: "a;b\nc", Kind: stack.KindRuby}}})
	var b bytes.Buffer
	w.WriteTo(&b)
	if b.String() != "a:b c 1\n" {
		t.Fatalf("sanitized %q", b.String())
	}
}

func TestSummary(t *testing.T) {
	got := string(render(t, "summary", synthOptions()))
	want := `rbscope summary: pid 4242, 1.00 s, 100 samples at 100 Hz, 5 without Ruby frames skipped
  % self  % total     self    total  function
   60.00    60.00       60       60  Outer::Inner#level3 (/app/lib/outer.rb)
   30.00    30.00       30       30  Kernel#sleep
   10.00    10.00       10       10  Object#fib (/app/main.rb)
    0.00    70.00        0       70  <main> (/app/main.rb)
    0.00    60.00        0       60  Array#each
    0.00    60.00        0       60  Outer::Inner#level2 (/app/lib/outer.rb)
    0.00    30.00        0       30  Kernel#loop
    0.00    30.00        0       30  Worker#run (/app/worker.rb)
    0.00    30.00        0       30  block in <main> (/app/main.rb)
    0.00    30.00        0       30  block in Worker#run (/app/worker.rb)
`
	if got != want {
		t.Fatalf("summary:\n%s\nwant:\n%s", got, want)
	}
	o := synthOptions()
	o.Top, o.Title = 2, "checkout service"
	got = string(render(t, "summary-by-line", o))
	want = `checkout service summary by line: pid 4242, 1.00 s, 100 samples at 100 Hz, 5 without Ruby frames skipped
  % self  % total     self    total  line
   60.00    60.00       60       60  /app/lib/outer.rb:12
   30.00    30.00       30       30  /app/worker.rb:5
`
	if got != want {
		t.Fatalf("summary-by-line:\n%s\nwant:\n%s", got, want)
	}
	o.Top = 0
	got = string(render(t, "summary-by-line", o))
	for _, l := range []string{
		"   10.00    10.00       10       10  /app/main.rb:2\n",
		"    0.00    70.00        0       70  /app/main.rb:3\n",
		"    0.00    60.00        0       60  /app/lib/outer.rb:7\n",
		"    0.00    10.00        0       10  /app/main.rb:5\n",
	} {
		if !strings.Contains(got, l) {
			t.Errorf("summary-by-line lacks %q:\n%s", l, got)
		}
	}
}

// goTool finds the go command that built this test.
func goTool(t *testing.T) string {
	p := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(p); err == nil {
		return p
	}
	p, err := exec.LookPath("go")
	if err != nil {
		testutil.Missing(t, "go command not found: cannot run go tool pprof")
	}
	return p
}

// pprofTop runs go tool pprof -top and returns flat and cum per function.
func pprofTop(t *testing.T, file string, args ...string) (flat, cum map[string]string) {
	t.Helper()
	cmd := exec.Command(goTool(t), append(append([]string{"tool", "pprof", "-top"}, args...), file)...)
	cmd.Env = append(os.Environ(), "PPROF_TMPDIR="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go tool pprof: %v\n%s", err, out)
	}
	// "      60 60.00% 60.00%         60 60.00%  Outer::Inner#level3"
	re := regexp.MustCompile(`(?m)^[ \t]*(\S+)[ \t]+\S+%[ \t]+\S+%[ \t]+(\S+)[ \t]+\S+%[ \t]+(.+)$`)
	flat, cum = map[string]string{}, map[string]string{}
	for _, m := range re.FindAllStringSubmatch(string(out), -1) {
		flat[m[3]], cum[m[3]] = m[1], m[2]
	}
	if len(flat) == 0 {
		t.Fatalf("no rows in go tool pprof -top output:\n%s", out)
	}
	return flat, cum
}

func TestPprof(t *testing.T) {
	data := render(t, "pprof", synthOptions())
	file := filepath.Join(t.TempDir(), "synth.pb.gz")
	if err := os.WriteFile(file, data, 0o644); err != nil {
		t.Fatal(err)
	}
	flat, cum := pprofTop(t, file)
	wantFlat := map[string]string{"Outer::Inner#level3": "60", "Kernel#sleep": "30", "Object#fib": "10", "<main>": "0", "Array#each": "0"}
	wantCum := map[string]string{"Outer::Inner#level3": "60", "Kernel#sleep": "30", "Object#fib": "10", "<main>": "70",
		"Array#each": "60", "Outer::Inner#level2": "60", "block in <main>": "30", "Worker#run": "30", "block in Worker#run": "30", "Kernel#loop": "30"}
	for fn, w := range wantFlat {
		if flat[fn] != w {
			t.Errorf("pprof flat %s = %q, want %s (all: %v)", fn, flat[fn], w, flat)
		}
	}
	for fn, w := range wantCum {
		if cum[fn] != w {
			t.Errorf("pprof cum %s = %q, want %s (all: %v)", fn, cum[fn], w, cum)
		}
	}
	if len(cum) != len(wantCum) {
		t.Errorf("pprof lists %d functions, want %d: %v", len(cum), len(wantCum), cum)
	}
	flat, _ = pprofTop(t, file, "-sample_index=cpu")
	if flat["Outer::Inner#level3"] != "600ms" || flat["Kernel#sleep"] != "300ms" {
		t.Errorf("pprof cpu flat: %v", flat)
	}

	p, err := profile.ParseData(data)
	if err != nil {
		t.Fatal(err)
	}
	if p.Period != 10_000_000 || p.PeriodType.Type != "cpu" || p.PeriodType.Unit != "nanoseconds" ||
		len(p.SampleType) != 2 || p.SampleType[0].Type != "samples" || p.SampleType[1].Unit != "nanoseconds" ||
		p.TimeNanos != t0.UnixNano() || p.DurationNanos != int64(time.Second) {
		t.Fatalf("profile header: period %d %v %v time %d duration %d", p.Period, p.PeriodType, p.SampleType, p.TimeNanos, p.DurationNanos)
	}
	byThread := map[string][2]int64{}
	for _, s := range p.Sample {
		k := fmt.Sprintf("%s/%d/%d", s.Label["thread"][0], s.NumLabel["tid"][0], s.NumLabel["pid"][0])
		v := byThread[k]
		byThread[k] = [2]int64{v[0] + s.Value[0], v[1] + s.Value[1]}
	}
	want := map[string][2]int64{"main/100/4242": {70, 700_000_000}, "alpha-worker/101/4242": {30, 300_000_000}}
	if !reflect.DeepEqual(byThread, want) {
		t.Fatalf("samples by thread %v, want %v", byThread, want)
	}
	if len(p.Sample) != 3 {
		t.Fatalf("%d pprof samples, want 3 (one per stack and thread)", len(p.Sample))
	}
	// Functions carry their file; C functions have none. Locations have lines.
	for _, s := range p.Sample {
		for _, l := range s.Location {
			fn := l.Line[0].Function
			switch fn.Name {
			case "Outer::Inner#level3":
				if fn.Filename != appFile || l.Line[0].Line != 12 {
					t.Errorf("level3 at %s:%d", fn.Filename, l.Line[0].Line)
				}
			case "Array#each":
				if fn.Filename != "" {
					t.Errorf("Array#each has file %q", fn.Filename)
				}
			}
		}
	}
}

// annotate runs callgrind_annotate and returns the cost per file:function.
func annotate(t *testing.T, file string, args ...string) (total string, costs map[string]string) {
	t.Helper()
	out, err := exec.Command("callgrind_annotate", append(args, file)...).CombinedOutput()
	if err != nil {
		t.Fatalf("callgrind_annotate: %v\n%s", err, out)
	}
	costs = map[string]string{}
	re := regexp.MustCompile(`(?m)^\s*([\d,]+) \(\s*[\d.]+%\)\s+(.+?)\s*$`)
	for _, m := range re.FindAllStringSubmatch(string(out), -1) {
		if m[2] == "PROGRAM TOTALS" {
			total = m[1]
			continue
		}
		costs[m[2]] = m[1]
	}
	return total, costs
}

func TestCallgrind(t *testing.T) {
	if _, err := exec.LookPath("callgrind_annotate"); err != nil {
		testutil.Missing(t, "callgrind_annotate not installed (Debian package valgrind)")
	}
	file := filepath.Join(t.TempDir(), "synth.callgrind.out")
	if err := os.WriteFile(file, render(t, "callgrind", synthOptions()), 0o644); err != nil {
		t.Fatal(err)
	}
	total, self := annotate(t, file)
	wantSelf := map[string]string{
		"/app/lib/outer.rb:Outer::Inner#level3": "60",
		"<native>:Kernel#sleep":                 "30",
		"/app/main.rb:Object#fib":               "10",
	}
	if total != "100" || !reflect.DeepEqual(self, wantSelf) {
		t.Fatalf("callgrind_annotate self: total %q %v, want 100 %v", total, self, wantSelf)
	}
	total, incl := annotate(t, file, "--inclusive=yes")
	wantIncl := map[string]string{
		"/app/main.rb:<main>":                   "70",
		"/app/lib/outer.rb:Outer::Inner#level2": "60",
		"/app/lib/outer.rb:Outer::Inner#level3": "60",
		"<native>:Array#each":                   "60",
		"/app/main.rb:block in <main>":          "30",
		"/app/worker.rb:Worker#run":             "30",
		"/app/worker.rb:block in Worker#run":    "30",
		"<native>:Kernel#loop":                  "30",
		"<native>:Kernel#sleep":                 "30",
		"/app/main.rb:Object#fib":               "10", // recursion counted once
	}
	if total != "100" || !reflect.DeepEqual(incl, wantIncl) {
		t.Fatalf("callgrind_annotate inclusive: total %q %v, want 100 %v", total, incl, wantIncl)
	}
}

func TestCallgrindMutualRecursion(t *testing.T) {
	if _, err := exec.LookPath("callgrind_annotate"); err != nil {
		testutil.Missing(t, "callgrind_annotate not installed (Debian package valgrind)")
	}
	fr := func(name string, line int) stack.Frame {
		return stack.Frame{Name: name, Path: "/r.rb", Line: line, Kind: stack.KindRuby}
	}
	w, _ := New("callgrind", Options{RateHz: 10})
	for i := 0; i < 4; i++ { // main -> a -> b -> a -> b -> leaf
		w.Add(stack.Sample{Pid: 1, TID: 1, Frames: []stack.Frame{fr("leaf", 9), fr("b", 6), fr("a", 3), fr("b", 6), fr("a", 3), fr("<main>", 1)}})
	}
	var b bytes.Buffer
	if _, err := w.WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "rec.callgrind.out")
	os.WriteFile(file, b.Bytes(), 0o644)
	total, incl := annotate(t, file, "--inclusive=yes")
	want := map[string]string{"/r.rb:<main>": "4", "/r.rb:a": "4", "/r.rb:b": "4", "/r.rb:leaf": "4"}
	if total != "4" || !reflect.DeepEqual(incl, want) {
		t.Fatalf("inclusive %q %v, want 4 %v\n%s", total, incl, want, b.String())
	}
}

func TestSpeedscope(t *testing.T) {
	data := render(t, "speedscope", synthOptions())

	// Validate against speedscope's own schema (vendored from npm).
	c := jsonschema.NewCompiler()
	sch, err := c.Compile("testdata/speedscope/file-format-schema.json")
	if err != nil {
		t.Fatal(err)
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	if err := sch.Validate(inst); err != nil {
		t.Fatalf("speedscope output fails the schema: %v", err)
	}
	// The schema must be able to fail: a profile without weights.
	bad, err := jsonschema.UnmarshalJSON(strings.NewReader(strings.Replace(string(data), `"weights"`, `"weightz"`, 1)))
	if err != nil {
		t.Fatal(err)
	}
	if sch.Validate(bad) == nil {
		t.Fatal("schema accepted a profile without weights")
	}

	var f struct {
		Schema string `json:"$schema"`
		Shared struct {
			Frames []ssFrame `json:"frames"`
		} `json:"shared"`
		ActiveProfileIndex int         `json:"activeProfileIndex"`
		Profiles           []ssProfile `json:"profiles"`
	}
	if err := json.Unmarshal(data, &f); err != nil {
		t.Fatal(err)
	}
	if f.Schema != speedscopeSchema || len(f.Profiles) != 2 || f.ActiveProfileIndex != 0 {
		t.Fatalf("schema %q, %d profiles, active %d", f.Schema, len(f.Profiles), f.ActiveProfileIndex)
	}
	names := func(st []int) string {
		var s []string
		for _, i := range st {
			fr := f.Shared.Frames[i]
			s = append(s, fmt.Sprintf("%s@%s:%d", fr.Name, fr.File, fr.Line))
		}
		return strings.Join(s, ";")
	}
	stackA := "<main>@/app/main.rb:3;Outer::Inner#level2@/app/lib/outer.rb:7;Array#each@:0;Outer::Inner#level3@/app/lib/outer.rb:12"
	stackC := "<main>@/app/main.rb:5;Object#fib@/app/main.rb:3;Object#fib@/app/main.rb:3;Object#fib@/app/main.rb:2"
	stackB := "block in <main>@/app/main.rb:9;Worker#run@/app/worker.rb:4;Kernel#loop@:0;block in Worker#run@/app/worker.rb:5;Kernel#sleep@:0"

	m := f.Profiles[0]
	if m.Name != "100 main" || m.Type != "sampled" || m.Unit != "milliseconds" || m.StartValue != 0 || m.EndValue != 1000 || len(m.Samples) != 20 {
		t.Fatalf("main profile: %q %s %s %v..%v, %d samples", m.Name, m.Type, m.Unit, m.StartValue, m.EndValue, len(m.Samples))
	}
	var sum float64
	for i, st := range m.Samples {
		want, w := stackA, 60.0
		if i%2 == 1 {
			want, w = stackC, 10
		}
		if got := names(st); got != want || m.Weights[i] != w {
			t.Fatalf("main sample %d: %s weight %v, want %s weight %v", i, got, m.Weights[i], want, w)
		}
		sum += m.Weights[i]
	}
	if sum != 700 {
		t.Fatalf("main weights sum to %v ms, want 700", sum)
	}
	a := f.Profiles[1]
	if a.Name != "101 alpha-worker" || a.StartValue != 60 || a.EndValue != 990 || len(a.Samples) != 1 ||
		names(a.Samples[0]) != stackB || a.Weights[0] != 300 {
		t.Fatalf("worker profile: %q %v..%v %v %v", a.Name, a.StartValue, a.EndValue, a.Samples, a.Weights)
	}

	// Without a rate, weights are sample counts.
	o := synthOptions()
	o.RateHz = 0
	if err := json.Unmarshal(render(t, "speedscope", o), &f); err != nil {
		t.Fatal(err)
	}
	if p := f.Profiles[1]; p.Unit != "none" || p.StartValue != 0 || p.EndValue != 30 || p.Weights[0] != 30 {
		t.Fatalf("rate-less worker profile %+v", p)
	}
}

// fgTree decodes the flame graph's embedded data into "path total self"
// lines, children in page order.
func fgTree(t *testing.T, page []byte) []string {
	t.Helper()
	m := regexp.MustCompile(`(?s)<script id="data" type="application/json">(.*?)</script>`).FindSubmatch(page)
	if m == nil {
		t.Fatal("flame graph has no data script")
	}
	var d struct {
		Strings []string          `json:"strings"`
		Root    []json.RawMessage `json:"root"`
	}
	if err := json.Unmarshal(m[1], &d); err != nil {
		t.Fatal(err)
	}
	var out []string
	var walk func(prefix string, a []json.RawMessage)
	walk = func(prefix string, a []json.RawMessage) {
		var v [5]int
		for i := range v {
			json.Unmarshal(a[i], &v[i])
		}
		p := prefix + d.Strings[v[0]]
		out = append(out, fmt.Sprintf("%s %d %d", p, v[3], v[4]))
		for _, c := range a[5:] {
			var ca []json.RawMessage
			json.Unmarshal(c, &ca)
			walk(p+";", ca)
		}
	}
	walk("", d.Root)
	return out
}

func TestFlamegraphData(t *testing.T) {
	page := render(t, "flamegraph", synthOptions())
	got := fgTree(t, page)
	want := []string{
		"all 100 0",
		"all;<main> 70 0",
		"all;<main>;Object#fib 10 0",
		"all;<main>;Object#fib;Object#fib 10 0",
		"all;<main>;Object#fib;Object#fib;Object#fib 10 10",
		"all;<main>;Outer::Inner#level2 60 0",
		"all;<main>;Outer::Inner#level2;Array#each 60 0",
		"all;<main>;Outer::Inner#level2;Array#each;Outer::Inner#level3 60 60",
		"all;block in <main> 30 0",
		"all;block in <main>;Worker#run 30 0",
		"all;block in <main>;Worker#run;Kernel#loop 30 0",
		"all;block in <main>;Worker#run;Kernel#loop;block in Worker#run 30 0",
		"all;block in <main>;Worker#run;Kernel#loop;block in Worker#run;Kernel#sleep 30 30",
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("flame graph tree:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	s := string(page)
	for _, need := range []string{"<title>rbscope: pid 4242</title>", "pid 4242, 1.00 s, 100 samples at 100 Hz"} {
		if !strings.Contains(s, need) {
			t.Errorf("flame graph lacks %q", need)
		}
	}
	// Self-contained: nothing fetched from elsewhere.
	if regexp.MustCompile(`(?i)(src|href)\s*=|https?://|@import|url\(`).MatchString(s) {
		t.Error("flame graph refers to external resources")
	}
	// A hostile frame name cannot break out of the script element.
	w, _ := New("flamegraph", Options{Title: "<b>t</b>"})
	w.Add(stack.Sample{Frames: []stack.Frame{{Name: "</script><script>alert(1)</script>", Kind: stack.KindRuby}}})
	var b bytes.Buffer
	w.WriteTo(&b)
	if strings.Contains(b.String(), "alert(1)</script>") || strings.Contains(b.String(), "<b>t</b>") {
		t.Fatal("frame name or title not escaped")
	}
}

// chromium runs headless Chromium on url with extra flags and returns its
// standard output.
func chromium(t *testing.T, url string, flags ...string) []byte {
	t.Helper()
	bin := ""
	for _, n := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(n); err == nil {
			bin = p
			break
		}
	}
	if bin == "" {
		testutil.Missing(t, "chromium not installed (Debian package chromium): cannot render the flame graph")
	}
	args := append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
		"--disable-component-update", "--disable-sync", "--no-first-run", "--user-data-dir=" + t.TempDir(),
		"--window-size=1200,600"}, flags...)
	cmd := exec.Command(bin, append(args, url)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
	})
	select {
	case err := <-done:
		done <- err
		if err != nil {
			t.Fatalf("chromium: %v\n%s", err, stderr.Bytes())
		}
	case <-time.After(90 * time.Second):
		t.Fatalf("chromium did not finish in 90 s\n%s", stderr.Bytes())
	}
	return stdout.Bytes()
}

func artifactDir(t *testing.T) string {
	if d := os.Getenv("RBSCOPE_ARTIFACTS"); d != "" {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		return d
	}
	return t.TempDir()
}

func TestFlamegraphInChromium(t *testing.T) {
	dir := artifactDir(t)
	page := filepath.Join(dir, "flamegraph-synth.html")
	if err := os.WriteFile(page, render(t, "flamegraph", synthOptions()), 0o644); err != nil {
		t.Fatal(err)
	}
	url := "file://" + page
	dom := string(chromium(t, url, "--dump-dom"))
	frame := regexp.MustCompile(`<div class="f( anc)?( match)?" title="([^"]*)" style="left: ([\d.]+)%; width: ([\d.]+)%;[^"]*">([^<]*)</div>`)
	rendered := map[string]string{} // name -> width %
	for _, m := range frame.FindAllStringSubmatch(dom, -1) {
		rendered[htmlUnescape(m[6])] = m[5]
	}
	want := map[string]string{"all": "100", "<main>": "70", "Outer::Inner#level2": "60", "Array#each": "60", "Outer::Inner#level3": "60",
		"Object#fib": "10", "block in <main>": "30", "Worker#run": "30", "Kernel#loop": "30", "block in Worker#run": "30", "Kernel#sleep": "30"}
	if !reflect.DeepEqual(rendered, want) {
		t.Fatalf("rendered frames (name: width%%) %v, want %v\nDOM:\n%.3000s", rendered, want, dom)
	}
	if !strings.Contains(dom, "title=\"Kernel#sleep\n30 samples (30.00%), self 30 (30.00%)\"") {
		t.Errorf("no tooltip with samples and percentage for Kernel#sleep")
	}

	// Search and zoom preset from the URL fragment.
	dom = string(chromium(t, url+"#s=fib&z=block+in+%3Cmain%3E", "--dump-dom"))
	if !strings.Contains(dom, "Matched: 10 samples (10.00%)") {
		t.Errorf("search for fib does not report 10 samples (10.00%%)")
	}
	zoomed := map[string]string{}
	for _, m := range frame.FindAllStringSubmatch(dom, -1) {
		zoomed[htmlUnescape(m[6])] = m[1] + m[2] + " " + m[5]
	}
	wantZoom := map[string]string{"all": " anc 100", "block in <main>": " 100", "Worker#run": " 100", "Kernel#loop": " 100", "block in Worker#run": " 100", "Kernel#sleep": " 100"}
	if !reflect.DeepEqual(zoomed, wantZoom) {
		t.Errorf("zoomed on block in <main>: %v, want %v", zoomed, wantZoom)
	}

	shot := filepath.Join(dir, "flamegraph-synth.png")
	chromium(t, url, "--screenshot="+shot)
	fi, err := os.Stat(shot)
	if err != nil || fi.Size() < 1000 {
		t.Fatalf("screenshot %s: %v", shot, err)
	}
	t.Logf("flame graph %s, screenshot %s", page, shot)
}

func htmlUnescape(s string) string {
	return strings.NewReplacer("&lt;", "<", "&gt;", ">", "&amp;", "&", "&quot;", `"`).Replace(s)
}

func TestRender(t *testing.T) {
	samples := synthSamples()
	i := 0
	next := func() (stack.Sample, error) {
		if i == len(samples) {
			return stack.Sample{}, io.EOF
		}
		i++
		return samples[i-1], nil
	}
	path := filepath.Join(t.TempDir(), "out.txt")
	n, _, err := RenderFile("collapsed", Options{}, next, path, WriteOptions{})
	if err != nil || n != 105 {
		t.Fatalf("RenderFile: %d, %v", n, err)
	}
	got, _ := os.ReadFile(path)
	if !bytes.Equal(got, render(t, "collapsed", Options{})) {
		t.Fatalf("RenderFile wrote %q", got)
	}
	// A failing source leaves no file behind.
	boom := errors.New("boom")
	bad := filepath.Join(t.TempDir(), "bad.txt")
	_, _, err = RenderFile("collapsed", Options{}, func() (stack.Sample, error) { return stack.Sample{}, boom }, bad, WriteOptions{})
	if !errors.Is(err, boom) {
		t.Fatalf("RenderFile error %v", err)
	}
	ents, _ := os.ReadDir(filepath.Dir(bad))
	if len(ents) != 0 {
		t.Fatalf("failed render left %v", ents)
	}
}

// deepSample is a 50-frame stack; variant picks one of a few leaves.
func deepSample(variant int) stack.Sample {
	fr := make([]stack.Frame, 50)
	for i := range fr {
		fr[i] = stack.Frame{Name: "Module" + strconv.Itoa(i%7) + "::Klass#method_" + strconv.Itoa(i), Path: "/app/lib/module_" + strconv.Itoa(i%7) + ".rb", Line: 10 + i, Kind: stack.KindRuby}
	}
	fr[0].Name = "Leaf#work_" + strconv.Itoa(variant%8)
	fr[0].Line = variant % 13
	return stack.Sample{Time: t0.Add(time.Duration(variant) * 10 * time.Millisecond), Pid: 4242, TID: 100 + variant%4, ThreadName: "worker", Frames: fr}
}

func BenchmarkAdd(b *testing.B) { benchAdd(b, func(i int) int { return i }) }

// benchAdd times Add in every format over 1024 deep samples, sample i
// being deepSample(variant(i)); as from a walker, the samples of one
// variant share their frames and their stack ID.
func benchAdd(b *testing.B, variant func(int) int) {
	samples := make([]stack.Sample, 1024)
	made := map[int]stack.Sample{}
	for i := range samples {
		v := variant(i)
		s, ok := made[v]
		if !ok {
			s = deepSample(v)
			s.Stack = stack.NewID()
			made[v] = s
		}
		samples[i] = s
	}
	for _, f := range Formats() {
		b.Run(f, func(b *testing.B) {
			w, _ := New(f, Options{RateHz: 100})
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				w.Add(samples[i%len(samples)])
			}
		})
	}
}

// TestFlamegraphDeepRecursion renders a 12000-frame stack (Ruby's own
// limit is around there): the page must not overflow its stack.
func TestFlamegraphDeepRecursion(t *testing.T) {
	w, _ := New("flamegraph", Options{RateHz: 100})
	fr := make([]stack.Frame, 12000)
	for i := range fr {
		fr[i] = stack.Frame{Name: "Object#rec" + strconv.Itoa(i%3), Path: "/r.rb", Line: 3, Kind: stack.KindRuby}
	}
	w.Add(stack.Sample{Pid: 1, TID: 1, Frames: fr})
	page := filepath.Join(t.TempDir(), "deep.html")
	f, err := os.Create(page)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteTo(f); err != nil {
		t.Fatal(err)
	}
	f.Close()
	// One chain: the root, the outermost frame, a row folding 11998
	// frames, the innermost frame.
	dom := chromium(t, "file://"+page, "--dump-dom")
	if n := bytes.Count(dom, []byte(`<div class="f"`)); n != 3 {
		t.Fatalf("%d frames rendered, want 3 (the root, the first and last frames)", n)
	}
	if !bytes.Contains(dom, []byte(`<div class="f chain" data-frames="11998"`)) {
		t.Fatalf("no row folding the 11998 frames between the first and the last")
	}
}

func TestSpeedscopeSeveralProcesses(t *testing.T) {
	w, _ := New("speedscope", Options{RateHz: 50})
	fr := []stack.Frame{{Name: "Job#perform", Path: "/app/job.rb", Line: 7, Kind: stack.KindRuby}}
	w.Add(stack.Sample{Time: t0, Pid: 20, TID: 21, ThreadName: "worker", Frames: fr})
	w.Add(stack.Sample{Time: t0.Add(20 * time.Millisecond), Pid: 10, TID: 11, Frames: fr})
	w.Add(stack.Sample{Time: t0.Add(40 * time.Millisecond), Pid: 10, TID: 11, Frames: fr})
	var b bytes.Buffer
	if _, err := w.WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	var f struct {
		ActiveProfileIndex int         `json:"activeProfileIndex"`
		Profiles           []ssProfile `json:"profiles"`
	}
	if err := json.Unmarshal(b.Bytes(), &f); err != nil {
		t.Fatal(err)
	}
	if len(f.Profiles) != 2 || f.Profiles[0].Name != "11 (pid 10)" || f.Profiles[1].Name != "21 worker (pid 20)" || f.ActiveProfileIndex != 0 {
		t.Fatalf("profiles %+v active %d", f.Profiles, f.ActiveProfileIndex)
	}
	// Relative to the first sample: pid 10's thread runs from 20 ms to 40 ms plus a 20 ms period.
	if p := f.Profiles[0]; p.StartValue != 20 || p.EndValue != 60 || len(p.Weights) != 1 || p.Weights[0] != 40 {
		t.Fatalf("pid 10 profile %+v", p)
	}
}

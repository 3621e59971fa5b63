package alloc

import (
	"bytes"
	"encoding/json"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"

	"github.com/rbscope/rbscope/internal/stack"
	"github.com/rbscope/rbscope/internal/testutil"
)

func sampleReport() *Report {
	r := &Report{
		Pid:      4242,
		Duration: 2500 * time.Millisecond,
		Mode:     "usdt",
		Scale:    1,
		Scaling:  "exact",
		Attached: 1,
		ByClass: []ClassCount{
			{Class: "String", Count: 300, Bytes: 4096},
			{Class: "Widget", Count: 200},
			{Class: "Array", Count: 200, Bytes: 1600},
		},
		BySite: []SiteCount{
			{Class: "Widget", Path: "/abs/app.rb", Line: 8, Count: 200},
			{Class: "String", Path: "/abs/app.rb", Line: 9, Count: 150, Bytes: 2048},
			{Class: "String", Path: "/abs/lib.rb", Line: 3, Count: 150, Bytes: 2048},
			{Class: "Array", Path: "", Line: 0, Count: 200, Bytes: 1600},
		},
	}
	sortReport(r)
	return r
}

func TestWriteJSON(t *testing.T) {
	var b bytes.Buffer
	if err := sampleReport().WriteJSON(&b, 0); err != nil {
		t.Fatal(err)
	}
	// The contract, exactly: these keys and no others, sorted by count.
	var got map[string]any
	if err := json.Unmarshal(b.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"pid": 4242.0, "duration_s": 2.5, "estimated": false,
		"scaling": "exact", "scale": 1.0, "attached_fraction": 1.0,
		"by_class": []any{
			map[string]any{"class": "String", "count": 300.0, "bytes": 4096.0},
			map[string]any{"class": "Array", "count": 200.0, "bytes": 1600.0},
			map[string]any{"class": "Widget", "count": 200.0, "bytes": 0.0},
		},
		"by_site": []any{
			map[string]any{"class": "Array", "path": "", "line": 0.0, "count": 200.0},
			map[string]any{"class": "Widget", "path": "/abs/app.rb", "line": 8.0, "count": 200.0},
			map[string]any{"class": "String", "path": "/abs/app.rb", "line": 9.0, "count": 150.0},
			map[string]any{"class": "String", "path": "/abs/lib.rb", "line": 3.0, "count": 150.0},
		},
	}
	gj, _ := json.Marshal(got)
	wj, _ := json.Marshal(want)
	if string(gj) != string(wj) {
		t.Errorf("JSON\n%s\nwant\n%s", gj, wj)
	}
	// Key order as documented.
	s := b.String()
	order := []string{`"pid"`, `"duration_s"`, `"estimated"`, `"scaling"`, `"by_class"`, `"by_site"`}
	last := -1
	for _, k := range order {
		i := strings.Index(s, k)
		if i < last {
			t.Errorf("key %s out of order in %s", k, s)
		}
		last = i
	}
	b.Reset()
	empty := &Report{Pid: 1}
	if err := empty.WriteJSON(&b, 0); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), `"by_class": []`) || !strings.Contains(b.String(), `"by_site": []`) {
		t.Errorf("empty report should have empty lists, not null: %s", b.String())
	}
	b.Reset()
	if err := sampleReport().WriteJSON(&b, 1); err != nil {
		t.Fatal(err)
	}
	var top struct {
		ByClass []any `json:"by_class"`
		BySite  []any `json:"by_site"`
	}
	json.Unmarshal(b.Bytes(), &top)
	if len(top.ByClass) != 1 || len(top.BySite) != 1 {
		t.Errorf("top 1: %d classes, %d sites", len(top.ByClass), len(top.BySite))
	}
}

func TestWriteText(t *testing.T) {
	var b bytes.Buffer
	if err := sampleReport().WriteText(&b, "line", 0); err != nil {
		t.Fatal(err)
	}
	want := `# rbscope alloc: pid 4242, 2.5s, 700 allocations
       200 (unknown):0:Array
       200 /abs/app.rb:8:Widget
       150 /abs/app.rb:9:String
       150 /abs/lib.rb:3:String
`
	if b.String() != want {
		t.Errorf("by line:\n%s\nwant\n%s", b.String(), want)
	}
	b.Reset()
	r := sampleReport()
	r.Estimated, r.Scale = true, 10
	if err := r.WriteText(&b, "class", 2); err != nil {
		t.Fatal(err)
	}
	want = `# rbscope alloc: pid 4242, 2.5s, 700 allocations (estimated: counts scaled by 10)
     COUNT        BYTES  CLASS
       300         4096  String
       200         1600  Array
`
	if b.String() != want {
		t.Errorf("by class:\n%s\nwant\n%s", b.String(), want)
	}
	if err := r.WriteText(&b, "bogus", 0); err == nil {
		t.Error("unknown grouping accepted")
	}
}

func TestPprof(t *testing.T) {
	var b bytes.Buffer
	if err := sampleReport().WritePprof(&b); err != nil {
		t.Fatal(err)
	}
	p, err := profile.Parse(bytes.NewReader(b.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if len(p.SampleType) != 2 || p.SampleType[0].Type != "alloc_objects" || p.SampleType[1].Type != "alloc_space" || p.SampleType[1].Unit != "bytes" {
		t.Fatalf("sample types %v", p.SampleType)
	}
	got := map[string][2]int64{}
	for _, s := range p.Sample {
		ln := s.Location[0].Line[0]
		got[ln.Function.Filename+":"+ln.Function.Name+":"+itoa(ln.Line)] = [2]int64{s.Value[0], s.Value[1]}
	}
	want := map[string][2]int64{
		"/abs/app.rb:Widget:8": {200, 0},
		"/abs/app.rb:String:9": {150, 2048},
		"/abs/lib.rb:String:3": {150, 2048},
		"(unknown):Array:0":    {200, 1600},
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %v, want %v (all: %v)", k, got[k], v, got)
		}
	}
	if p.DurationNanos != int64(2500*time.Millisecond) {
		t.Errorf("duration %d", p.DurationNanos)
	}

	// go tool pprof reads it.
	goBin, err := exec.LookPath("go")
	if err != nil {
		testutil.Missing(t, "go on PATH")
	}
	f := filepath.Join(t.TempDir(), "alloc.pb.gz")
	if err := os.WriteFile(f, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(goBin, "tool", "pprof", "-top", "-sample_index=alloc_objects", f).CombinedOutput()
	if err != nil {
		t.Fatalf("go tool pprof: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "String") || !strings.Contains(string(out), "Widget") || !strings.Contains(string(out), "700 total") {
		t.Errorf("go tool pprof -top:\n%s", out)
	}
}

// TestPprofClassesOnly: counted by class only (--no-sites) without
// stacks, the profile still holds every class's count (it held none: its
// samples were the sites).
func TestPprofClassesOnly(t *testing.T) {
	r := sampleReport()
	r.BySite, r.ClassesOnly = nil, true
	p, err := r.Profile()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, s := range p.Sample {
		got[s.Location[0].Line[0].Function.Name] += s.Value[0]
	}
	if want := map[string]int64{"String": 300, "Widget": 200, "Array": 200}; !maps.Equal(got, want) {
		t.Errorf("classes in the profile %v, want %v", got, want)
	}
}

func itoa(v int64) string { return strconv.FormatInt(v, 10) }

// TestStackViews: the text and JSON views add the top stacks to class and
// site; the pprof profile has one sample per stack plus the classes no
// stack caught, and its total is the report's.
func TestStackViews(t *testing.T) {
	r := sampleReport()
	r.StackSamples = 30
	r.Stacks = []StackCount{
		{Class: "Widget", Count: 150, Samples: 20, Frames: []stack.Frame{
			{Name: "C#inner", Path: "/abs/app.rb", Line: 3, Kind: stack.KindRuby},
			{Name: "B#middle", Path: "/abs/app.rb", Line: 7, Kind: stack.KindRuby},
		}},
		{Class: "Widget", Count: 50, Samples: 10, Frames: []stack.Frame{{Name: "<main>", Path: "/abs/app.rb", Line: 9, Kind: stack.KindRuby}}},
	}
	var b bytes.Buffer
	if err := r.WriteText(&b, "line", 0); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"# top allocation stacks (30 sampled stacks", "       150 Widget\n", "C#inner (/abs/app.rb:3)", "/abs/app.rb:8:Widget"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("text lacks %q:\n%s", want, b.String())
		}
	}
	b.Reset()
	if err := r.WriteJSON(&b, 0); err != nil {
		t.Fatal(err)
	}
	var j struct {
		TopStacks []struct {
			Class  string `json:"class"`
			Count  int    `json:"count"`
			Frames []struct {
				Name string `json:"name"`
			} `json:"frames"`
		} `json:"top_stacks"`
	}
	if err := json.Unmarshal(b.Bytes(), &j); err != nil {
		t.Fatal(err)
	}
	if len(j.TopStacks) != 2 || j.TopStacks[0].Count != 150 || j.TopStacks[0].Frames[1].Name != "B#middle" {
		t.Errorf("top_stacks %+v", j.TopStacks)
	}
	p, err := r.Profile()
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, s := range p.Sample {
		total += s.Value[0]
	}
	if total != 700 { // 300 String + 200 Array (no stacks) + 200 Widget
		t.Errorf("profile total %d, want 700", total)
	}
	if n := len(p.Sample); n != 4 {
		t.Errorf("%d samples, want 2 stacks + String + Array", n)
	}
}

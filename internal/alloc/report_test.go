package alloc

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"
	"github.com/rbscope/rbscope/internal/testutil"
)

func sampleReport() *Report {
	r := &Report{
		Pid:      4242,
		Duration: 2500 * time.Millisecond,
		Mode:     "usdt",
		Scale:    1,
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
	order := []string{`"pid"`, `"duration_s"`, `"estimated"`, `"by_class"`, `"by_site"`}
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
		testutil.Missing(t, "go not on PATH")
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

func itoa(v int64) string { return strconv.FormatInt(v, 10) }

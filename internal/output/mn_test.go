package output

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/stack"
)

// mnSamples: two Ruby threads of one name (a pool's) under M:N threads,
// each moving between native threads 7001 and 7002 and at times on none
// (tid 0): 12 samples each, then a third that never had a native thread.
func mnSamples() []stack.Sample {
	frames := []stack.Frame{{Name: "Object#spin", Path: mainFile, Line: 2, Kind: stack.KindRuby},
		{Name: "block in <main>", Path: mainFile, Line: 5, Kind: stack.KindRuby}}
	var out []stack.Sample
	for i := 0; i < 24; i++ {
		s := stack.Sample{Time: t0.Add(time.Duration(i) * 10 * time.Millisecond), Pid: 4242, ThreadName: "sp",
			ThreadID: 0x55d0c8a3b000 + uint64(i%2)*0x400, TID: []int{7001, 0, 7002}[i/2%3], OnCPU: true, Activity: stack.ActivityRunning, Frames: frames}
		out = append(out, s)
	}
	out = append(out, stack.Sample{Time: t0.Add(250 * time.Millisecond), Pid: 4242, ThreadName: "lonely",
		ThreadID: 0x55d0c8a3c000, Activity: stack.ActivityGVLWait, Frames: frames})
	return out
}

func renderMN(t *testing.T, format string, o Options) string {
	t.Helper()
	w, err := New(format, o)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range mnSamples() {
		w.Add(s)
	}
	var b bytes.Buffer
	if _, err := w.WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestRubyThreadsNeverSplit: a Ruby thread that moves between native
// threads (M:N) is one thread in every output that shows threads, shown
// with the latest native thread it was seen on.
func TestRubyThreadsNeverSplit(t *testing.T) {
	o := synthOptions()
	o.Threads = true
	// The last sample of thread 0 (i=22) was on 7002, of thread 1 (i=23)
	// on 7002 as well: two lines, one per Ruby thread, not one per tid.
	got := renderMN(t, "collapsed", o)
	want := "thread lonely (no tid);block in <main>;Object#spin 1\n" +
		"thread sp (7002);block in <main>;Object#spin 24\n"
	if got != want {
		t.Errorf("collapsed --threads:\n%s\nwant:\n%s", got, want)
	}

	var ss struct {
		Profiles []struct {
			Name    string  `json:"name"`
			Samples [][]int `json:"samples"`
			Weights []float64
		} `json:"profiles"`
	}
	if err := json.Unmarshal([]byte(renderMN(t, "speedscope", o)), &ss); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range ss.Profiles {
		n := 0.0
		for _, w := range p.Weights {
			n += w
		}
		names = append(names, p.Name)
		if p.Name == "7002 sp" && n != 120 {
			t.Errorf("speedscope profile %q: %v ms, want 12 samples of 10 ms", p.Name, n)
		}
	}
	if strings.Join(names, "|") != "no tid lonely|7002 sp|7002 sp" {
		t.Errorf("speedscope profiles %q, want one per Ruby thread", names)
	}

	page := renderMN(t, "flamegraph", o)
	m := regexp.MustCompile(`(?s)<script id="data" type="application/json">(.*?)</script>`).FindStringSubmatch(page)
	var d struct {
		Strings []string `json:"strings"`
		Threads [][3]int `json:"threads"`
	}
	if m == nil || json.Unmarshal([]byte(m[1]), &d) != nil {
		t.Fatal("flame graph data unreadable")
	}
	var lanes []string
	for _, th := range d.Threads {
		lanes = append(lanes, d.Strings[th[2]]+" "+stack.TIDText(th[1]))
	}
	if strings.Join(lanes, "|") != "sp 7002|sp 7002|lonely no tid" {
		t.Errorf("flame graph lanes %q, want one per Ruby thread", lanes)
	}

	o.Threads = false
	sum := renderMN(t, "summary", o)
	if n := strings.Count(sum, "sp (pid 4242 tid 7002)"); n != 2 || !strings.Contains(sum, "lonely (pid 4242 tid no tid)") || strings.Contains(sum, "tid 0") || strings.Contains(sum, "tid 7001") {
		t.Errorf("summary threads: want two sp rows at tid 7002 and lonely without a tid:\n%s", sum)
	}
}

package output

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/stack"
	"github.com/rbscope/rbscope/internal/testutil"
)

// activitySamples: two threads over one second at 100 Hz. "web" runs
// Web#handle for 500 ms, then blocks in IO#read; "job" waits for the GVL
// in Job#crunch for 500 ms, then runs GC under Job#alloc.
func activitySamples() []stack.Sample {
	main := stack.Frame{Name: "<main>", Path: "/app/main.rb", Line: 1, Kind: stack.KindRuby}
	var out []stack.Sample
	for i := 0; i < 100; i++ {
		at := t0.Add(time.Duration(i) * 10 * time.Millisecond)
		web := stack.Sample{Time: at, Pid: 10, TID: 11, ThreadName: "web", Activity: stack.ActivityRunning, GVL: true,
			Frames: []stack.Frame{{Name: "Web#handle", Path: "/app/web.rb", Line: 5, Kind: stack.KindRuby}, main}}
		job := stack.Sample{Time: at, Pid: 10, TID: 12, ThreadName: "job", Activity: stack.ActivityGVLWait,
			Frames: []stack.Frame{{Name: stack.FrameGVLWait, Kind: stack.KindGVL}, {Name: "Job#crunch", Path: "/app/job.rb", Line: 9, Kind: stack.KindRuby}, main}}
		if i >= 50 {
			web.Activity, web.GVL = stack.ActivityBlocked, false
			web.Frames = []stack.Frame{{Name: "IO#read", Path: "/app/web.rb", Line: 7, Kind: stack.KindCFunc}, main}
			job.Activity, job.GVL = stack.ActivityGC, true
			job.Frames = []stack.Frame{{Name: stack.FrameMarking, Kind: stack.KindGC}, {Name: stack.FrameGC, Kind: stack.KindGC},
				{Name: "Job#alloc", Path: "/app/job.rb", Line: 12, Kind: stack.KindRuby}, main}
		}
		out = append(out, web, job)
	}
	return out
}

func renderSamples(t *testing.T, format string, o Options, samples []stack.Sample) []byte {
	t.Helper()
	w, err := New(format, o)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range samples {
		w.Add(s)
	}
	var b bytes.Buffer
	if _, err := w.WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func TestCollapsedThreads(t *testing.T) {
	got := string(renderSamples(t, "collapsed", Options{Threads: true}, activitySamples()))
	want := `thread job (12);<main>;Job#alloc;(garbage collection);(marking) 50
thread job (12);<main>;Job#crunch;(waiting for GVL) 50
thread web (11);<main>;IO#read 50
thread web (11);<main>;Web#handle 50
`
	if got != want {
		t.Fatalf("collapsed --threads:\n%s\nwant:\n%s", got, want)
	}
}

func TestSummaryActivities(t *testing.T) {
	got := string(renderSamples(t, "summary", Options{RateHz: 100}, activitySamples()))
	for _, want := range []string{
		"thread activity (share of each thread's samples)",
		"     100    50.0%     0.0%    50.0%     0.0%  web (pid 10 tid 11)",
		"     100     0.0%    50.0%     0.0%    50.0%  job (pid 10 tid 12)",
		"(garbage collection)", "(waiting for GVL)",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("summary lacks %q:\n%s", want, got)
		}
	}
}

// TestFlamegraphTimelineInChromium loads the flame graph in headless
// Chromium: one timeline lane per thread with runs coloured by activity,
// and a time range (as a drag selects it, here preset from the URL), the
// thread selector and the activity filter each change the graph.
func TestFlamegraphTimelineInChromium(t *testing.T) {
	dir := artifactDir(t)
	page := filepath.Join(dir, "flamegraph-timeline.html")
	if err := os.WriteFile(page, renderSamples(t, "flamegraph", Options{RateHz: 100}, activitySamples()), 0o644); err != nil {
		t.Fatal(err)
	}
	url := "file://" + page
	frame := regexp.MustCompile(`<div class="f( anc)?( match)?" title="[^"]*" style="left: ([\d.]+)%; width: ([\d.]+)%;[^"]*">([^<]*)</div>`)
	frames := func(dom string) map[string]string {
		out := map[string]string{}
		for _, m := range frame.FindAllStringSubmatch(dom, -1) {
			out[htmlUnescape(m[5])] = m[4]
		}
		return out
	}
	dom := string(chromium(t, url, "--dump-dom"))
	lanes := regexp.MustCompile(`<div class="lane" data-tid="(\d+)">`).FindAllStringSubmatch(dom, -1)
	if len(lanes) != 2 || lanes[0][1] != "11" || lanes[1][1] != "12" {
		t.Fatalf("timeline lanes %v, want threads 11 and 12\n%.3000s", lanes, dom)
	}
	runs := regexp.MustCompile(`<div class="run act-(\w+)" title="([^"]*)" style="left: ([\d.]+)%; width: ([\d.]+)%;`).FindAllStringSubmatch(dom, -1)
	var got []string
	for _, r := range runs {
		got = append(got, r[1]+"@"+r[3]+"+"+r[4])
	}
	if want := []string{"running@0+50", "blocked@50+50", "gvl_wait@0+50", "gc@50+50"}; strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("runs %v, want %v", got, want)
	}
	// By default web's 50 samples blocked in IO#read are idle, hidden:
	// the others share the graph.
	if f := frames(dom); f["Web#handle"] != "33.3333" || f["IO#read"] != "" || f["(marking)"] != "33.3333" || f["(waiting for GVL)"] != "33.3333" {
		t.Errorf("whole recording, idle hidden: frames %v", f)
	}
	if !strings.Contains(dom, "200 samples: running 25.0%, gvl_wait 25.0%, blocked 25.0%, gc 25.0%") {
		t.Errorf("no activity shares for the whole recording")
	}
	if !strings.Contains(dom, `<span id="idleinfo">50 idle samples hidden (25.0%`) {
		t.Errorf("the page does not say that 50 idle samples are hidden")
	}
	dom = string(chromium(t, url+"#idle=1", "--dump-dom"))
	if f := frames(dom); f["Web#handle"] != "25" || f["IO#read"] != "25" || f["(marking)"] != "25" || f["(waiting for GVL)"] != "25" {
		t.Errorf("whole recording, idle shown: frames %v", f)
	}
	if !strings.Contains(dom, "(50 idle samples shown)") {
		t.Errorf("the page does not say that 50 idle samples are shown")
	}
	// Choosing the activity blocked, or web's thread, shows the idle samples.
	dom = string(chromium(t, url+"#act=blocked", "--dump-dom"))
	if f := frames(dom); f["IO#read"] != "100" || f["Web#handle"] != "" {
		t.Errorf("activity blocked: frames %v", f)
	}
	dom = string(chromium(t, url+"#th=11", "--dump-dom"))
	if f := frames(dom); f["IO#read"] != "50" || f["Web#handle"] != "50" || !strings.Contains(dom, `<span id="idleinfo"></span>`) {
		t.Errorf("thread 11: frames %v", f)
	}

	// The first half: Web#handle and the GVL wait only.
	dom = string(chromium(t, url+"#r=0-500", "--dump-dom"))
	if f := frames(dom); f["Web#handle"] != "50" || f["(waiting for GVL)"] != "50" || f["IO#read"] != "" || f["(marking)"] != "" {
		t.Errorf("range 0-500 ms: frames %v", f)
	}
	if !strings.Contains(dom, "Selected 0.000 s to 0.500 s") || !strings.Contains(dom, `id="sel" style="display: block;`) {
		t.Errorf("range 0-500 ms not shown as selected")
	}
	// One thread, one activity.
	dom = string(chromium(t, url+"#th=12&act=gc", "--dump-dom"))
	if f := frames(dom); f["(marking)"] != "100" || f["Job#alloc"] != "100" || f["Web#handle"] != "" || f["Job#crunch"] != "" {
		t.Errorf("thread 12, activity gc: frames %v", f)
	}
	if !strings.Contains(dom, "100 samples: gvl_wait 50.0%, gc 50.0%") {
		t.Errorf("thread 12's shares missing")
	}
	shot := filepath.Join(dir, "flamegraph-timeline.png")
	chromium(t, url+"#r=0-500", "--screenshot="+shot)
	if fi, err := os.Stat(shot); err != nil || fi.Size() < 1000 {
		t.Fatalf("screenshot %s: %v", shot, err)
	}
	t.Logf("timeline page %s, screenshot %s", page, shot)
}

// speedscopeApp returns the index.html of the speedscope app from npm.
func speedscopeApp(t *testing.T) string {
	t.Helper()
	return filepath.Join(testutil.NPMModules(t, "speedscope"), "speedscope", "dist", "release", "index.html")
}

// TestFlamegraphTimelineDrag drags the mouse across the timeline in
// headless Chromium (driven by puppeteer-core): the selected range (50 to
// 300 ms of the 1 s recording) is shown, and the flame graph then holds
// only the first half's frames, web's Web#handle and job's GVL wait.
func TestFlamegraphTimelineDrag(t *testing.T) {
	mods := testutil.NPMModules(t, "puppeteer-core")
	node, err := exec.LookPath("node")
	if err != nil {
		testutil.Missing(t, "node (Debian package nodejs)")
	}
	dir := artifactDir(t)
	page := filepath.Join(dir, "flamegraph-drag.html")
	if err := os.WriteFile(page, renderSamples(t, "flamegraph", Options{RateHz: 100}, activitySamples()), 0o644); err != nil {
		t.Fatal(err)
	}
	shot := filepath.Join(dir, "flamegraph-drag.png")
	out := testutil.RunNodeScript(t, node, mods, filepath.Join("testdata", "drag.js"), page, shot)
	var res struct {
		Frames []string
		Range  string
		Sel    string
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("drag.js printed %q: %v", out, err)
	}
	want := []string{"all=100%", "<main>=100%", "Web#handle=50%", "Job#crunch=50%", stack.FrameGVLWait + "=50%"}
	if strings.Join(res.Frames, " ") != strings.Join(want, " ") {
		t.Errorf("after the drag, frames %v, want %v", res.Frames, want)
	}
	if !regexp.MustCompile(`^Selected 0\.0[45]\d s to 0\.(29|30)\d s`).MatchString(res.Range) || res.Sel != "block" {
		t.Errorf("range shown %q (selection %s)", res.Range, res.Sel)
	}
	t.Logf("dragged: %s; screenshot %s", res.Range, shot)
}

// TestSpeedscopeInApp loads rbscope's speedscope output into the real
// speedscope app in headless Chromium, as its command-line tool does, and
// reads from the page the thread list (one profile per thread) and, in the
// sandwich view of the active profile (the thread with most samples), the
// frame names, pseudo-frames included. Each profile is in time order: the
// job thread's first stack waits for the GVL, its last runs GC.
func TestSpeedscopeInApp(t *testing.T) {
	index := speedscopeApp(t)
	samples := activitySamples()
	// Drop a few of web's samples so that job is the active profile.
	var kept []stack.Sample
	for i, s := range samples {
		if s.TID == 11 && i%20 == 0 {
			continue
		}
		kept = append(kept, s)
	}
	data := renderSamples(t, "speedscope", Options{RateHz: 100}, kept)
	var f struct {
		ActiveProfileIndex int `json:"activeProfileIndex"`
		Shared             struct {
			Frames []ssFrame `json:"frames"`
		} `json:"shared"`
		Profiles []ssProfile `json:"profiles"`
	}
	if err := json.Unmarshal(data, &f); err != nil {
		t.Fatal(err)
	}
	job := f.Profiles[f.ActiveProfileIndex]
	leaf := func(st []int) string { return f.Shared.Frames[st[len(st)-1]].Name }
	if job.Name != "12 job" || leaf(job.Samples[0]) != stack.FrameGVLWait || leaf(job.Samples[len(job.Samples)-1]) != stack.FrameMarking {
		t.Fatalf("active profile %q from %s to %s", job.Name, leaf(job.Samples[0]), leaf(job.Samples[len(job.Samples)-1]))
	}

	dir := artifactDir(t)
	b64 := base64.StdEncoding.EncodeToString(data)
	loader := filepath.Join(dir, "speedscope-load.js")
	if err := os.WriteFile(loader, []byte(`speedscope.loadFileFromBase64("rbscope.speedscope.json", "`+b64+`")`), 0o644); err != nil {
		t.Fatal(err)
	}
	url := "file://" + index + "#view=sandwich&localProfilePath=" + loader
	dom := string(chromium(t, url, "--virtual-time-budget=10000", "--dump-dom"))
	threads := regexp.MustCompile(`<div title="(\d+ \w+)" class="[^"]*"><span[^>]*>\d+:</span> <span>`).FindAllStringSubmatch(dom, -1)
	var names []string
	for _, m := range threads {
		names = append(names, m[1])
	}
	if strings.Join(names, ",") != "11 web,12 job" {
		t.Errorf("speedscope's thread list %v, want 11 web, 12 job\n%.4000s", names, dom)
	}
	for _, want := range []string{stack.FrameGVLWait, stack.FrameGC, stack.FrameMarking, "Job#crunch", "Job#alloc", "&lt;main&gt;"} {
		if !strings.Contains(dom, ">"+want+"<") {
			t.Errorf("speedscope's sandwich view of job lacks %q", want)
		}
	}
	if strings.Contains(dom, ">Web#handle<") {
		t.Errorf("web's frames in job's sandwich view")
	}
	shot := filepath.Join(dir, "speedscope.png")
	chromium(t, "file://"+index+"#localProfilePath="+loader, "--virtual-time-budget=10000", "--screenshot="+shot)
	t.Logf("speedscope screenshot %s", shot)
}

// TestSummaryActivitiesUnread: samples whose stack could not be read count
// in their thread's activity shares (by the activity read before the
// stack), and the heading says how many.
func TestSummaryActivitiesUnread(t *testing.T) {
	unread := func() []UnreadThread {
		return []UnreadThread{{Pid: 10, TID: 11, Name: "web", ByActivity: map[stack.Activity]int{stack.ActivityRunning: 100}}}
	}
	got := string(renderSamples(t, "summary", Options{RateHz: 100, Unread: unread}, activitySamples()))
	for _, want := range []string{
		"thread activity (share of each thread's samples, 100 whose stack could not be read included)",
		"     200    75.0%     0.0%    25.0%     0.0%  web (pid 10 tid 11)",
		"     100     0.0%    50.0%     0.0%    50.0%  job (pid 10 tid 12)",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("summary lacks %q:\n%s", want, got)
		}
	}
}

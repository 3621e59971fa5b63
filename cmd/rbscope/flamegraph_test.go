package main

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/rbscope/rbscope/internal/testutil"
)

// TestRecordFlamegraphFirstScreen records a real Ruby process shaped
// like a web server in miniature (testdata/ruby/deepidle.rb: one thread
// busy 160 frames deep, five idle threads blocked outside the GVL) as a
// flame graph, and opens it at 1400x1000 in headless Chromium (puppeteer-
// core, internal/output/testdata/firstscreen.js), without scrolling: the
// root and the busy thread's whole path, as many frames as Ruby's own
// caller_locations counts (drawn, or folded into a row that says how
// many it stands for), are in the first 1000 px; the idle threads' frames
// are absent and the page says their samples, 5 in 6, are hidden;
// ticking "Show idle threads" brings them back; clicking the folded row
// draws every frame. The screenshots are logged.
func TestRecordFlamegraphFirstScreen(t *testing.T) {
	testutil.NeedRoot(t)
	mods := testutil.NPMModules(t, "puppeteer-core")
	node, err := exec.LookPath("node")
	if err != nil {
		testutil.Missing(t, "node (Debian package nodejs)")
	}
	rb := testutil.SystemRuby(t)
	rb.SetProfilerEnv(t)
	proc := rb.Start(t, "deepidle.rb")
	depth := 0
	for _, l := range proc.Lines {
		if n, ok := strings.CutPrefix(l, "depth "); ok {
			depth, _ = strconv.Atoi(n)
		}
	}
	if depth < 160 {
		t.Fatalf("deepidle.rb printed %q, want its busy thread's depth (160)", proc.Lines)
	}
	dir := t.TempDir()
	page := filepath.Join(dir, "deepidle.html")
	if _, stderr, code := run(t, "record", "--pid", strconv.Itoa(proc.Pid), "--duration", "2s", "--silent", "-f", "flamegraph", "-o", page); code != 0 {
		t.Fatalf("record: exit %d: %s", code, stderr)
	}
	before, after := filepath.Join(dir, "deepidle.png"), filepath.Join(dir, "deepidle-idle.png")
	out := testutil.RunNodeScript(t, node, mods, filepath.Join(testutil.RepoRoot(t), "internal", "output", "testdata", "firstscreen.js"), page, before, after)
	type frame struct {
		Text, Cls   string
		Frames      int
		Top, Bottom float64
	}
	type state struct {
		ScrollY float64
		Frames  []frame
		IdleBox struct{ Checked, Visible bool }
		Info    string `json:"idleInfo"`
	}
	var res struct{ Before, After, Expanded state }
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("firstscreen.js printed %q: %v", out, err)
	}
	t.Logf("page %s; screenshots %s (default view), %s (idle threads shown)", page, before, after)

	const screen = 1000
	onScreen := func(f frame) bool { return f.Top >= 0 && f.Bottom <= screen }
	names := func(s state) map[string]int {
		m := map[string]int{}
		for _, f := range s.Frames {
			m[f.Text]++
		}
		return m
	}
	st := res.Before
	if st.ScrollY != 0 {
		t.Fatalf("the page opened scrolled to %v", st.ScrollY)
	}
	// The busy thread's path: block in <main>, 158 Object#deep, Object#busy.
	path := 0
	rootSeen := false
	for _, f := range st.Frames {
		switch {
		case f.Text == "all":
			rootSeen = onScreen(f)
		case strings.Contains(f.Cls, "chain"):
			if !strings.Contains(f.Text, "(Object#deep \u2026 Object#deep)") || !onScreen(f) {
				t.Errorf("folded row %+v is not Object#deep's, on screen", f)
			}
			path += f.Frames
		case f.Text == "block in <main>" || f.Text == "Object#deep" || f.Text == "Object#busy":
			if !onScreen(f) {
				t.Errorf("%+v is below the first %d px", f, screen)
			}
			path++
		}
	}
	if !rootSeen || path != depth {
		t.Errorf("root on screen %v; the busy path has %d frames on screen, want %d (Ruby's count)\nframes: %+v", rootSeen, path, depth, st.Frames)
	}
	idle := []string{"Kernel#sleep", "Thread::Queue#pop", "IO.select", "Thread::Mutex#sleep", "Thread#join"}
	for _, n := range idle {
		if names(st)[n] != 0 {
			t.Errorf("idle frame %s drawn by default", n)
		}
	}
	// Every tick samples the six threads; five are idle.
	if m := regexp.MustCompile(`^(\d+) idle samples hidden \(83\.3%`).FindStringSubmatch(st.Info); m == nil || !st.IdleBox.Visible || st.IdleBox.Checked {
		t.Errorf("idle line %q (box %+v), want 5 samples in 6 hidden", st.Info, st.IdleBox)
	}
	for _, n := range idle {
		if names(res.After)[n] != 1 {
			t.Errorf("idle frame %s not drawn once the box is ticked", n)
		}
	}
	if got := names(res.Expanded)["Object#deep"]; got != depth-2 {
		t.Errorf("%d Object#deep frames drawn once the chain is expanded, want %d", got, depth-2)
	}
}

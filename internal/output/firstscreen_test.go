package output

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/stack"
	"github.com/rbscope/rbscope/internal/testutil"
)

// pumaDepth is the depth of pumaSamples' busy stacks, as deep as the
// Rails app's of issue 33.
const pumaDepth = 160

// pumaPath returns the busy stacks' frame names, outermost first: 150
// frames of thread pool, middleware and framework calls, the action and
// its helpers, and leaf as the innermost.
func pumaPath(leaf string) []string {
	p := []string{"block in Puma::ThreadPool#spawn_thread", "Kernel#loop", "block (2 levels) in Puma::ThreadPool#spawn_thread"}
	for len(p) < 150 {
		p = append(p, fmt.Sprintf("Rack::Layer%03d#call", len(p)))
	}
	p = append(p, "Api::UsersController#index")
	for len(p) < pumaDepth-1 {
		p = append(p, fmt.Sprintf("Api::Render#step%d", len(p)))
	}
	return append(p, leaf)
}

// pumaIdle holds the stacks of the idle threads (outermost first): three
// pool workers waiting for work, the reactor, the server's accept loop,
// the connection pool's reaper and the main thread joining the server.
var pumaIdle = [][]string{
	{"block in Puma::ThreadPool#spawn_thread", "Kernel#loop", "block (2 levels) in Puma::ThreadPool#spawn_thread", "Thread::ConditionVariable#wait", "Thread::Mutex#sleep"},
	{"block in Puma::ThreadPool#spawn_thread", "Kernel#loop", "block (2 levels) in Puma::ThreadPool#spawn_thread", "Thread::ConditionVariable#wait", "Thread::Mutex#sleep"},
	{"block in Puma::ThreadPool#spawn_thread", "Kernel#loop", "block (2 levels) in Puma::ThreadPool#spawn_thread", "Thread::ConditionVariable#wait", "Thread::Mutex#sleep"},
	{"block in Puma::Reactor#run", "Puma::Reactor#select_loop", "NIO::Selector#select"},
	{"block in Puma::Server#run", "Puma::Server#handle_servers", "IO.select"},
	{"block in ActiveRecord::ConnectionAdapters::ConnectionPool::Reaper#run", "Kernel#loop", "Thread::Queue#pop"},
	{"<main>", "Puma::Launcher#run", "Puma::Single#run", "Thread#join"},
}

// pumaSamples: one second at 100 Hz of a puma-shaped process. Thread
// 11 runs a 160-frame stack, its leaf JSON's generate 7 ticks in 10 and
// String#gsub! 3; thread 12 waits for the GVL in that gsub! path; thread
// 13 hashes a password in a C function that released the GVL (blocked,
// but on a CPU: not idle); the 7 threads of pumaIdle are blocked and off
// CPU all along (700 of the 1000 samples).
func pumaSamples() []stack.Sample {
	// frames makes names a stack, its leaf of kind leaf.
	frames := func(names []string, leaf stack.Kind) []stack.Frame {
		fr := make([]stack.Frame, len(names))
		for i, n := range names {
			fr[len(names)-1-i] = stack.Frame{Name: n, Path: "/app/x.rb", Line: i + 1, Kind: stack.KindRuby}
		}
		fr[0].Kind = leaf
		return fr
	}
	generate := frames(pumaPath("JSON::Ext::Generator::State#generate"), stack.KindCFunc)
	gsub := frames(pumaPath("String#gsub!"), stack.KindCFunc)
	wait := append([]stack.Frame{{Name: stack.FrameGVLWait, Kind: stack.KindGVL}}, gsub...)
	var out []stack.Sample
	for i := 0; i < 100; i++ {
		at := t0.Add(time.Duration(i) * 10 * time.Millisecond)
		busy := stack.Sample{Time: at, Pid: 50, TID: 11, ThreadName: "puma srv tp 001", Activity: stack.ActivityRunning, GVL: true, Frames: generate}
		if i%10 >= 7 {
			busy.Frames = gsub
		}
		out = append(out, busy,
			stack.Sample{Time: at, Pid: 50, TID: 12, ThreadName: "puma srv tp 002", Activity: stack.ActivityGVLWait, Frames: wait},
			stack.Sample{Time: at, Pid: 50, TID: 13, ThreadName: "hasher", Activity: stack.ActivityBlocked, OnCPU: true,
				Frames: frames([]string{"block in Hasher#run", "BCrypt::Engine.__bc_crypt"}, stack.KindCFunc)})
		for j, names := range pumaIdle {
			out = append(out, stack.Sample{Time: at, Pid: 50, TID: 20 + j, ThreadName: "idle " + strconv.Itoa(j),
				Activity: stack.ActivityBlocked, Frames: frames(names, stack.KindCFunc)})
		}
	}
	return out
}

type fsFrame struct {
	Text, Cls                string
	Frames                   int
	Top, Bottom, Left, Width float64
}

type fsState struct {
	ScrollY float64
	Frames  []fsFrame
	IdleBox struct {
		Checked, Visible bool
		Top, Bottom      float64
	}
	IdleInfo string
}

// TestFlamegraphFirstScreen opens the flame graph of a puma-shaped
// recording (a 160-frame busy stack, a thread waiting for the GVL, one
// working in C without the GVL, 7 idle threads) at 1400x1000 in headless
// Chromium, without scrolling: the root and every frame of the busy
// leaves' paths (drawn, or folded into a row that says how many frames it
// stands for) are in the first 1000 px, the GVL wait and the C function
// too; the idle threads' frames are absent, and the page says 700 idle
// samples are hidden; ticking "Show idle threads" brings them back;
// clicking the folded row draws its frames. Screenshots are logged.
func TestFlamegraphFirstScreen(t *testing.T) {
	mods := testutil.NPMModules(t, "puppeteer-core")
	node, err := exec.LookPath("node")
	if err != nil {
		testutil.Missing(t, "node (Debian package nodejs)")
	}
	dir := artifactDir(t)
	page := filepath.Join(dir, "flamegraph-firstscreen.html")
	if err := os.WriteFile(page, renderSamples(t, "flamegraph", Options{RateHz: 100}, pumaSamples()), 0o644); err != nil {
		t.Fatal(err)
	}
	before, after := filepath.Join(dir, "flamegraph-firstscreen.png"), filepath.Join(dir, "flamegraph-firstscreen-idle.png")
	out := testutil.RunNodeScript(t, node, mods, filepath.Join("testdata", "firstscreen.js"), page, before, after)
	var res struct{ Before, After, Expanded fsState }
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("firstscreen.js printed %q: %v", out, err)
	}
	t.Logf("page %s; screenshots %s (default view), %s (idle threads shown)", page, before, after)

	const screen = 1000
	st := res.Before
	if st.ScrollY != 0 {
		t.Fatalf("the page opened scrolled to %v", st.ScrollY)
	}
	drawn := map[string]fsFrame{}
	var folds []fsFrame
	for _, f := range st.Frames {
		if strings.Contains(f.Cls, "chain") {
			folds = append(folds, f)
			continue
		}
		drawn[f.Text] = f
	}
	onScreen := func(f fsFrame) bool { return f.Top >= 0 && f.Bottom <= screen && f.Width > 0 }
	if r, ok := drawn["all"]; !ok || !onScreen(r) {
		t.Errorf("the root is not in the first %d px: %+v", screen, r)
	}
	// Every frame of the busy leaf's path is drawn on screen, or inside a
	// folded row on screen whose text names its first and last frames.
	foldRE := regexp.MustCompile(`^\x{22ef} (\d+) frames \((.*) \x{2026} (.*)\): click to expand$`)
	for _, leaf := range []string{"JSON::Ext::Generator::State#generate", "String#gsub!"} {
		path := pumaPath(leaf)
		for i := 0; i < len(path); {
			if f, ok := drawn[path[i]]; ok && onScreen(f) {
				i++
				continue
			}
			found := false
			for _, f := range folds {
				m := foldRE.FindStringSubmatch(f.Text)
				if m == nil || m[2] != path[i] {
					continue
				}
				n, _ := strconv.Atoi(m[1])
				if n != f.Frames || i+n > len(path) || m[3] != path[i+n-1] || !onScreen(f) {
					t.Errorf("folded row %+v does not stand for %s to %s on screen", f, path[i], path[i+n-1])
				}
				i += n
				found = true
				break
			}
			if !found {
				t.Fatalf("frame %d of %s's path, %s, is neither drawn nor folded in the first %d px\nframes: %+v", i, leaf, path[i], screen, st.Frames)
			}
		}
	}
	// The leaves' widths are their shares of the 300 samples shown.
	for name, want := range map[string]float64{"JSON::Ext::Generator::State#generate": 0.7 / 3, "String#gsub!": 1.3 / 3, stack.FrameGVLWait: 1.0 / 3, "BCrypt::Engine.__bc_crypt": 1.0 / 3} {
		f, ok := drawn[name]
		if !ok || !onScreen(f) || f.Width < want*drawn["all"].Width-2 || f.Width > want*drawn["all"].Width+2 {
			t.Errorf("%s: %+v, want %.0f%% of the root's width on screen", name, f, 100*want)
		}
	}
	idle := []string{"Thread::Mutex#sleep", "NIO::Selector#select", "IO.select", "Thread::Queue#pop", "Thread#join", "Puma::Reactor#select_loop"}
	for _, n := range idle {
		if _, ok := drawn[n]; ok {
			t.Errorf("idle frame %s drawn by default", n)
		}
	}
	if b := st.IdleBox; b.Checked || !b.Visible || b.Top < 0 || b.Bottom > screen {
		t.Errorf("the Show idle threads box is not visible, unticked, on screen: %+v", b)
	}
	if !strings.HasPrefix(st.IdleInfo, "700 idle samples hidden (70.0%") {
		t.Errorf("idle line %q, want 700 idle samples hidden (70.0%%)", st.IdleInfo)
	}

	// Ticked: the idle threads' frames are back, the busy path shares the
	// width with them.
	shown := map[string]fsFrame{}
	for _, f := range res.After.Frames {
		shown[f.Text] = f
	}
	for _, n := range idle {
		if _, ok := shown[n]; !ok {
			t.Errorf("idle frame %s not drawn once the box is ticked", n)
		}
	}
	if !res.After.IdleBox.Checked || res.After.IdleInfo != "(700 idle samples shown)" {
		t.Errorf("after the tick: box %+v, line %q", res.After.IdleBox, res.After.IdleInfo)
	}
	if f := shown["Thread::Mutex#sleep"]; f.Width < shown["all"].Width*0.3-2 || f.Width > shown["all"].Width*0.3+2 {
		t.Errorf("the 3 waiting pool workers' Mutex#sleep: %+v, want 30%% of the root's width", f)
	}

	// Clicking the first folded row draws its frames.
	names := map[string]bool{}
	for _, f := range res.Expanded.Frames {
		names[f.Text] = true
	}
	for _, n := range pumaPath("String#gsub!") {
		if !names[n] {
			t.Errorf("%s not drawn once the chain is expanded", n)
		}
	}
}

// TestFlamegraphWithoutActivities: a recording that predates activities
// (its samples' Activity is "", as raw files from before rbscope read
// them) has no idle samples: the page draws every thread's frames and
// keeps the "Show idle threads" box hidden.
func TestFlamegraphWithoutActivities(t *testing.T) {
	samples := pumaSamples()
	for i := range samples {
		samples[i].Activity, samples[i].OnCPU, samples[i].GVL = "", false, false
	}
	page := filepath.Join(artifactDir(t), "flamegraph-noactivity.html")
	if err := os.WriteFile(page, renderSamples(t, "flamegraph", Options{RateHz: 100}, samples), 0o644); err != nil {
		t.Fatal(err)
	}
	dom := string(chromium(t, "file://"+page, "--dump-dom"))
	for _, n := range []string{"Thread::Mutex#sleep", "IO.select", "Thread::Queue#pop", "Thread#join", "JSON::Ext::Generator::State#generate"} {
		if !strings.Contains(dom, ">"+n+"</div>") {
			t.Errorf("%s not drawn", n)
		}
	}
	if !strings.Contains(dom, `<label id="idlebox" hidden="">`) || !strings.Contains(dom, `<span id="idleinfo"></span>`) {
		t.Errorf("the idle box or line shown for a recording without activities")
	}
	if !strings.Contains(dom, "1000 samples: unknown 100.0%") {
		t.Errorf("shares line missing")
	}
}

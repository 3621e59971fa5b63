package tui

import (
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/stack"
)

func fr(name, path string) stack.Frame {
	kind := stack.KindRuby
	if path == "" {
		kind = stack.KindCFunc
	}
	return stack.Frame{Name: name, Path: path, Line: 1, Kind: kind}
}

func TestTopCounts(t *testing.T) {
	top := NewTop(100)
	leaf, mid, root := fr("A#leaf", "/app/a.rb"), fr("A#mid", "/app/a.rb"), fr("<main>", "/app/main.rb")
	each := fr("Array#each", "")
	var batch []stack.Sample
	for i := 0; i < 30; i++ {
		batch = append(batch, stack.Sample{TID: 1, ThreadName: "main", Frames: []stack.Frame{leaf, mid, root}})
	}
	for i := 0; i < 10; i++ {
		// Recursion counts once in total.
		batch = append(batch, stack.Sample{TID: 2, ThreadName: "w", Frames: []stack.Frame{each, mid, each, mid, root}})
	}
	batch = append(batch, stack.Sample{TID: 2, ThreadName: "w"}) // no frames
	top.Add(batch)
	v := top.Snapshot(SortTotalPct)
	if v.Samples != 41 || v.Interval != 41 || v.Threads != 2 {
		t.Fatalf("samples %d interval %d threads %d", v.Samples, v.Interval, v.Threads)
	}
	byName := map[string]Row{}
	for _, r := range v.Rows {
		byName[r.Function] = r
	}
	check := func(name string, own, total float64, ownT, totalT time.Duration) {
		t.Helper()
		r := byName[name]
		if d := r.OwnPct - own; d > 0.01 || d < -0.01 {
			t.Errorf("%s own %.2f%%, want %.2f%%", name, r.OwnPct, own)
		}
		if d := r.TotalPct - total; d > 0.01 || d < -0.01 {
			t.Errorf("%s total %.2f%%, want %.2f%%", name, r.TotalPct, total)
		}
		if r.OwnTime != ownT || r.TotalTime != totalT {
			t.Errorf("%s times %v %v, want %v %v", name, r.OwnTime, r.TotalTime, ownT, totalT)
		}
	}
	check("A#leaf", 100*30.0/41, 100*30.0/41, 300*time.Millisecond, 300*time.Millisecond)
	check("A#mid", 0, 100*40.0/41, 0, 400*time.Millisecond)
	check("Array#each", 100*10.0/41, 100*10.0/41, 100*time.Millisecond, 100*time.Millisecond)
	if v.Rows[0].Function != "<main>" && v.Rows[0].Function != "A#mid" {
		t.Errorf("first row by %%Total: %s", v.Rows[0].Function)
	}
	if len(v.ThreadRows) != 3+3 {
		t.Errorf("%d per-thread rows, want 6", len(v.ThreadRows))
	}
	// A new interval starts empty; cumulative times stay.
	top.Add([]stack.Sample{{TID: 1, Frames: []stack.Frame{mid, root}}})
	v = top.Snapshot(SortOwnPct)
	if v.Interval != 1 || v.Rows[0].Function != "A#mid" || v.Rows[0].OwnPct != 100 || v.Rows[0].OwnTime != 10*time.Millisecond {
		t.Errorf("second interval: %+v", v.Rows[0])
	}
	v.Resort(SortTotalTime)
	if v.Rows[0].TotalTime < v.Rows[1].TotalTime {
		t.Errorf("not sorted by total time: %+v", v.Rows[:2])
	}
}

func TestRender(t *testing.T) {
	top := NewTop(100)
	long := strings.Repeat("Very::Long::Namespace::", 10) + "meth"
	top.Add([]stack.Sample{
		{TID: 7, ThreadName: "worker", Frames: []stack.Frame{fr(long, "/x/y.rb"), fr("<main>", "/x/main.rb")}},
		{TID: 8, ThreadName: "other", Frames: []stack.Frame{fr("Kernel#sleep", ""), fr("<main>", "/x/main.rb")}},
	})
	v := top.Snapshot(SortOwnPct)
	h := Header{Pid: 42, RubyVersion: "3.1.2", Mode: "blocking", Rate: 100}
	out := Render(h, v, false, 60, 10, false)
	lines := strings.Split(out, "\r\n")
	if !strings.Contains(lines[0], "pid 42") || !strings.Contains(lines[0], "Ruby 3.1.2") {
		t.Errorf("header %q", lines[0])
	}
	for _, l := range lines {
		plain := l
		for _, esc := range []string{home, clearLine, clearBelow, reverse, bold, reset} {
			plain = strings.ReplaceAll(plain, esc, "")
		}
		if n := len([]rune(plain)); n > 60 {
			t.Errorf("line longer than the terminal (%d): %q", n, plain)
		}
	}
	if !strings.Contains(out, " 50.00%") || !strings.Contains(out, "Kernel#sleep") || !strings.Contains(out, "(main.rb)") {
		t.Errorf("rows missing:\n%s", out)
	}
	if strings.Contains(out, "worker") {
		t.Errorf("thread names in the all-threads view")
	}
	out = Render(h, v, true, 100, 10, true)
	if !strings.Contains(out, "worker") || !strings.Contains(out, "Thread") || !strings.Contains(out, "[display paused]") {
		t.Errorf("per-thread view:\n%s", out)
	}
	// Rows beyond the screen height are cut.
	out = Render(h, v, false, 100, 6, false)
	if n := strings.Count(out, "\r\n"); n != 5 {
		t.Errorf("%d lines for a 6-line terminal", n)
	}
}

// TestActivityColumns: samples with activities give the GVL-wait and GC
// columns and the activity line.
func TestActivityColumns(t *testing.T) {
	top := NewTop(100)
	root := fr("<main>", "/x/main.rb")
	wait := stack.Frame{Name: stack.FrameGVLWait, Kind: stack.KindGVL}
	gc := stack.Frame{Name: stack.FrameGC, Kind: stack.KindGC}
	top.Add([]stack.Sample{
		{TID: 1, ThreadName: "a", Activity: stack.ActivityRunning, Frames: []stack.Frame{fr("A#spin", "/x/a.rb"), root}},
		{TID: 2, ThreadName: "b", Activity: stack.ActivityGVLWait, Frames: []stack.Frame{wait, fr("A#spin", "/x/a.rb"), root}},
		{TID: 3, ThreadName: "c", Activity: stack.ActivityGC, Frames: []stack.Frame{gc, fr("B#alloc", "/x/b.rb"), root}},
		{TID: 4, ThreadName: "d", Activity: stack.ActivityBlocked, Frames: []stack.Frame{fr("Kernel#sleep", ""), root}},
	})
	v := top.Snapshot(SortTotalPct)
	var spin, main Row
	for _, r := range v.Rows {
		switch r.Function {
		case "A#spin":
			spin = r
		case "<main>":
			main = r
		}
	}
	if spin.TotalPct != 50 || spin.GVLWaitPct != 25 || spin.GCPct != 0 || main.GVLWaitPct != 25 || main.GCPct != 25 {
		t.Errorf("A#spin %+v, <main> %+v", spin, main)
	}
	if v.Activities[stack.ActivityRunning] != 25 || v.Activities[stack.ActivityBlocked] != 25 {
		t.Errorf("activities %v", v.Activities)
	}
	out := Render(Header{Pid: 1, Rate: 100}, v, true, 140, 20, false)
	for _, want := range []string{"%GVLw", "%GC", "GVL wait 25.0%", "GC 25.0%", stack.FrameGVLWait} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in\n%s", want, out)
		}
	}
}

// TestUnreadInActivities: samples whose stack could not be read count in
// the interval's activity shares (once), not in the functions'.
func TestUnreadInActivities(t *testing.T) {
	top := NewTop(100)
	root := fr("<main>", "/x/main.rb")
	top.Add([]stack.Sample{
		{TID: 1, Activity: stack.ActivityRunning, Frames: []stack.Frame{fr("A#spin", "/x/a.rb"), root}},
		{TID: 2, Activity: stack.ActivityBlocked, Frames: []stack.Frame{fr("Kernel#sleep", ""), root}},
	})
	top.SetUnread(map[stack.Activity]int{stack.ActivityRunning: 2})
	v := top.Snapshot(SortTotalPct)
	if v.Unread != 2 || v.Activities[stack.ActivityRunning] != 75 || v.Activities[stack.ActivityBlocked] != 25 {
		t.Errorf("unread %d, activities %v; want 2, running 75%%, blocked 25%%", v.Unread, v.Activities)
	}
	for _, r := range v.Rows {
		if r.Function == "<main>" && r.TotalPct != 100 {
			t.Errorf("<main> %.1f%% of the samples read, want 100", r.TotalPct)
		}
	}
	if out := Render(Header{Pid: 1, Rate: 100}, v, false, 140, 20, false); !strings.Contains(out, "(2 unread stacks included)") {
		t.Errorf("no unread count in\n%s", out)
	}
	// The same totals again: nothing new in the next interval.
	top.SetUnread(map[stack.Activity]int{stack.ActivityRunning: 2})
	top.Add([]stack.Sample{{TID: 2, Activity: stack.ActivityBlocked, Frames: []stack.Frame{fr("Kernel#sleep", ""), root}}})
	if v := top.Snapshot(SortTotalPct); v.Unread != 0 || v.Activities[stack.ActivityBlocked] != 100 {
		t.Errorf("second interval: unread %d, activities %v", v.Unread, v.Activities)
	}
}

// TestRenderLayout: the first row is on the screen's fourth line, under
// two lines of status (the mode among them) and the headings; the keys
// are on the last line, whatever the number of rows.
func TestRenderLayout(t *testing.T) {
	top := NewTop(100)
	top.Add([]stack.Sample{{TID: 7, ThreadName: "w", Frames: []stack.Frame{fr("A#work", "/x/a.rb")}}})
	v := top.Snapshot(SortOwnPct)
	out := Render(Header{Pid: 42, RubyVersion: "3.1.2", Mode: "blocking", Keep: stack.ModeCPU, Rate: 100}, v, false, 80, 12, false)
	lines := strings.Split(out, "\r\n")
	if len(lines) != 12 {
		t.Fatalf("%d lines for a 12-line terminal:\n%s", len(lines), out)
	}
	if !strings.Contains(lines[0], "mode cpu") {
		t.Errorf("status %q lacks the mode", lines[0])
	}
	if !strings.Contains(lines[3], "A#work (a.rb)") {
		t.Errorf("first row on line 4 is %q", lines[3])
	}
	if !strings.Contains(lines[11], "q quit") {
		t.Errorf("last line %q, want the keys", lines[11])
	}
}

// TestRenderTorn: the threads whose stacks changed while read get a line
// under the counts, the rows move down one, and the keys stay on the last
// line.
func TestRenderTorn(t *testing.T) {
	top := NewTop(100)
	top.Add([]stack.Sample{{TID: 7, ThreadName: "w", Frames: []stack.Frame{fr("A#work", "/x/a.rb")}}})
	top.SetTorn("w 2.0% of its 100 samples (GVL held in 90)")
	v := top.Snapshot(SortOwnPct)
	out := Render(Header{Pid: 42, RubyVersion: "3.1.2", Mode: "nonblocking", Rate: 100}, v, false, 100, 12, false)
	lines := strings.Split(out, "\r\n")
	if len(lines) != 12 {
		t.Fatalf("%d lines for a 12-line terminal:\n%s", len(lines), out)
	}
	if !strings.Contains(lines[2], "Stacks changed while read: w 2.0% of its 100 samples") {
		t.Errorf("line 3 is %q, want the torn threads", lines[2])
	}
	if !strings.Contains(lines[4], "A#work (a.rb)") {
		t.Errorf("first row on line 5 is %q", lines[4])
	}
	if !strings.Contains(lines[11], "q quit") {
		t.Errorf("last line %q, want the keys", lines[11])
	}
}

// TestRenderThreadNames: the per-thread view tells threads of one name
// apart by tid, and cuts a name too long for its column in the middle,
// marked, keeping the end where a pool numbers its threads.
func TestRenderThreadNames(t *testing.T) {
	top := NewTop(100)
	f := []stack.Frame{fr("Thread::Queue#pop", ""), fr("block in <main>", "/x/pool.rb")}
	long := "puma srv threadpool reactor worker 001"
	top.Add([]stack.Sample{
		{TID: 101, ThreadName: "worker", Frames: f},
		{TID: 102, ThreadName: "worker", Frames: f},
		{TID: 103, ThreadName: long, Frames: f},
		{TID: 104, ThreadName: "puma srv threadpool reactor worker 002", Frames: f},
	})
	v := top.Snapshot(SortOwnPct)
	out := Render(Header{Pid: 1, Rate: 100}, v, true, 90, 20, false)
	for _, want := range []string{"worker (101)", "worker (102)", "(103)", "001 (103)", "002 (104)", "puma srv"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in\n%s", want, out)
		}
	}
	if !strings.Contains(out, "…") || strings.Contains(out, long) {
		t.Errorf("a long name is not marked as cut:\n%s", out)
	}
	out = Render(Header{Pid: 1, Rate: 100}, v, true, 200, 20, false)
	if !strings.Contains(out, long+" (103)") {
		t.Errorf("a long name is cut on a wide terminal:\n%s", out)
	}
}

// TestTopMNThreads: a Ruby thread that moves between native threads (M:N)
// or has none for a while is one thread in the per-thread view, shown
// with its latest native thread.
func TestTopMNThreads(t *testing.T) {
	top := NewTop(100)
	leaf, root := fr("A#leaf", "/app/a.rb"), fr("<main>", "/app/main.rb")
	var batch []stack.Sample
	for i := 0; i < 12; i++ {
		for th := uint64(0); th < 2; th++ {
			batch = append(batch, stack.Sample{Pid: 9, ThreadID: 0x55d0c8a3b000 + th*0x400, TID: []int{7001, 0, 7002}[i%3],
				ThreadName: "sp", Frames: []stack.Frame{leaf, root}})
		}
	}
	batch = append(batch, stack.Sample{Pid: 9, ThreadID: 0x55d0c8a3c000, ThreadName: "lonely", Frames: []stack.Frame{leaf, root}})
	top.Add(batch)
	v := top.Snapshot(SortTotalPct)
	if v.Threads != 3 {
		t.Errorf("%d threads, want 3 Ruby threads", v.Threads)
	}
	var leafRows []string
	for _, r := range v.ThreadRows {
		if r.Function == "A#leaf" {
			leafRows = append(leafRows, strings.TrimSpace(threadLabel(r.Thread, r.TID, 20)))
		}
	}
	slices.Sort(leafRows)
	if got := strings.Join(leafRows, "|"); got != "lonely (no tid)|sp (7002)|sp (7002)" {
		t.Errorf("per-thread rows of A#leaf: %s, want one per Ruby thread", got)
	}
}

// TestTopStackIDs adds samples with the stack IDs a walker gives (a stack
// repeated by a thread, shared by two, changed, recursive, under several
// activities, across intervals) and the same samples without IDs: the
// views must be the same, counted from each thread's last stack or from
// the frames.
func TestTopStackIDs(t *testing.T) {
	root := fr("<main>", "/app/main.rb")
	a := []stack.Frame{fr("A#leaf", "/app/a.rb"), fr("A#mid", "/app/a.rb"), root}
	rec := []stack.Frame{fr("Array#each", ""), fr("A#mid", "/app/a.rb"), fr("Array#each", ""), fr("A#mid", "/app/a.rb"), root}
	gvl := []stack.Frame{{Name: stack.FrameGVLWait, Kind: stack.KindGVL}, fr("A#leaf", "/app/a.rb"), root}
	ida, idr, idg := stack.NewID(), stack.NewID(), stack.NewID()
	acts := []stack.Activity{stack.ActivityRunning, stack.ActivityGVLWait, stack.ActivityGC, stack.ActivityBlocked}
	var batches [][]stack.Sample
	for round := 0; round < 3; round++ {
		var b []stack.Sample
		for i := 0; i < 40; i++ {
			act := acts[(i/3+round)%len(acts)]
			switch {
			case i%7 == 0:
				b = append(b, stack.Sample{TID: 1, Activity: act, Frames: gvl, Stack: idg})
			case i%5 == 0:
				b = append(b, stack.Sample{TID: 1, Activity: act, Frames: rec, Stack: idr})
			default:
				b = append(b, stack.Sample{TID: 1, Activity: act, Frames: a, Stack: ida})
			}
			b = append(b, stack.Sample{TID: 2, Activity: act, Frames: a, Stack: ida})
			if i%9 == 0 {
				b = append(b, stack.Sample{TID: 2, Activity: act}) // no frames
			}
		}
		batches = append(batches, b)
	}
	views := func(ids bool) []View {
		top := NewTop(100)
		var out []View
		for _, b := range batches {
			b = slices.Clone(b)
			for i := range b {
				if !ids {
					b[i].Stack = 0
				}
			}
			top.Add(b)
			v := top.Snapshot(SortTotalPct)
			out = append(out, View{Rows: v.Rows, ThreadRows: v.ThreadRows, Samples: v.Samples})
		}
		return out
	}
	with, without := views(true), views(false)
	for i := range with {
		if !reflect.DeepEqual(with[i], without[i]) {
			t.Errorf("interval %d: with IDs\n%+v\nwithout\n%+v", i, with[i], without[i])
		}
	}
	if len(with[2].Rows) != 5 {
		t.Errorf("%d rows, want 5: %+v", len(with[2].Rows), with[2].Rows)
	}
}

// BenchmarkTopAdd adds ticks of 12 threads with 50-frame stacks, as from a
// walker: 8 threads wait where they are (the same stack, tick after tick)
// and 4 run, their stack changing at every tick.
func BenchmarkTopAdd(b *testing.B) {
	const threads, depth, variants = 12, 50, 64
	stacks := make([][]stack.Sample, threads)
	for th := range stacks {
		for v := range variants {
			fr := make([]stack.Frame, depth)
			for d := range fr {
				fr[d] = fr0(th, v, d)
			}
			stacks[th] = append(stacks[th], stack.Sample{TID: 100 + th, ThreadName: "worker", Frames: fr, Stack: stack.NewID()})
		}
	}
	top := NewTop(100)
	tick := make([]stack.Sample, threads)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		for th := range tick {
			v := 0
			if th < 4 {
				v = i % variants
			}
			tick[th] = stacks[th][v]
		}
		top.Add(tick)
	}
}

// fr0 is frame d of thread th's stack variant v: the 5 innermost frames
// differ between variants, the rest are the thread's own.
func fr0(th, v, d int) stack.Frame {
	if d >= 5 {
		v = 0
	}
	return stack.Frame{Name: "Module" + strconv.Itoa(d%7) + "::Klass#method_" + strconv.Itoa(d*31+v+th%3), Path: "/app/lib/m" + strconv.Itoa(d%7) + ".rb", Line: 10 + d + v, Kind: stack.KindRuby}
}

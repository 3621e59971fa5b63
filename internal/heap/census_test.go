package heap_test

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/heap"
	"github.com/rbscope/rbscope/internal/procfs"
	"github.com/rbscope/rbscope/internal/ruby"
	"github.com/rbscope/rbscope/internal/target"
	"github.com/rbscope/rbscope/internal/testutil"
)

// truth is what heap_census.rb measured in itself before it said ready.
type truth struct {
	Classes map[string]struct {
		Count   uint64 `json:"count"`
		Memsize uint64 `json:"memsize"`
	} `json:"classes"`
	Types map[string]uint64 `json:"types"`
}

func startCensusScript(t *testing.T, rb testutil.RubyUnderTest) (*testutil.Proc, truth) {
	t.Helper()
	proc := rb.Start(t, "heap_census.rb")
	var tr truth
	for _, l := range proc.Lines {
		if s, ok := strings.CutPrefix(l, "truth "); ok {
			if err := json.Unmarshal([]byte(s), &tr); err != nil {
				t.Fatalf("script's truth %q: %v", s, err)
			}
		}
	}
	if tr.Classes == nil {
		t.Fatalf("the script printed no truth: %q", proc.Lines)
	}
	return proc, tr
}

func openHeap(t *testing.T, tg target.Target, c ruby.Consistency) (*ruby.Process, *heap.Heap) {
	t.Helper()
	p, err := ruby.Open(context.Background(), ruby.Spec{Target: tg, Consistency: c})
	if err != nil {
		t.Fatalf("open Ruby: %v", err)
	}
	h, err := heap.Open(p)
	if err != nil {
		t.Fatalf("open heap: %v", err)
	}
	t.Logf("offsets: %s", h.Source())
	return p, h
}

// byClass sums a census's entries of one class (a class may have entries
// under several types: none here).
func byClass(c *heap.Census, class string) (count, bytes uint64) {
	for _, e := range c.Entries {
		if e.Class == class {
			count += e.Count
			bytes += e.Bytes
		}
	}
	return
}

// topClasses lists c's n largest entries by count, for a failure's message.
func topClasses(c *heap.Census, n int) string {
	es := slices.Clone(c.Entries)
	slices.SortFunc(es, func(a, b heap.Entry) int { return cmp.Compare(b.Count, a.Count) })
	var sb strings.Builder
	for _, e := range es[:min(n, len(es))] {
		fmt.Fprintf(&sb, "  %8d %s %s\n", e.Count, e.Type, e.Class)
	}
	return sb.String()
}

func within(got, want uint64, frac float64) bool {
	return math.Abs(float64(got)-float64(want)) <= frac*float64(want)
}

// checkCensus compares a census with the script's own measure: counts by
// class with each_object(klass) (instances of exactly that class), counts
// by type with count_objects (both within 0.5 %: the script allocates a
// little after measuring), bytes by class with memsize_of summed (10 %).
func checkCensus(t *testing.T, c *heap.Census, tr truth) {
	t.Helper()
	if c.Partial || c.Bad != 0 || c.PagesBad != 0 {
		t.Errorf("census partial=%v (%s), %d bad slots, %d bad pages", c.Partial, c.Why, c.Bad, c.PagesBad)
	}
	for _, class := range []string{"Leaky::Node", "Leaky::Wide", "String", "Array", "Hash"} {
		want := tr.Classes[class]
		n, b := byClass(c, class)
		t.Logf("%-12s count %7d (truth %7d)  bytes %10d (memsize_of %10d)", class, n, want.Count, b, want.Memsize)
		if strings.HasPrefix(class, "Leaky::") && n != want.Count {
			t.Errorf("%s: %d objects, each_object counts %d", class, n, want.Count)
		}
		if !within(n, want.Count, 0.005) {
			t.Errorf("%s: %d objects, each_object counts %d (more than 0.5%% apart)", class, n, want.Count)
		}
		if !within(b, want.Memsize, 0.10) {
			t.Errorf("%s: %d bytes, memsize_of sums to %d (more than 10%% apart)", class, b, want.Memsize)
		}
	}
	for _, typ := range []string{"T_OBJECT", "T_STRING", "T_ARRAY", "T_HASH"} {
		got, want := c.Types[typ], tr.Types[typ]
		if !within(got, want, 0.005) {
			t.Errorf("%s: %d slots, count_objects says %d", typ, got, want)
		}
	}
	if !within(c.Slots, tr.Types["TOTAL"], 0.005) {
		t.Errorf("%d slots, count_objects says TOTAL %d", c.Slots, tr.Types["TOTAL"])
	}
}

// TestCensusMatchesObjectSpace censuses known populations, paused and
// running, on every Ruby under test.
func TestCensusMatchesObjectSpace(t *testing.T) {
	testutil.NeedRoot(t)
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		rb.SetProfilerEnv(t)
		proc, tr := startCensusScript(t, rb)
		tg, err := target.OpenLive(proc.Pid)
		if err != nil {
			t.Fatal(err)
		}
		defer tg.Close()
		_, h := openHeap(t, tg, ruby.Running)

		c, err := h.Census(context.Background(), heap.Options{Stop: true})
		if err != nil {
			t.Fatalf("census: %v", err)
		}
		if !c.Stopped || c.Pause <= 0 || c.Changed != 0 {
			t.Errorf("stopped census: stopped=%v pause=%v changed=%d", c.Stopped, c.Pause, c.Changed)
		}
		t.Logf("paused %v, %d slots, %d bytes read", c.Pause, c.Slots, c.BytesRead)
		checkCensus(t, c, tr)
		if st := procState(t, proc.Pid); st == 't' || st == 'T' {
			t.Errorf("process left stopped (state %c)", st)
		}

		// Running: the script sleeps, so nothing changes and the census
		// must agree as well.
		c, err = h.Census(context.Background(), heap.Options{})
		if err != nil {
			t.Fatalf("running census: %v", err)
		}
		if c.Stopped || c.Pause != 0 {
			t.Errorf("running census says stopped=%v pause=%v", c.Stopped, c.Pause)
		}
		checkCensus(t, c, tr)
	})
}

// leakLog is heap_leak.rb's log: at each time, how many nodes it held.
type leakLog struct {
	t    *testing.T
	path string
}

func startLeak(t *testing.T, rb testutil.RubyUnderTest, rate int) (*testutil.Proc, leakLog) {
	t.Helper()
	l := leakLog{t, filepath.Join(t.TempDir(), "leak.log")}
	return rb.Start(t, "heap_leak.rb", strconv.Itoa(rate), l.path), l
}

// bounds returns how many nodes the script held at least at from (its
// last entry before) and at most at until (its first entry after),
// waiting for that entry.
func (l leakLog) bounds(from, until time.Time) (lo, hi uint64) {
	l.t.Helper()
	for wait := 0; ; wait++ {
		b, err := os.ReadFile(l.path)
		if err != nil {
			l.t.Fatal(err)
		}
		var haveHi bool
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			var ns int64
			var n uint64
			if _, err := fmt.Sscan(line, &ns, &n); err != nil {
				continue
			}
			if ns <= from.UnixNano() {
				lo = n
			}
			if ns >= until.UnixNano() && !haveHi {
				hi, haveHi = n, true
			}
		}
		if haveHi {
			return lo, hi
		}
		if wait > 500 {
			l.t.Fatalf("the script logged nothing after %v", until)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestGrowth: the script leaks 1,000 Leaky::Node a second; between two
// paused censuses 10 s apart, Leaky::Node must be the top grower, by as
// many as the script's log says it made between them.
func TestGrowth(t *testing.T) {
	testutil.NeedRoot(t)
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		rb.SetProfilerEnv(t)
		proc, log := startLeak(t, rb, 1000)
		tg, err := target.OpenLive(proc.Pid)
		if err != nil {
			t.Fatal(err)
		}
		defer tg.Close()
		_, h := openHeap(t, tg, ruby.Running)
		first, err := h.Census(context.Background(), heap.Options{Stop: true})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Second)
		last, err := h.Census(context.Background(), heap.Options{Stop: true})
		if err != nil {
			t.Fatal(err)
		}
		// Paused, the process holds during the census what it held when
		// the census began (give or take the pause's own start).
		lo1, hi1 := log.bounds(first.Time, first.Time.Add(first.Duration))
		lo2, hi2 := log.bounds(last.Time, last.Time.Add(last.Duration))
		gs := heap.Grow(first, last)
		t.Logf("top growers over %v: %+v; the script held %d-%d then %d-%d", last.Time.Sub(first.Time), gs[:min(3, len(gs))], lo1, hi1, lo2, hi2)
		if len(gs) == 0 || gs[0].Class != "Leaky::Node" {
			t.Fatalf("top grower is not Leaky::Node: %+v", gs[:min(3, len(gs))])
		}
		n1, _ := byClass(first, "Leaky::Node")
		n2, _ := byClass(last, "Leaky::Node")
		if n1 < lo1 || n1 > hi1 || n2 < lo2 || n2 > hi2 {
			t.Errorf("Leaky::Node %d then %d; the script held %d-%d then %d-%d", n1, n2, lo1, hi1, lo2, hi2)
		}
		if want := float64(lo2+hi2-lo1-hi1) / 2; math.Abs(float64(gs[0].Count)-want) > 0.1*want {
			t.Errorf("Leaky::Node grew by %d, the script made %.0f", gs[0].Count, want)
		}
	})
}

// TestRunningCensusNeverMakesUp censuses a process that allocates 100,000
// Leaky::Node a second while it runs: every node counted existed (no more
// than the script held by the census's end), and every node it held when
// the census began is counted unless its slot changed while read.
func TestRunningCensusNeverMakesUp(t *testing.T) {
	testutil.NeedRoot(t)
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		rb.SetProfilerEnv(t)
		proc, log := startLeak(t, rb, 100000)
		tg, err := target.OpenLive(proc.Pid)
		if err != nil {
			t.Fatal(err)
		}
		defer tg.Close()
		_, h := openHeap(t, tg, ruby.Running)
		time.Sleep(500 * time.Millisecond)
		for i := 0; i < 3; i++ {
			c, err := h.Census(context.Background(), heap.Options{})
			if err != nil {
				t.Fatal(err)
			}
			n, _ := byClass(c, "Leaky::Node")
			lo, hi := log.bounds(c.Time, c.Time.Add(c.Duration))
			t.Logf("census %d: %d Leaky::Node, the script held %d to %d; %d slots changed, %d pages changed, %d bad",
				i, n, lo, hi, c.Changed, c.PagesChanged, c.Bad)
			if n > hi {
				t.Errorf("%d Leaky::Node counted, more than the %d the script held by the census's end", n, hi)
			}
			if n+c.Changed < lo {
				t.Errorf("%d Leaky::Node counted + %d changed slots, fewer than the %d held when the census began; first changed page: %q; top classes:\n%s",
					n, c.Changed, lo, c.PageChange, topClasses(c, 8))
			}
		}
	})
}

// procState is the kernel state of pid's main thread ('t' when stopped by
// a tracer).
func procState(t *testing.T, pid int) byte {
	t.Helper()
	return procfs.TaskState(pid, pid)
}

// TestEmptyPoolPages: Ruby 3.4's GC keeps swept pages with no live object
// in a global empty pool, still in the sorted page list with no slots.
// The script stops allocating at a moment it holds some, and prints
// GC.stat's count of them, of all pages and of available slots: a paused
// census and a running one must find exactly those, every other page
// good. Rubies before 3.4 have no such pool.
func TestEmptyPoolPages(t *testing.T) {
	testutil.NeedRoot(t)
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		var major, minor int
		if _, err := fmt.Sscanf(rb.Version, "%d.%d", &major, &minor); err != nil {
			t.Fatalf("Ruby version %q: %v", rb.Version, err)
		}
		if major < 3 || major == 3 && minor < 4 {
			t.Skipf("Ruby %s has no global empty pool (3.4's default GC made it): nothing to check", rb.Version)
		}
		rb.SetProfilerEnv(t)
		proc := rb.Start(t, "heap_empty_pool.rb")
		var empty, pages, slots uint64
		for _, l := range proc.Lines {
			if _, err := fmt.Sscanf(l, "pool %d %d %d", &empty, &pages, &slots); err == nil {
				break
			}
		}
		tg, err := target.OpenLive(proc.Pid)
		if err != nil {
			t.Fatal(err)
		}
		defer tg.Close()
		_, h := openHeap(t, tg, ruby.Running)
		if empty == 0 {
			t.Fatalf("the script found no moment with empty-pool pages: %q", proc.Lines)
		}
		for _, stop := range []bool{true, false} {
			c, err := h.Census(context.Background(), heap.Options{Stop: stop})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("stop=%v: %d pages, %d empty, %d slots; GC.stat: %d pages, %d empty, %d available slots", stop, c.Pages, c.PagesEmpty, c.Slots, pages, empty, slots)
			if uint64(c.Pages) != pages || uint64(c.PagesEmpty) != empty || c.Slots != slots {
				t.Errorf("stop=%v: census has %d pages (%d empty) and %d slots, GC.stat %d pages (%d empty) and %d available slots", stop, c.Pages, c.PagesEmpty, c.Slots, pages, empty, slots)
			}
			if c.Partial || c.PagesBad != 0 || c.PagesChanged != 0 || c.Bad != 0 || c.Changed != 0 {
				t.Errorf("stop=%v: partial=%v (%s), %d bad pages, %d changed pages, %d bad slots, %d changed slots", stop, c.Partial, c.Why, c.PagesBad, c.PagesChanged, c.Bad, c.Changed)
			}
		}
	})
}

package ruby

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rbscope/rbscope/internal/layout"
	"github.com/rbscope/rbscope/internal/target"
	"github.com/rbscope/rbscope/internal/testutil"
)

// previousSeries returns the newest built-in table of the minor series
// before version's (3.3.x for 3.4.5): the neighbour a process of a
// release the tables lack could wrongly be read with.
func previousSeries(t *testing.T, version string) *layout.Layout {
	t.Helper()
	var prev string
	for _, n := range layout.BuiltinVersions() {
		base := strings.SplitN(n, "-", 2)[0]
		if layout.CompareVersions(base, version) < 0 && majorMinor(base) != majorMinor(version) {
			prev = n
		}
	}
	if prev == "" {
		t.Fatalf("no built-in table before Ruby %s", version)
	}
	l, err := layout.BuiltinRelease(prev)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func majorMinor(v string) string {
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return v
	}
	return parts[0] + "." + parts[1]
}

// TestLayoutCandidatesLive: a live process given its neighbouring series'
// table first and its own second takes its own (or a neighbour that reads
// it right: its stacks are checked against Ruby's caller_locations), and
// given the neighbour alone is refused with ErrNoLayout, never read with
// it. Its own table is the built-in one of its release: Rubies the tables
// lack are what the check is for, so every Ruby under test stands in.
func TestLayoutCandidatesLive(t *testing.T) {
	testutil.NeedRoot(t)
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		rb.SetProfilerEnv(t)
		own, err := layout.BuiltinRelease(rb.Version)
		if err != nil {
			t.Fatalf("no built-in table for Ruby %s: %v", rb.Version, err)
		}
		wrong := previousSeries(t, rb.Version)
		proc := rb.Start(t, "stacks.rb", "nested")
		want := reports(t, proc)
		tg, err := target.OpenLive(proc.Pid)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tg.Close() })

		// The previous series' table: refused, or, where the walker's
		// structs did not change between the series (3.3 to 3.4), taken
		// and reading Ruby's own stacks.
		if p, err := Open(context.Background(), Spec{Target: tg, Consistency: Running, Options: Options{Version: rb.Version, LayoutCandidates: []*layout.Layout{wrong}}}); err == nil {
			t.Logf("Ruby %s's table reads Ruby %s: %s", wrong.RubyVersion, rb.Version, p.Info().LayoutSource)
			checkMainStacks(t, p, want)
		} else if !errors.Is(err, ErrNoLayout) {
			t.Errorf("with Ruby %s's table alone: %v, want ErrNoLayout", wrong.RubyVersion, err)
		} else {
			t.Logf("refused: %v", err)
		}

		// Its own table with the execution context's fields moved by 8
		// bytes, as a patch release that inserts a field moves them
		// (4.0.6 did so to rb_vm_t): always refused.
		shifted := shiftStruct(t, own, "rb_execution_context_struct", 8)
		_, err = Open(context.Background(), Spec{Target: tg, Consistency: Running, Options: Options{Version: rb.Version, LayoutCandidates: []*layout.Layout{shifted}}})
		if !errors.Is(err, ErrNoLayout) {
			t.Fatalf("with a table whose execution context moved 8 bytes: %v, want ErrNoLayout", err)
		}
		t.Logf("refused: %v", err)

		p, err := Open(context.Background(), Spec{Target: tg, Consistency: Running, Options: Options{Version: rb.Version, LayoutCandidates: []*layout.Layout{shifted, own}}})
		if err != nil {
			t.Fatalf("open with candidates shifted %s, %s: %v", own.RubyVersion, own.RubyVersion, err)
		}
		src := p.Info().LayoutSource
		t.Logf("chosen: %s", src)
		if !strings.HasPrefix(src, "builtin:"+rb.Version+" (checked on the process)") {
			t.Errorf("layout source %q, want Ruby %s's own table, checked", src, rb.Version)
		}
		checkMainStacks(t, p, want)

		// A patch release the tables lack (as 4.0.7 is): its series'
		// tables are tried, newest first, and one that reads it right is
		// taken and named.
		mm := majorMinor(rb.Version)
		p, err = Open(context.Background(), Spec{Target: tg, Consistency: Running, Options: Options{Version: mm + ".99", NoDWARF: true}})
		if err != nil {
			t.Fatalf("open as Ruby %s.99: %v", mm, err)
		}
		src = p.Info().LayoutSource
		t.Logf("as %s.99: %s", mm, src)
		if !strings.HasPrefix(src, "builtin:"+mm+".") || !strings.Contains(src, "checked on the process; the tables lack Ruby "+mm+".99") {
			t.Errorf("layout source %q, want a %s table checked on the process", src, mm)
		}
		checkMainStacks(t, p, want)
	})
}

// checkMainStacks checks stacks.rb's sleeping threads against Ruby's report.
func checkMainStacks(t *testing.T, p *Process, want map[string]rubyReport) {
	t.Helper()
	ths, err := p.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	for _, th := range ths {
		if !th.Main {
			checkAgainstRuby(t, th, want["main"])
		}
	}
}

// shiftStruct returns a copy of l with every field of struct name moved by
// delta bytes.
func shiftStruct(t *testing.T, l *layout.Layout, name string, delta uint64) *layout.Layout {
	t.Helper()
	st, ok := l.Structs[name]
	if !ok {
		t.Fatalf("layout %s has no %s", l.Source, name)
	}
	out := *l
	out.Structs = map[string]layout.Struct{}
	for k, v := range l.Structs {
		out.Structs[k] = v
	}
	moved := st
	moved.Fields = map[string]layout.Field{}
	for k, f := range st.Fields {
		f.Offset += delta
		moved.Fields[k] = f
	}
	out.Structs[name] = moved
	out.Source = "shifted " + l.Source
	return &out
}

// TestLayoutCandidatesCore: the 3.3.0 core, read with its series' table
// among wrong neighbours in every order (FuzzLayoutCandidateOrder draws
// more), gives rbspy's expected stack or is refused; never another stack.
func TestLayoutCandidatesCore(t *testing.T) {
	tg, want := openCandidateCore(t)
	for _, order := range [][]int{{0, 1, 2, 3}, {3, 2, 1, 0}, {1, 3, 0, 2}, {2, 0, 3, 1}} {
		checkCandidateOrder(t, tg, want, order)
	}
}

// FuzzLayoutCandidateOrder draws orders of the candidates for the 3.3.0
// core: whatever the order, the stack read is rbspy's expected one.
func FuzzLayoutCandidateOrder(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3})
	f.Add([]byte{3, 3, 3})
	f.Add([]byte{2})
	f.Fuzz(func(t *testing.T, order []byte) {
		if len(order) > 8 {
			order = order[:8]
		}
		tg, want := openCandidateCore(t)
		idx := make([]int, len(order))
		for i, b := range order {
			idx[i] = int(b) % len(candidateCoreTables)
		}
		checkCandidateOrder(t, tg, want, idx)
	})
}

// candidateCoreTables: the 3.3.0 core's own series first, then
// neighbours of other series.
var candidateCoreTables = []string{"3.3.0", "3.2.3", "3.4.5", "3.1.2"}

var candidateCore struct {
	path string
	tg   target.Target
	want []string
}

func openCandidateCore(t testing.TB) (target.Target, []string) {
	t.Helper()
	if candidateCore.tg != nil {
		return candidateCore.tg, candidateCore.want
	}
	dir := filepath.Join(testutil.SharedDir(t), "testdata", "coredumps")
	data, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m manifest
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	for _, d := range m.Dumps {
		if d.Version != "3.3.0" {
			continue
		}
		tmp, err := os.MkdirTemp("", "rbscope-candidates")
		if err != nil {
			t.Fatal(err)
		}
		core := gunzip(t, filepath.Join(dir, d.File), tmp)
		tg, err := target.OpenCore(core, target.CoreOptions{})
		if err != nil {
			t.Fatalf("open core: %v", err)
		}
		os.RemoveAll(tmp) // the open core keeps its file
		var want []string
		for _, e := range d.Expected {
			want = append(want, unqualify(strings.TrimSuffix(e.Name, " [c function]")))
		}
		candidateCore.tg, candidateCore.want = tg, want
		return tg, want
	}
	t.Fatal("the shared manifest has no 3.3.0 dump")
	return nil, nil
}

func checkCandidateOrder(t *testing.T, tg target.Target, want []string, order []int) {
	t.Helper()
	var cands []*layout.Layout
	hasOwn := false
	for _, i := range order {
		l, err := layout.BuiltinRelease(candidateCoreTables[i])
		if err != nil {
			t.Fatal(err)
		}
		cands = append(cands, l)
		hasOwn = hasOwn || i == 0
	}
	p, err := Open(context.Background(), Spec{Target: tg, Consistency: Stopped, Options: Options{Version: "3.3.0", LayoutCandidates: cands}})
	if err != nil {
		if hasOwn || !errors.Is(err, ErrNoLayout) {
			t.Fatalf("order %v: %v", order, err)
		}
		return
	}
	ths, err := p.Snapshot()
	if err != nil || len(ths) != 1 {
		t.Fatalf("order %v (%s): %d threads, %v", order, p.Info().LayoutSource, len(ths), err)
	}
	var got []string
	for _, f := range ths[0].Frames {
		got = append(got, unqualify(f.Name))
	}
	if len(got) > len(want) {
		got = got[:len(want)] // rbspy's manifest stops before <main>
	}
	if strings.Join(got, ";") != strings.Join(want, ";") {
		t.Fatalf("order %v (%s): stack %v, want %v", order, p.Info().LayoutSource, got, want)
	}
}

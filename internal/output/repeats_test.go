package output

import (
	"bytes"
	"slices"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/stack"
)

// repeatSamples is a sequence in which threads repeat their stacks, share
// them, change them, get renamed and change activity, with the stack IDs a
// walker gives: one per stack made, 0 for a stack derived from another
// (a sub-slice) and for a slice the caller reuses for different stacks,
// and the same frames made twice under two IDs.
func repeatSamples() []stack.Sample {
	f := func(name, path string, line int) stack.Frame {
		return stack.Frame{Name: name, Path: path, Line: line, Kind: stack.KindRuby}
	}
	a := []stack.Frame{f("Object#leaf", "/a.rb", 3), f("Object#rec", "/a.rb", 9), f("Object#rec", "/a.rb", 9), f("<main>", "/a.rb", 20)}
	b := []stack.Frame{f("Object#other", "/b.rb", 5), f("Object#rec", "/a.rb", 10), f("<main>", "/a.rb", 20)}
	c := []stack.Frame{{Name: "Kernel#sleep", Kind: stack.KindCFunc}, f("Object#wait", "/c.rb", 2)}
	reused := make([]stack.Frame, len(b))
	t0 := time.Unix(1700000000, 0)
	var out []stack.Sample
	add := func(tid int, name string, act stack.Activity, fr []stack.Frame, id stack.ID) {
		out = append(out, stack.Sample{Time: t0.Add(time.Duration(len(out)) * time.Millisecond), Pid: 7, TID: tid,
			ThreadName: name, Activity: act, OnCPU: act == "running", Frames: fr, Stack: id})
	}
	ida, idb, idc := stack.NewID(), stack.NewID(), stack.NewID()
	add(1, "main", "running", a, ida)
	add(1, "main", "running", a, ida)
	add(2, "w", "running", a, ida)
	add(1, "main", "gvl_wait", a, ida)
	add(2, "w", "running", b, idb)
	add(1, "main", "running", b, idb)
	add(2, "w2", "running", b, idb)
	add(3, "sleeper", "blocked", c, idc)
	add(3, "sleeper", "blocked", c, idc)
	add(1, "main", "running", a[1:], 0)
	add(1, "main", "running", a, ida)
	add(1, "main", "running", slices.Clone(a), stack.NewID())
	copy(reused, b)
	add(4, "r", "running", reused, 0)
	add(4, "r", "running", reused, 0)
	// More threads than a format keeps stacks for (thread churn), each
	// sampled twice, then an early thread again.
	for tid := 100; tid < 100+maxRepeats+50; tid++ {
		fr := []stack.Frame{f("Object#job", "/e.rb", tid%5), f("<main>", "/e.rb", 1)}
		id := stack.NewID()
		add(tid, "job", "running", fr, id)
		add(tid, "job", "running", fr, id)
	}
	add(100, "job", "running", []stack.Frame{f("Object#job", "/e.rb", 0), f("<main>", "/e.rb", 1)}, stack.NewID())
	return out
}

// TestRepeatsTransparent renders the same samples with and without the
// per-thread stack reuse: every format must come out byte for byte the
// same. The reused slice is rewritten between its samples, into another
// stack, after the writer saw it.
func TestRepeatsTransparent(t *testing.T) {
	render := func(format string, off bool) []byte {
		w, err := New(format, Options{RateHz: 1000, noRepeats: off})
		if err != nil {
			t.Fatal(err)
		}
		rewritten := false
		for _, s := range repeatSamples() {
			w.Add(s)
			if s.TID == 4 && !rewritten {
				rewritten = true
				// The caller reuses its slice for another stack.
				copy(s.Frames, []stack.Frame{{Name: "Object#new_top", Path: "/d.rb", Line: 1, Kind: stack.KindRuby},
					{Name: "Object#mid", Path: "/d.rb", Line: 2, Kind: stack.KindRuby}, {Name: "<main>", Path: "/d.rb", Line: 3, Kind: stack.KindRuby}})
			}
		}
		var buf bytes.Buffer
		if _, err := w.WriteTo(&buf); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}
	for _, format := range Formats() {
		with, without := render(format, false), render(format, true)
		if !bytes.Equal(with, without) {
			t.Errorf("%s: output differs with stacks reused (%d bytes) and without (%d bytes)", format, len(with), len(without))
		}
		if format == "collapsed" && !bytes.Contains(with, []byte("Object#new_top")) {
			t.Errorf("collapsed: the rewritten slice's stack is missing:\n%s", with)
		}
	}
}

// BenchmarkAddRepeated is BenchmarkAdd where, as in a loop or a wait, each
// of 4 threads keeps its stack for 8 samples in a row before it changes.
func BenchmarkAddRepeated(b *testing.B) {
	benchAdd(b, func(i int) int { return i/32*4 + i%4 }) // thread i%4; its stack changes every 8 of its samples
}

package alloc

import (
	"fmt"
	"math/bits"
	"strings"
	"time"
)

// Intervals cuts a run's cumulative reports into the allocations of
// successive intervals, one pushed profile each (rbscope alloc --upload).
// Summed over the intervals, every class's count and bytes are the last
// report's: exactly so when counts only grow (--exact, or any run whose
// scale did not fall); an estimate whose scale fell since the last cut
// pushes nothing for that class rather than a negative count, and the
// excess is taken back from its later growth.
type Intervals struct {
	classes map[string]ClassCount // pushed so far, by class
	sites   map[siteKey]SiteCount // pushed so far, by site
	stacks  map[string]uint64     // stack samples seen at the last cut, by stack
	last    time.Duration         // report duration at the last cut
}

type siteKey struct {
	class, path string
	line        int
}

// NewIntervals starts cutting a run's reports.
func NewIntervals() *Intervals {
	return &Intervals{classes: map[string]ClassCount{}, sites: map[siteKey]SiteCount{}, stacks: map[string]uint64{}}
}

// Next returns the allocations of r (a cumulative report) not given by an
// earlier call: ByClass and BySite their growth, Stacks the class growth
// spread over the stacks sampled in the interval (over all the class's
// stacks when the interval sampled none), Duration the interval's length.
func (iv *Intervals) Next(r *Report) *Report {
	d := *r
	d.Duration = r.Duration - iv.last
	iv.last = r.Duration
	d.ByClass, d.BySite, d.Stacks = nil, nil, nil
	for _, c := range r.ByClass {
		p := iv.classes[c.Class]
		g := ClassCount{Class: c.Class, Count: grow(c.Count, p.Count), Bytes: grow(c.Bytes, p.Bytes)}
		p.Count += g.Count
		p.Bytes += g.Bytes
		iv.classes[c.Class] = p
		if g.Count > 0 || g.Bytes > 0 {
			d.ByClass = append(d.ByClass, g)
		}
	}
	for _, s := range r.BySite {
		k := siteKey{s.Class, s.Path, s.Line}
		p := iv.sites[k]
		g := SiteCount{Class: s.Class, Path: s.Path, Line: s.Line, Count: grow(s.Count, p.Count), Bytes: grow(s.Bytes, p.Bytes)}
		p.Count += g.Count
		p.Bytes += g.Bytes
		iv.sites[k] = p
		if g.Count > 0 || g.Bytes > 0 {
			d.BySite = append(d.BySite, g)
		}
	}
	byClass := map[string][]StackCount{}
	newSamples := map[string]uint64{}
	for _, s := range r.Stacks {
		k := stackKey(s)
		n := s.Samples - min(s.Samples, iv.stacks[k])
		iv.stacks[k] = s.Samples
		s.Samples = n
		byClass[s.Class] = append(byClass[s.Class], s)
		newSamples[s.Class] += n
	}
	for _, c := range d.ByClass {
		list := byClass[c.Class]
		if len(list) == 0 {
			continue
		}
		weight := func(s StackCount) uint64 { return s.Samples }
		if newSamples[c.Class] == 0 {
			// None sampled in the interval: spread over all of them.
			weight = func(s StackCount) uint64 { return s.Count + 1 }
		}
		d.Stacks = append(d.Stacks, spread(c, list, weight)...)
	}
	sortReport(&d)
	sortStacks(d.Stacks)
	return &d
}

// grow is how much cur exceeds what was pushed (0 if it does not).
func grow(cur, pushed uint64) uint64 {
	if cur > pushed {
		return cur - pushed
	}
	return 0
}

// spread divides c's count and bytes over list in proportion to weight
// (the remainders going to the first stacks), dropping stacks given none.
func spread(c ClassCount, list []StackCount, weight func(StackCount) uint64) []StackCount {
	ws := make([]uint64, len(list))
	var w uint64
	for i, s := range list {
		ws[i] = weight(s)
		w += ws[i]
	}
	if w == 0 {
		return nil
	}
	out := make([]StackCount, len(list))
	var given, givenBytes uint64
	for i, s := range list {
		s.Count = mulDiv(c.Count, ws[i], w)
		s.Bytes = mulDiv(c.Bytes, ws[i], w)
		given += s.Count
		givenBytes += s.Bytes
		out[i] = s
	}
	for i := 0; given < c.Count; i = (i + 1) % len(out) {
		if ws[i] > 0 {
			out[i].Count++
			given++
		}
	}
	for i := range out {
		if ws[i] > 0 {
			out[i].Bytes += c.Bytes - givenBytes
			break
		}
	}
	kept := out[:0]
	for _, s := range out {
		if s.Count > 0 || s.Bytes > 0 {
			kept = append(kept, s)
		}
	}
	return kept
}

// mulDiv is a*b/c without overflow (b <= c).
func mulDiv(a, b, c uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	q, _ := bits.Div64(hi, lo, c)
	return q
}

// stackKey identifies a stack of a class across reports.
func stackKey(s StackCount) string {
	var b strings.Builder
	b.WriteString(s.Class)
	for _, f := range s.Frames {
		fmt.Fprintf(&b, "\x00%s\x01%s\x01%d", f.Name, f.Path, f.Line)
	}
	return b.String()
}

// Total is the number of allocations in r (the sum over classes).
func (r *Report) Total() uint64 {
	var n uint64
	for _, c := range r.ByClass {
		n += c.Count
	}
	return n
}

package alloc

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/google/pprof/profile"

	"github.com/rbscope/rbscope/internal/stack"
)

// jsonReport is the machine contract of `rbscope alloc --format json`.
type jsonReport struct {
	Pid       int     `json:"pid"`
	DurationS float64 `json:"duration_s"`
	Estimated bool    `json:"estimated"`
	// Scaling, RubyAllocated, Attached and CounterSource: see Report.
	Scaling       string       `json:"scaling"`
	Scale         float64      `json:"scale"`
	RubyAllocated uint64       `json:"ruby_allocated,omitempty"`
	Attached      float64      `json:"attached_fraction"`
	CounterSource string       `json:"counter_source,omitempty"`
	CounterEnd    string       `json:"counter_end,omitempty"`
	LooseWindows  int          `json:"loose_windows,omitempty"`
	ByClass       []ClassCount `json:"by_class"`
	BySite        []SiteCount  `json:"by_site"`
	TopStacks     []StackCount `json:"top_stacks,omitempty"`
	// Retained mode: how the view was made, and the sites with bytes.
	Retained      *RetainedInfo  `json:"retained,omitempty"`
	RetainedSites []retainedSite `json:"retained_by_site,omitempty"`
}

// retainedSite is a site of the retained view in JSON, with its bytes.
type retainedSite struct {
	Class string `json:"class"`
	Path  string `json:"path"`
	Line  int    `json:"line"`
	Count uint64 `json:"count"`
	Bytes uint64 `json:"bytes"`
}

// WriteJSON writes r as
// {"pid", "duration_s", "estimated", "scaling", "scale",
// "ruby_allocated" (when known), "attached_fraction", "counter_source"
// (when not exact), "counter_end" (how Ruby's counter was last read:
// "live", "stop", "exit" or "last read", see Report.CounterEnd),
// "loose_windows" (when any: windows valued at the others' growth per
// event, see Report.LooseWindows), "by_class": [{"class", "count", "bytes"}],
// "by_site": [{"class", "path", "line", "count"}], "top_stacks" (when
// stacks were sampled): [{"class", "count", "bytes", "frames": [{"name",
// "path", "line", "kind"}], "samples"}]}, the lists sorted by count,
// descending. top > 0 keeps the first top entries of each list.
// "scaling" is "exact", "counter" or "time" (see Report.Scaling).
func (r *Report) WriteJSON(w io.Writer, top int) error {
	j := jsonReport{
		Pid:       r.Pid,
		DurationS: float64(r.Duration.Round(time.Millisecond)) / float64(time.Second),
		Estimated: r.Estimated,
		Scaling:   r.Scaling, Scale: r.Scale, RubyAllocated: r.RubyAllocated,
		Attached: r.Attached, CounterSource: r.CounterSource, CounterEnd: r.CounterEnd,
		LooseWindows: r.LooseWindows,
		ByClass:      limit(r.ByClass, top),
		TopStacks:    limit(r.Stacks, topStacks(top)),
		BySite:       limit(r.BySite, top),
	}
	if j.ByClass == nil {
		j.ByClass = []ClassCount{}
	}
	if r.Retained {
		j.Retained = r.RetainedInfo
		for _, s := range limit(r.BySite, top) {
			j.RetainedSites = append(j.RetainedSites, retainedSite{s.Class, s.Path, s.Line, s.Count, s.Bytes})
		}
	}
	if j.BySite == nil {
		j.BySite = []SiteCount{}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(j); err != nil {
		return fmt.Errorf("write JSON: %w", err)
	}
	return nil
}

// counterEndText says, for the text header, how the counter was last
// read when that changes what the totals cover.
func counterEndText(how string) string {
	switch how {
	case counterEndExit:
		return ", read at the process's exit"
	case counterEndLost:
		return "; the process ended without Ruby's teardown: what it allocated after the last read is missing"
	}
	return ""
}

// topStacks is how many stacks the text and JSON views show.
func topStacks(top int) int {
	if top > 0 && top < 10 {
		return top
	}
	return 10
}

func limit[T any](s []T, top int) []T {
	if top > 0 && len(s) > top {
		return s[:top]
	}
	return s
}

// WriteText writes r for people. by "line" (the default) prints memprof
// style "count file:line:Class" lines; by "class" prints count, bytes and
// class. A "#" header says what was measured.
func (r *Report) WriteText(w io.Writer, by string, top int) error {
	if r.Retained {
		return r.writeRetainedText(w, by, top)
	}
	var b strings.Builder
	var total uint64
	for _, c := range r.ByClass {
		total += c.Count
	}
	est := ""
	if r.Estimated {
		est = fmt.Sprintf(" (estimated: counts scaled by %.3g)", r.Scale)
	}
	fmt.Fprintf(&b, "# rbscope alloc: pid %d, %.1fs, %d allocations%s\n", r.Pid, r.Duration.Seconds(), total, est)
	switch r.Scaling {
	case "counter":
		fmt.Fprintf(&b, "# counted %.1f%% of the time, scaled by Ruby's own allocation counter (%d objects allocated in all%s)\n", 100*r.Attached, r.RubyAllocated, counterEndText(r.CounterEnd))
	case "time":
		fmt.Fprintf(&b, "# counted %.1f%% of the time, scaled by time: biased low if the program is allocation-bound (%s)\n", 100*r.Attached, r.CounterSource)
	}
	if r.Mode == "symbols" {
		b.WriteString("# this Ruby has no USDT probes: classes only, no file:line\n")
	}
	if r.ClassesOnly {
		b.WriteString("# counted by class only (--no-sites): no file:line\n")
		by = "class"
	}
	if r.GCMarks+r.GCSweeps > 0 {
		fmt.Fprintf(&b, "# GC: %d mark phases %v, %d sweep phases %v\n", r.GCMarks, r.GCMark.Round(time.Microsecond), r.GCSweeps, r.GCSweep.Round(time.Microsecond))
	}
	if r.SitesDropped > 0 {
		fmt.Fprintf(&b, "# %d events had no room in the site table (counted by class only)\n", r.SitesDropped)
	}
	switch by {
	case "class":
		fmt.Fprintf(&b, "%10s %12s  %s\n", "COUNT", "BYTES", "CLASS")
		for _, c := range limit(r.ByClass, top) {
			fmt.Fprintf(&b, "%10d %12d  %s\n", c.Count, c.Bytes, c.Class)
		}
	case "line", "":
		for _, s := range limit(r.BySite, top) {
			fmt.Fprintf(&b, "%10d %s:%d:%s\n", s.Count, sitePath(s.Path), s.Line, s.Class)
		}
	default:
		return fmt.Errorf("unknown grouping %q (want class or line)", by)
	}
	if len(r.Stacks) > 0 {
		fmt.Fprintf(&b, "# top allocation stacks (%d sampled stacks, innermost first)\n", r.StackSamples)
		for _, st := range limit(r.Stacks, topStacks(top)) {
			fmt.Fprintf(&b, "%10d %s\n", st.Count, st.Class)
			for _, f := range st.Frames {
				fmt.Fprintf(&b, "%10s   %s (%s:%d)\n", "", f.Name, sitePath(f.Path), f.Line)
			}
		}
	} else if r.StackError != "" {
		fmt.Fprintf(&b, "# %s\n", r.StackError)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func sitePath(p string) string {
	if p == "" {
		return "(unknown)"
	}
	return p
}

// Profile builds a pprof allocation profile: sample types alloc_objects
// (count) and alloc_space (bytes, where the probes give sizes); one
// location per file:line and class, whose function is the class.
func (r *Report) Profile() (*profile.Profile, error) {
	objects, space := "alloc_objects", "alloc_space"
	if r.Retained {
		objects, space = "inuse_objects", "inuse_space"
	}
	p := &profile.Profile{
		SampleType: []*profile.ValueType{
			{Type: objects, Unit: "count"},
			{Type: space, Unit: "bytes"},
		},
		DefaultSampleType: objects,
		PeriodType:        &profile.ValueType{Type: "objects", Unit: "count"},
		Period:            1,
		DurationNanos:     int64(r.Duration),
	}
	if r.Estimated {
		p.Comments = append(p.Comments, fmt.Sprintf("estimated: counts scaled by %.3g", r.Scale))
	}
	if r.Retained {
		p.Comments = append(p.Comments, "retained: objects created during the window and still alive at its end")
		if r.RetainedInfo != nil && r.RetainedInfo.CutShort {
			p.Comments = append(p.Comments, "the window was cut short: the process exited")
		}
	}
	if len(r.Stacks) > 0 {
		return r.stackProfile(p)
	}
	sites := r.BySite
	if len(sites) == 0 {
		// Counted by class only (--no-sites) and no stacks: one
		// location per class, so that the profile's total is the
		// report's.
		for _, c := range r.ByClass {
			sites = append(sites, SiteCount{Class: c.Class, Count: c.Count, Bytes: c.Bytes})
		}
	}
	funcs := map[[2]string]*profile.Function{}
	for _, s := range sites {
		path := sitePath(s.Path)
		fk := [2]string{s.Class, path}
		fn := funcs[fk]
		if fn == nil {
			fn = &profile.Function{ID: uint64(len(p.Function) + 1), Name: s.Class, SystemName: s.Class, Filename: path}
			funcs[fk] = fn
			p.Function = append(p.Function, fn)
		}
		loc := &profile.Location{ID: uint64(len(p.Location) + 1), Line: []profile.Line{{Function: fn, Line: int64(s.Line)}}}
		p.Location = append(p.Location, loc)
		p.Sample = append(p.Sample, &profile.Sample{
			Location: []*profile.Location{loc},
			Value:    []int64{int64(s.Count), int64(s.Bytes)},
		})
	}
	if err := p.CheckValid(); err != nil {
		return nil, fmt.Errorf("build profile: %w", err)
	}
	return p, nil
}

// WritePprof writes r as a gzipped pprof profile.
func (r *Report) WritePprof(w io.Writer) error {
	p, err := r.Profile()
	if err != nil {
		return err
	}
	if err := p.Write(w); err != nil {
		return fmt.Errorf("write profile: %w", err)
	}
	return nil
}

// stackProfile fills p with one sample per allocation stack: the class as
// the innermost frame (a function named after it), then the Ruby frames.
func (r *Report) stackProfile(p *profile.Profile) (*profile.Profile, error) {
	funcs := map[[2]string]*profile.Function{}
	locs := map[[3]string]*profile.Location{}
	loc := func(name, path string, line int) *profile.Location {
		k := [3]string{name, path, fmt.Sprint(line)}
		if l := locs[k]; l != nil {
			return l
		}
		fk := [2]string{name, path}
		fn := funcs[fk]
		if fn == nil {
			fn = &profile.Function{ID: uint64(len(p.Function) + 1), Name: name, SystemName: name, Filename: path}
			funcs[fk] = fn
			p.Function = append(p.Function, fn)
		}
		l := &profile.Location{ID: uint64(len(p.Location) + 1), Line: []profile.Line{{Function: fn, Line: int64(line)}}}
		locs[k] = l
		p.Location = append(p.Location, l)
		return l
	}
	withStacks := map[string]bool{}
	for _, st := range r.Stacks {
		withStacks[st.Class] = true
	}
	// Classes no sampled stack caught keep their count, under the class
	// alone, so that the profile's total is the report's.
	for _, c := range r.ByClass {
		if !withStacks[c.Class] && c.Count > 0 {
			p.Sample = append(p.Sample, &profile.Sample{
				Location: []*profile.Location{loc(c.Class, "", 0)},
				Value:    []int64{int64(c.Count), int64(c.Bytes)},
				Label:    map[string][]string{"class": {c.Class}},
			})
		}
	}
	for _, st := range r.Stacks {
		ls := []*profile.Location{loc(st.Class, "", 0)}
		for _, f := range st.Frames {
			ls = append(ls, loc(f.Name, f.Path, f.Line))
		}
		p.Sample = append(p.Sample, &profile.Sample{
			Location: ls,
			Value:    []int64{int64(st.Count), int64(st.Bytes)},
			Label:    map[string][]string{"class": {st.Class}},
		})
	}
	if err := p.CheckValid(); err != nil {
		return nil, fmt.Errorf("build profile: %w", err)
	}
	return p, nil
}

// StackSamplesList returns the sampled allocation stacks as samples (one per
// sampled stack, the class as the innermost frame), for the flame graph,
// speedscope and collapsed writers: their counts are stack samples,
// proportional to the allocations.
func (r *Report) StackSamplesList() []stack.Sample {
	var out []stack.Sample
	for _, st := range r.Stacks {
		frames := append([]stack.Frame{{Name: st.Class, Kind: stack.KindCFunc}}, st.Frames...)
		for i := uint64(0); i < st.Samples; i++ {
			out = append(out, stack.Sample{Pid: r.Pid, Frames: frames})
		}
	}
	return out
}

// writeRetainedText writes the retained view: a "#" header saying what was
// measured and how, memprof's "count file:line:Class" lines (with the
// bytes), or by class, then the top stacks.
func (r *Report) writeRetainedText(w io.Writer, by string, top int) error {
	var b strings.Builder
	var total, bytes uint64
	for _, c := range r.ByClass {
		total += c.Count
		bytes += c.Bytes
	}
	est := ""
	if r.Estimated {
		est = fmt.Sprintf(" (estimated: the objects tracked in the counting windows, scaled by %.3g)", r.Scale)
	}
	fmt.Fprintf(&b, "# rbscope alloc --retained: pid %d, %.1fs window, %d objects (%d bytes) created in it and still alive at its end%s\n",
		r.Pid, r.Duration.Seconds(), total, bytes, est)
	if ri := r.RetainedInfo; ri != nil {
		if ri.CutShort {
			fmt.Fprintf(&b, "# the window was cut short: the process exited after %.1fs; retained as of its exit (%s)\n", r.Duration.Seconds(), ri.EndRead)
		}
		fmt.Fprintf(&b, "# tracked %d objects: %d died at a GC, %d were gone at the end, %d alive", ri.Tracked, ri.Died, ri.Gone, ri.Alive)
		if ri.Unpaired > 0 {
			fmt.Fprintf(&b, "; %d create events not paired with an object", ri.Unpaired)
		}
		if ri.Full > 0 {
			fmt.Fprintf(&b, "; %d not tracked (table full)", ri.Full)
		}
		if ri.Unresolved > 0 {
			fmt.Fprintf(&b, "; %d unverified", ri.Unresolved)
		}
		b.WriteString("\n")
	}
	if r.Scaling == "counter" {
		fmt.Fprintf(&b, "# tracked %.1f%% of the time, scaled by Ruby's own allocation counter (%d objects allocated in all)\n", 100*r.Attached, r.RubyAllocated)
	}
	switch by {
	case "class":
		fmt.Fprintf(&b, "%10s %12s  %s\n", "COUNT", "BYTES", "CLASS")
		for _, c := range limit(r.ByClass, top) {
			fmt.Fprintf(&b, "%10d %12d  %s\n", c.Count, c.Bytes, c.Class)
		}
	case "line", "":
		for _, s := range limit(r.BySite, top) {
			fmt.Fprintf(&b, "%10d %s:%d:%s  (%d bytes)\n", s.Count, sitePath(s.Path), s.Line, s.Class, s.Bytes)
		}
	default:
		return fmt.Errorf("unknown grouping %q (want class or line)", by)
	}
	if len(r.Stacks) > 0 {
		fmt.Fprintf(&b, "# top retained stacks (%d retained objects had their stack copied, innermost first)\n", r.StackSamples)
		for _, st := range limit(r.Stacks, topStacks(top)) {
			fmt.Fprintf(&b, "%10d %s  (%d bytes)\n", st.Count, st.Class, st.Bytes)
			for _, f := range st.Frames {
				fmt.Fprintf(&b, "%10s   %s (%s:%d)\n", "", f.Name, sitePath(f.Path), f.Line)
			}
		}
	} else if r.StackError != "" {
		fmt.Fprintf(&b, "# %s\n", r.StackError)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

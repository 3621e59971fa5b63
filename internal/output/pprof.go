package output

import (
	"fmt"
	"io"
	"slices"
	"strconv"

	"github.com/google/pprof/profile"

	"github.com/rbscope/rbscope/internal/stack"
)

// pprofOut builds a pprof profile (profile.proto, gzipped): sample types
// samples/count and cpu/nanoseconds (count times the period, 1e9/rate),
// one function per function identity (name, file; start line 0 because
// the walker does not report it), one location per function and line, and
// per sample the labels thread and thread_name (the thread's name), activity
// (running, gvl_wait, blocked, gc; absent when unknown), tid and pid (numeric). Samples with
// the same stack and thread are merged.
type pprofOut struct {
	counter
	funcs   *memo[stack.Func, *profile.Function]
	locs    *memo[stack.Frame, *profile.Location]
	byLine  *memo[locKey, *profile.Location]
	samples map[string]*profile.Sample
	prof    *profile.Profile
	key     []byte
	stacks  repeats[pprofStack] // each thread's last stack
}

// pprofStack is a stack's locations and their part of a sample's key.
type pprofStack struct {
	locs []*profile.Location
	key  []byte
}

type locKey struct {
	fn   stack.Func
	line int64
}

func newPprof(o Options) Writer {
	p := &pprofOut{
		counter: counter{o: o},
		samples: make(map[string]*profile.Sample),
		prof: &profile.Profile{
			SampleType: []*profile.ValueType{
				{Type: "samples", Unit: "count"},
				{Type: "cpu", Unit: "nanoseconds"},
			},
			DefaultSampleType: "samples",
			PeriodType:        &profile.ValueType{Type: "cpu", Unit: "nanoseconds"},
		},
	}
	p.funcs, p.locs, p.byLine = newMemo(p.newFunc), newMemo(p.loc), newMemo(p.newLoc)
	p.stacks.off = o.noRepeats
	return p
}

// newFunc is the pprof function of k. No SystemName: pprof would
// "demangle" <main> away.
func (p *pprofOut) newFunc(k stack.Func) *profile.Function {
	fn := &profile.Function{ID: uint64(len(p.prof.Function) + 1), Name: k.Name, Filename: k.Path}
	p.prof.Function = append(p.prof.Function, fn)
	return fn
}

// newLoc is the pprof location of a function and line.
func (p *pprofOut) newLoc(lk locKey) *profile.Location {
	l := &profile.Location{ID: uint64(len(p.prof.Location) + 1), Line: []profile.Line{{Function: p.funcs.get(lk.fn), Line: lk.line}}}
	p.prof.Location = append(p.prof.Location, l)
	return l
}

func (p *pprofOut) loc(f stack.Frame) *profile.Location {
	k := f.Func()
	line := int64(f.Line)
	if k.Path == "" {
		line = 0 // a C frame's line is its caller's
	}
	// Frames differing only in a C frame's caller path share a location.
	return p.byLine.get(locKey{k, line})
}

func (p *pprofOut) Add(s stack.Sample) {
	if !p.note(&s) {
		return
	}
	p.key = p.key[:0]
	p.key = strconv.AppendInt(p.key, int64(s.Pid), 10)
	p.key = append(p.key, '/')
	p.key = strconv.AppendInt(p.key, int64(s.TID), 10)
	p.key = append(p.key, '/')
	p.key = append(p.key, s.ThreadName...)
	p.key = append(p.key, 0)
	p.key = append(p.key, s.Activity...)
	p.key = append(p.key, 0)
	st, same := p.stacks.at(&s)
	if !same {
		st.v.locs, st.v.key = st.v.locs[:0], st.v.key[:0]
		for i := range s.Frames {
			l := p.locs.get(s.Frames[i])
			st.v.locs = append(st.v.locs, l)
			st.v.key = strconv.AppendUint(st.v.key, l.ID, 36)
			st.v.key = append(st.v.key, ',')
		}
		st.keep(&s)
	}
	p.key = append(p.key, st.v.key...)
	if smp := p.samples[string(p.key)]; smp != nil {
		smp.Value[0]++
		return
	}
	smp := &profile.Sample{
		Location: slices.Clone(st.v.locs),
		Value:    []int64{1, 0},
		Label:    map[string][]string{"thread": {s.ThreadName}, "thread_name": {s.ThreadName}},
		NumLabel: map[string][]int64{"tid": {int64(s.TID)}, "pid": {int64(s.Pid)}},
	}
	if s.Activity != "" {
		smp.Label["activity"] = []string{string(s.Activity)}
	}
	p.samples[string(p.key)] = smp
	p.prof.Sample = append(p.prof.Sample, smp)
}

func (p *pprofOut) WriteTo(w io.Writer) (int64, error) {
	period := p.period().Nanoseconds()
	prof := p.prof
	prof.Period = period
	for _, s := range prof.Sample {
		s.Value[1] = s.Value[0] * period
	}
	if !p.first.IsZero() {
		prof.TimeNanos = p.first.UnixNano()
	}
	if !p.o.Start.IsZero() {
		prof.TimeNanos = p.o.Start.UnixNano()
	}
	prof.DurationNanos = p.duration().Nanoseconds()
	prof.Comments = []string{p.heading("")}
	if err := prof.CheckValid(); err != nil {
		return 0, fmt.Errorf("build pprof profile: %w", err)
	}
	cw := &countingWriter{w: w}
	if err := prof.Write(cw); err != nil {
		return cw.n, fmt.Errorf("write pprof profile: %w", err)
	}
	return cw.n, nil
}

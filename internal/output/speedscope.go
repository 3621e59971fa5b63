package output

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/rbscope/rbscope/internal/stack"
)

// speedscopeSchema is the $schema every speedscope file carries.
const speedscopeSchema = "https://www.speedscope.app/file-format-schema.json"

// speedscope writes speedscope's JSON format: shared frames (name, file,
// line; C and GC frames carry only their name) and one "sampled" profile
// per thread named "<tid> <thread name>" (with " (pid N)" when several
// processes were recorded). Stacks are outermost first; consecutive
// identical stacks of a thread are merged into one weighted sample. With a
// known rate the unit is milliseconds: each sample weighs 1000/rate,
// startValue is the thread's first sample time and endValue its last plus
// one period, both relative to Options.Start (or the earliest sample).
// Without a rate the unit is "none", weights are sample counts and each
// profile spans 0 to its sample count. The active profile is the one with
// the most samples.
type speedscope struct {
	counter
	frameIdx *memo[stack.Frame, int]
	frames   []ssFrame
	byFrame  *memo[ssFrame, int]
	threads  map[stack.ThreadKey]*ssThread
	stacks   repeats[[]int] // each thread's last stack, as frame indexes
}

type ssFrame struct {
	Name string `json:"name"`
	File string `json:"file,omitempty"`
	Line int    `json:"line,omitempty"`
}

type ssThread struct {
	pid, tid    int // tid: the latest native thread seen, 0 when none
	order       int // when first seen
	name        string
	first, last time.Time
	n           int     // samples
	stacks      [][]int // outermost first
	counts      []int   // samples per stack
}

type ssProfile struct {
	Type       string    `json:"type"`
	Name       string    `json:"name"`
	Unit       string    `json:"unit"`
	StartValue float64   `json:"startValue"`
	EndValue   float64   `json:"endValue"`
	Samples    [][]int   `json:"samples"`
	Weights    []float64 `json:"weights"`
}

type ssFile struct {
	Schema             string `json:"$schema"`
	Exporter           string `json:"exporter"`
	Name               string `json:"name"`
	ActiveProfileIndex int    `json:"activeProfileIndex"`
	Shared             struct {
		Frames []ssFrame `json:"frames"`
	} `json:"shared"`
	Profiles []ssProfile `json:"profiles"`
}

func newSpeedscope(o Options) Writer {
	s := &speedscope{counter: counter{o: o}, threads: make(map[stack.ThreadKey]*ssThread)}
	s.stacks.off = o.noRepeats
	s.frameIdx = newMemo(s.frame)
	s.byFrame = newMemo(func(sf ssFrame) int { // C frames called from different lines share one
		s.frames = append(s.frames, sf)
		return len(s.frames) - 1
	})
	return s
}

func (s *speedscope) frame(f stack.Frame) int {
	sf := ssFrame{Name: f.Name}
	if (f.Kind == stack.KindRuby || f.Kind == "") && !f.AtCaller() {
		sf.File, sf.Line = f.Path, f.Line
	}
	return s.byFrame.get(sf)
}

func (s *speedscope) Add(smp stack.Sample) {
	if !s.note(&smp) {
		return
	}
	st, same := s.stacks.at(&smp)
	if !same {
		st.v = st.v[:0]
		for i := len(smp.Frames) - 1; i >= 0; i-- {
			st.v = append(st.v, s.frameIdx.get(smp.Frames[i]))
		}
		st.keep(&smp)
	}
	k := smp.Key()
	t := s.threads[k]
	if t == nil {
		t = &ssThread{pid: smp.Pid, first: smp.Time, order: len(s.threads)}
		s.threads[k] = t
	}
	if smp.TID != 0 {
		t.tid = smp.TID
	}
	if smp.ThreadName != "" {
		t.name = smp.ThreadName
	}
	if smp.Time.Before(t.first) {
		t.first = smp.Time
	}
	if smp.Time.After(t.last) {
		t.last = smp.Time
	}
	t.n++
	if n := len(t.stacks); n > 0 && slices.Equal(t.stacks[n-1], st.v) {
		t.counts[n-1]++
		return
	}
	t.stacks = append(t.stacks, slices.Clone(st.v))
	t.counts = append(t.counts, 1)
}

func (s *speedscope) WriteTo(w io.Writer) (int64, error) {
	ts := make([]*ssThread, 0, len(s.threads))
	for _, t := range s.threads {
		ts = append(ts, t)
	}
	sort.Slice(ts, func(i, j int) bool {
		if ts[i].pid != ts[j].pid {
			return ts[i].pid < ts[j].pid
		}
		if ts[i].tid != ts[j].tid {
			return ts[i].tid < ts[j].tid
		}
		return ts[i].order < ts[j].order
	})
	start := s.o.Start
	if start.IsZero() {
		start = s.first
	}
	ms := func(t time.Time) float64 { return float64(t.Sub(start)) / float64(time.Millisecond) }
	f := ssFile{Schema: speedscopeSchema, Exporter: "rbscope", Name: s.heading("")}
	f.Shared.Frames = s.frames
	if f.Shared.Frames == nil {
		f.Shared.Frames = []ssFrame{}
	}
	f.Profiles = []ssProfile{}
	period, unit := float64(s.period())/float64(time.Millisecond), "milliseconds"
	if period <= 0 {
		period, unit = 1, "none"
	}
	most := 0
	for i, t := range ts {
		p := ssProfile{Type: "sampled", Name: strings.TrimSpace(stack.TIDText(t.tid) + " " + t.name), Samples: t.stacks}
		if len(s.pids) > 1 {
			p.Name += fmt.Sprintf(" (pid %d)", t.pid)
		}
		p.Unit = unit
		if unit == "none" {
			p.StartValue, p.EndValue = 0, float64(t.n)
		} else {
			p.StartValue, p.EndValue = ms(t.first), ms(t.last)+period
		}
		p.Weights = make([]float64, len(t.counts))
		for j, c := range t.counts {
			p.Weights[j] = float64(c) * period
		}
		if t.n > ts[most].n {
			most = i
		}
		f.Profiles = append(f.Profiles, p)
	}
	f.ActiveProfileIndex = most
	cw := &countingWriter{w: w}
	if err := json.NewEncoder(cw).Encode(&f); err != nil {
		return cw.n, fmt.Errorf("encode speedscope: %w", err)
	}
	return cw.n, nil
}

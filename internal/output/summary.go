package output

import (
	"io"
	"sort"
	"strconv"

	"github.com/rbscope/rbscope/internal/stack"
)

// summary is a text table of self and total time per function ("summary")
// or per source line ("summary-by-line"), sorted by self time, then total
// time, then name:
//
//	rbscope summary: pid 4242, 10.00 s, 1000 samples at 100 Hz
//	  % self  % total     self    total  function
//	   70.00    70.00      700      700  Foo#bar (/app/foo.rb)
//
// Self counts samples whose innermost frame is the row; total counts
// samples with the row anywhere in the stack (once per sample, however
// deep the recursion). A function row is "name (path)" for Ruby frames and
// "name" for C and GC frames; a line row is "path:line" of the frame (a C
// frame's is its caller's), or the name for a frame without a path. After
// the rows, a table gives each thread's share of samples by activity
// (running, gvl_wait, blocked, gc), when the samples carry activities.
type summary struct {
	counter
	byLine bool
	labels *memo[stack.Frame, *row]
	rows   *memo[string, *row]
	stacks repeats[[]*row] // each thread's last stack, as rows
	gen    int
	acts   activityTally
	// unreadAdded: Options.Unread is counted in acts.
	unreadAdded bool
}

type row struct {
	label       string
	self, total int
	seen        int // the last sample counted in total
}

func newSummary(o Options) Writer       { return newSummaryOf(o, false) }
func newSummaryByLine(o Options) Writer { return newSummaryOf(o, true) }

func newSummaryOf(o Options, byLine bool) *summary {
	s := &summary{counter: counter{o: o}, byLine: byLine}
	s.stacks.off = o.noRepeats
	s.labels = newMemo(s.row)
	s.rows = newMemo(func(l string) *row { return &row{label: l} })
	return s
}

func (s *summary) row(f stack.Frame) *row {
	var l string
	switch {
	case s.byLine && f.Path != "":
		l = f.Path + ":" + strconv.Itoa(f.Line)
	case s.byLine:
		l = f.Name
	default:
		k := f.Func()
		l = k.Name
		if k.Path != "" {
			l += " (" + k.Path + ")"
		}
	}
	return s.rows.get(l)
}

func (s *summary) Add(smp stack.Sample) {
	s.acts.add(&smp)
	if !s.note(&smp) {
		return
	}
	s.gen++
	st, same := s.stacks.at(&smp)
	if !same {
		st.v = st.v[:0]
		for i := range smp.Frames {
			st.v = append(st.v, s.labels.get(smp.Frames[i]))
		}
		st.keep(&smp)
	}
	for i, r := range st.v {
		if i == 0 {
			r.self++
		}
		if r.seen != s.gen {
			r.seen = s.gen
			r.total++
		}
	}
}

func (s *summary) WriteTo(w io.Writer) (int64, error) {
	rows := make([]*row, 0, len(s.rows.m))
	for _, r := range s.rows.m {
		rows = append(rows, r)
	}
	sort.Slice(rows, func(i, j int) bool {
		a, b := rows[i], rows[j]
		if a.self != b.self {
			return a.self > b.self
		}
		if a.total != b.total {
			return a.total > b.total
		}
		return a.label < b.label
	})
	if s.o.Top > 0 && len(rows) > s.o.Top {
		rows = rows[:s.o.Top]
	}
	cw := &countingWriter{w: w}
	what := "summary"
	col := "function"
	if s.byLine {
		what, col = "summary by line", "line"
	}
	cw.printf("%s\n", s.heading(" "+what))
	cw.printf("%8s %8s %8s %8s  %s\n", "% self", "% total", "self", "total", col)
	pct := func(n int) float64 {
		if s.samples == 0 {
			return 0
		}
		return 100 * float64(n) / float64(s.samples)
	}
	for _, r := range rows {
		cw.printf("%8.2f %8.2f %8d %8d  %s\n", pct(r.self), pct(r.total), r.self, r.total, r.label)
	}
	if s.o.Unread != nil && !s.unreadAdded {
		s.unreadAdded = true
		s.acts.addUnread(s.o.Unread())
	}
	s.acts.write(cw)
	return cw.n, cw.err
}

// Package output turns stack samples into the files people open: flame
// graphs, speedscope and pprof profiles, callgrind files, collapsed stacks
// and text summaries. Every format sits behind one small interface,
// Writer: feed it samples with Add, then write the result once with
// WriteTo.
//
// Samples without frames (a thread that ran no Ruby code when sampled) are
// skipped by every format; the summaries report how many.
//
// Every format carries each sample's thread and activity (running,
// gvl_wait, blocked, gc): the pseudo-frames "(garbage collection)",
// "(marking)", "(sweeping)" and "(waiting for GVL)" are ordinary innermost
// frames (kinds gc and gvl), and formats with labels or threads say more.
//
// Function identity is stack.Frame.Func: a Ruby frame's function is its name and path; a C or
// GC frame's function is its name alone, because its path is its caller's
// (Array#each called from two files is one function).
//
// Formats (details on each writer type):
//
//	flamegraph       self-contained HTML page: search, click to zoom, tooltips
//	speedscope       speedscope JSON, one sampled profile per thread
//	pprof            gzipped profile.proto: samples/count, cpu/nanoseconds,
//	                 labels thread, thread_name, activity, tid, pid
//	callgrind        callgrind format, event Samples, recursion-safe
//	                 inclusive costs
//	collapsed        folded stacks "outer;inner count"; Options.Lines adds
//	                 " (path:line)" to Ruby frames, Options.Threads roots
//	                 each stack at "thread NAME (TID)"
//	summary          self and total % by function, Options.Top rows, then
//	                 each thread's activity shares
//	summary-by-line  the same by path:line
package output

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/rbscope/rbscope/internal/stack"
)

// Writer accumulates samples and writes them in one format.
type Writer interface {
	// Add counts one sample. It never fails; a sample without frames is
	// skipped.
	Add(s stack.Sample)
	// WriteTo writes the result. Call it once, after the last Add.
	WriteTo(w io.Writer) (int64, error)
}

// Options tune the formats.
type Options struct {
	// RateHz is the sampling rate, used to turn sample counts into time
	// (pprof's period, speedscope's weights, durations in titles). Zero
	// means unknown: counts stay counts.
	RateHz float64
	// Title names the profile (flame graph heading, speedscope name).
	// Empty: "rbscope: pid <pids>".
	Title string
	// Start is when recording started; speedscope times are relative to
	// it. Zero: the first sample's time.
	Start time.Time
	// Lines makes collapsed stacks name frames "name (path:line)" instead
	// of "name".
	Lines bool
	// Top limits the summaries to the first Top rows; 0 means all.
	Top int
	// Threads roots each collapsed stack at "thread NAME (TID)" (py-spy's
	// convention).
	Threads bool
	// Unread returns, per thread, the samples not delivered because the
	// thread's stack could not be read, by activity: the summaries'
	// activity shares include them (a running thread's stack tears far
	// more often than one in GC or waiting). Called once all samples are
	// added (a recording's trailer comes after them); nil: none.
	Unread func() []UnreadThread
	// noRepeats derives every sample's stack anew, never reusing its
	// thread's last one (tests compare the outputs with and without).
	noRepeats bool
}

// UnreadThread is one thread's unread samples by activity (see
// Options.Unread).
type UnreadThread struct {
	Pid, TID   int
	Name       string
	ByActivity map[stack.Activity]int
}

type format struct {
	ext  string
	make func(Options) Writer
	desc string
}

var formats = map[string]format{
	"flamegraph":      {".html", newFlamegraph, "interactive flame graph, a self-contained HTML page"},
	"speedscope":      {".speedscope.json", newSpeedscope, "speedscope JSON (https://www.speedscope.app), one profile per thread"},
	"pprof":           {".pb.gz", newPprof, "gzipped pprof protobuf, for go tool pprof"},
	"callgrind":       {".callgrind.out", newCallgrind, "callgrind format, for kcachegrind and callgrind_annotate"},
	"collapsed":       {".collapsed.txt", newCollapsed, "folded stacks, one line per stack, for flamegraph.pl and inferno"},
	"summary":         {".summary.txt", newSummary, "self and total time by function"},
	"summary-by-line": {".summary-by-line.txt", newSummaryByLine, "self and total time by file:line"},
}

// Formats returns the format names, sorted.
func Formats() []string {
	names := make([]string, 0, len(formats))
	for n := range formats {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Describe returns a one-line description of a format, "" if unknown.
func Describe(format string) string { return formats[format].desc }

// DefaultExtension returns the file extension for a format, with its dot
// (".html"), or "" if the format is unknown.
func DefaultExtension(format string) string { return formats[format].ext }

// New returns a Writer for format, one of Formats().
func New(format string, o Options) (Writer, error) {
	f, ok := formats[format]
	if !ok {
		return nil, fmt.Errorf("unknown format %q (choose from %s)", format, strings.Join(Formats(), ", "))
	}
	return f.make(o), nil
}

// Render feeds every sample next yields into a new Writer for format and
// writes the result to w. next returns io.EOF after the last sample; any
// other error stops Render before anything is written and is returned.
// It returns the number of samples read.
func Render(format string, o Options, next func() (stack.Sample, error), w io.Writer) (int, error) {
	ow, err := New(format, o)
	if err != nil {
		return 0, err
	}
	n := 0
	for {
		s, err := next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return n, fmt.Errorf("read sample %d: %w", n, err)
		}
		ow.Add(s)
		n++
	}
	if _, err := ow.WriteTo(w); err != nil {
		return n, fmt.Errorf("write %s: %w", format, err)
	}
	return n, nil
}

// RenderFile is Render into the file path, written safely by WriteFile
// with wo: "-" is standard output, a device or FIFO is written in place
// (a FIFO once a reader opened it), a regular file is replaced only once
// the render succeeded, a symbolic link's target is written.
func RenderFile(format string, o Options, next func() (stack.Sample, error), path string, wo WriteOptions) (int, File, error) {
	n := 0
	f, err := WriteFile(path, wo, func(w io.Writer) error {
		var err error
		n, err = Render(format, o, next, w)
		return err
	})
	return n, f, err
}

// counter holds what every format tracks: totals, time span and pids.
type counter struct {
	o           Options
	samples     int // samples with frames
	skipped     int // samples without frames
	first, last time.Time
	pids        []int
}

// note counts s and reports whether it has frames.
func (c *counter) note(s *stack.Sample) bool {
	if len(s.Frames) == 0 {
		c.skipped++
		return false
	}
	c.samples++
	if !s.Time.IsZero() {
		if c.first.IsZero() || s.Time.Before(c.first) {
			c.first = s.Time
		}
		if s.Time.After(c.last) {
			c.last = s.Time
		}
	}
	if !slices.Contains(c.pids, s.Pid) {
		c.pids = append(c.pids, s.Pid)
	}
	return true
}

// period is the time one sample stands for; 0 when the rate is unknown.
func (c *counter) period() time.Duration {
	if c.o.RateHz <= 0 {
		return 0
	}
	return time.Duration(float64(time.Second) / c.o.RateHz)
}

// duration is the span of the samples: first to last plus one period, or
// samples times the period when times are unknown.
func (c *counter) duration() time.Duration {
	if !c.first.IsZero() {
		return c.last.Sub(c.first) + c.period()
	}
	return time.Duration(c.samples) * c.period()
}

func (c *counter) pidList() string {
	ps := slices.Clone(c.pids)
	slices.Sort(ps)
	var b strings.Builder
	for i, p := range ps {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprint(&b, p)
	}
	return b.String()
}

// heading is "<title or rbscope><what>: <describe>".
func (c *counter) heading(what string) string {
	t := c.o.Title
	if t == "" {
		t = "rbscope"
	}
	return t + what + ": " + c.describe()
}

func (c *counter) title() string {
	if c.o.Title != "" {
		return c.o.Title
	}
	if len(c.pids) == 0 {
		return "rbscope"
	}
	return "rbscope: pid " + c.pidList()
}

// describe is "pid 4242, 10.00 s, 1000 samples at 100 Hz".
func (c *counter) describe() string {
	var parts []string
	if len(c.pids) > 0 {
		parts = append(parts, "pid "+c.pidList())
	}
	if d := c.duration(); d > 0 {
		parts = append(parts, fmt.Sprintf("%.2f s", d.Seconds()))
	}
	s := fmt.Sprintf("%d samples", c.samples)
	if c.o.RateHz > 0 {
		s += fmt.Sprintf(" at %g Hz", c.o.RateHz)
	}
	parts = append(parts, s)
	if c.skipped > 0 {
		parts = append(parts, fmt.Sprintf("%d without Ruby frames skipped", c.skipped))
	}
	return strings.Join(parts, ", ")
}

// countingWriter counts bytes written and keeps the first error.
type countingWriter struct {
	w   io.Writer
	n   int64
	err error
}

func (cw *countingWriter) Write(p []byte) (int, error) {
	if cw.err != nil {
		return 0, cw.err
	}
	n, err := cw.w.Write(p)
	cw.n += int64(n)
	cw.err = err
	return n, err
}

func (cw *countingWriter) printf(format string, args ...any) {
	fmt.Fprintf(cw, format, args...)
}

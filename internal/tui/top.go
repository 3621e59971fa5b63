// Package tui holds rbscope top's live view: an aggregator of samples by
// function (and optionally by thread) and a renderer that draws the table
// with plain ANSI escape codes, so that it works in any terminal,
// including over ssh and in tmux.
package tui

import (
	"fmt"
	"maps"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/rbscope/rbscope/internal/stack"
)

// SortKey is a column of the table to sort by.
type SortKey int

// Sort keys, selected in the view with the keys 1 to 4.
const (
	SortOwnPct    SortKey = iota // share of the last interval's samples with the function on top
	SortTotalPct                 // share of the last interval's samples with the function anywhere
	SortOwnTime                  // time on top since the start
	SortTotalTime                // time anywhere in the stack since the start
	numSortKeys
)

var sortNames = [...]string{"%Own", "%Total", "OwnTime", "TotalTime"}

func (k SortKey) String() string {
	if k < 0 || k >= numSortKeys {
		return "?"
	}
	return sortNames[k]
}

type rowKey struct {
	fn     stack.Func
	thread stack.ThreadKey // zero in the all-threads view
}

// topThread is how a thread is shown: its latest name and native thread
// (a Ruby thread under M:N threads moves between native threads).
type topThread struct {
	name string
	tid  int
	// The counters of the distinct functions of its last stack, the
	// all-threads view's and its own, the top frame's first, and that
	// stack's identity: the next sample of the same stack bumps them
	// without looking its frames up again.
	stack    stack.ID
	all, own []*counts
}

type counts struct {
	own, total       int // since the start
	ownWin, totalWin int // in the current interval
	// samples of the interval with the function on the stack whose
	// thread was waiting for the GVL, or running GC
	gvlWin, gcWin int
}

// Top aggregates samples for the live view. It is safe for concurrent
// use: the sampler adds while the view renders.
type Top struct {
	mu          sync.Mutex
	rate        float64
	all         map[rowKey]*counts
	byThread    map[rowKey]*counts
	threads     map[stack.ThreadKey]*topThread
	samples     int // since the start
	win         int // in the current interval
	seen        map[stack.Func]int
	gen         int
	errors      int
	late        int
	lastErr     string
	start       time.Time
	lastSamples time.Time
	acts        map[stack.Activity]int // samples of the interval by activity
	// unread and unreadShown: samples whose stack could not be read, by
	// activity, since the start (SetUnread) and at the last Snapshot.
	unread, unreadShown map[stack.Activity]int
	// torn says which threads had samples kept under the
	// (stack changed while read) frame (SetTorn).
	torn string
}

// NewTop returns an empty aggregator for samples taken at rate Hz.
func NewTop(rate float64) *Top {
	return &Top{rate: rate, all: map[rowKey]*counts{}, byThread: map[rowKey]*counts{},
		threads: map[stack.ThreadKey]*topThread{}, seen: map[stack.Func]int{}, start: time.Now(), acts: map[stack.Activity]int{}}
}

// counter returns k's counters in m, made on first use.
func counter(m map[rowKey]*counts, k rowKey) *counts {
	c := m[k]
	if c == nil {
		c = &counts{}
		m[k] = c
	}
	return c
}

// bump counts a sample with c's function on the stack, on top when own.
func bump(c *counts, own bool, activity stack.Activity) {
	switch activity {
	case stack.ActivityGVLWait:
		c.gvlWin++
	case stack.ActivityGC:
		c.gcWin++
	}
	if own {
		c.own++
		c.ownWin++
	}
	c.total++
	c.totalWin++
}

// Add counts samples (one per thread). Samples without frames count
// towards the totals only.
func (t *Top) Add(samples []stack.Sample) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := range samples {
		s := &samples[i]
		t.samples++
		if s.Activity != "" {
			t.acts[s.Activity]++
		}
		t.win++
		t.lastSamples = s.Time
		tk := s.Key()
		th := t.threads[tk]
		if th == nil {
			th = &topThread{}
			t.threads[tk] = th
		}
		if s.ThreadName != "" {
			th.name = s.ThreadName
		}
		if s.TID != 0 {
			th.tid = s.TID
		}
		if !stack.Same(th.stack, s.Stack) {
			t.functions(th, tk, s)
		}
		for j := range th.all {
			bump(th.all[j], j == 0, s.Activity)
			bump(th.own[j], j == 0, s.Activity)
		}
	}
}

// functions makes th's counters those of the distinct functions of s's
// stack, th being the thread tk.
func (t *Top) functions(th *topThread, tk stack.ThreadKey, s *stack.Sample) {
	th.stack = s.Stack
	th.all, th.own = th.all[:0], th.own[:0]
	// A function counts once per sample in "total" however often it
	// recurses: mark it with this stack's generation.
	t.gen++
	for j := range s.Frames {
		k := s.Frames[j].Func()
		if t.seen[k] == t.gen {
			continue
		}
		t.seen[k] = t.gen
		th.all = append(th.all, counter(t.all, rowKey{fn: k}))
		th.own = append(th.own, counter(t.byThread, rowKey{fn: k, thread: tk}))
	}
}

// SetStatus records the sampler's error and lateness counts for the
// header line.
func (t *Top) SetStatus(errors, late int, lastErr string) {
	t.mu.Lock()
	t.errors, t.late, t.lastErr = errors, late, lastErr
	t.mu.Unlock()
}

// SetUnread records, by activity, the samples since the start that were
// not delivered because their stack could not be read (the sampler's
// ThreadSpan.Unread, summed over threads): the activity shares of the
// next view count the interval's, as summary's do. Leaving them out made
// running look rarer than it was (a running thread's stack is the one
// that changes while it is read).
func (t *Top) SetUnread(by map[stack.Activity]int) {
	t.mu.Lock()
	t.unread = maps.Clone(by)
	t.mu.Unlock()
}

// SetTorn records which threads had samples whose stack kept changing
// while it was read (nonblocking), and what share of each one's samples,
// as record's summary says it: shown under the counts ("" for none).
func (t *Top) SetTorn(summary string) {
	t.mu.Lock()
	t.torn = summary
	t.mu.Unlock()
}

// Row is one line of the table.
type Row struct {
	Function string // "Foo#bar"
	Path     string // iseq path ("" for C functions)
	TID      int    // the thread's latest native thread; 0 in the all-threads view, or when none
	Thread   string
	thread   stack.ThreadKey // the thread's identity (zero in the all-threads view)
	OwnPct   float64         // percent of the interval's samples
	// GVLWaitPct and GCPct are the shares of the interval's samples with
	// the function on the stack while its thread waited for the GVL or
	// ran GC.
	GVLWaitPct float64
	GCPct      float64
	TotalPct   float64
	OwnTime    time.Duration // since the start
	TotalTime  time.Duration
}

// View is one frame of the live view.
type View struct {
	Rows       []Row // all threads together
	ThreadRows []Row // per thread
	Samples    int   // since the start
	Interval   int   // samples in the interval shown
	Threads    int
	Errors     int
	Late       int
	LastError  string
	Elapsed    time.Duration
	Sort       SortKey
	// Activities are the interval's shares of samples by activity
	// (percent), empty when the samples carry none; they include the
	// Unread samples of the interval.
	Activities map[stack.Activity]float64
	Unread     int
	// Torn is SetTorn's summary since the start.
	Torn string
}

// Snapshot returns the current view (both the all-threads and the
// per-thread rows, sorted by sortBy) and starts a new interval.
func (t *Top) Snapshot(sortBy SortKey) View {
	t.mu.Lock()
	defer t.mu.Unlock()
	period := time.Duration(0)
	if t.rate > 0 {
		period = time.Duration(float64(time.Second) / t.rate)
	}
	v := View{Samples: t.samples, Interval: t.win, Threads: len(t.threads), Errors: t.errors, Late: t.late,
		LastError: t.lastErr, Elapsed: time.Since(t.start), Sort: sortBy, Torn: t.torn}
	rows := func(m map[rowKey]*counts) []Row {
		out := make([]Row, 0, len(m))
		for k, c := range m {
			r := Row{Function: k.fn.Name, Path: k.fn.Path}
			if th := t.threads[k.thread]; th != nil && k.thread != (stack.ThreadKey{}) {
				r.TID, r.Thread, r.thread = th.tid, th.name, k.thread
			}
			r.OwnTime, r.TotalTime = time.Duration(c.own)*period, time.Duration(c.total)*period
			if t.win > 0 {
				r.OwnPct = 100 * float64(c.ownWin) / float64(t.win)
				r.TotalPct = 100 * float64(c.totalWin) / float64(t.win)
				r.GVLWaitPct = 100 * float64(c.gvlWin) / float64(t.win)
				r.GCPct = 100 * float64(c.gcWin) / float64(t.win)
			}
			out = append(out, r)
			c.ownWin, c.totalWin, c.gvlWin, c.gcWin = 0, 0, 0, 0
		}
		SortRows(out, sortBy)
		return out
	}
	v.Rows = rows(t.all)
	v.ThreadRows = rows(t.byThread)
	for a, n := range t.unread {
		if d := n - t.unreadShown[a]; d > 0 {
			t.acts[a] += d
			v.Unread += d
		}
	}
	t.unreadShown = t.unread
	if n := t.win + v.Unread; len(t.acts) > 0 && n > 0 {
		v.Activities = map[stack.Activity]float64{}
		for a, k := range t.acts {
			v.Activities[a] = 100 * float64(k) / float64(n)
		}
	}
	clear(t.acts)
	t.win = 0
	return v
}

// Resort orders the view's rows by key.
func (v *View) Resort(key SortKey) {
	v.Sort = key
	SortRows(v.Rows, key)
	SortRows(v.ThreadRows, key)
}

// SortRows orders rows by key, largest first; ties by name.
func SortRows(rows []Row, key SortKey) {
	val := func(r *Row) float64 {
		switch key {
		case SortOwnPct:
			return r.OwnPct
		case SortTotalPct:
			return r.TotalPct
		case SortOwnTime:
			return float64(r.OwnTime)
		default:
			return float64(r.TotalTime)
		}
	}
	sort.SliceStable(rows, func(i, j int) bool {
		a, b := val(&rows[i]), val(&rows[j])
		if a != b {
			return a > b
		}
		// Secondary: cumulative total, then name, then thread.
		if rows[i].TotalTime != rows[j].TotalTime {
			return rows[i].TotalTime > rows[j].TotalTime
		}
		if rows[i].Function != rows[j].Function {
			return rows[i].Function < rows[j].Function
		}
		if rows[i].TID != rows[j].TID {
			return rows[i].TID < rows[j].TID
		}
		x, y := rows[i].thread, rows[j].thread
		return x.Pid < y.Pid || x.Pid == y.Pid && (x.ID < y.ID || x.ID == y.ID && x.TID < y.TID)
	})
}

// Header describes the target for the first line.
type Header struct {
	Pid         int
	RubyVersion string
	Mode        string // "blocking", "nonblocking"
	// Keep is which samples are kept (--mode): wall ("" too), cpu, gvl.
	Keep     stack.Mode
	Rate     float64
	Interval time.Duration
}

// ANSI escape sequences.
const (
	EnterAltScreen = "\033[?1049h"
	ExitAltScreen  = "\033[?1049l"
	HideCursor     = "\033[?25l"
	ShowCursor     = "\033[?25h"
	home           = "\033[H"
	clearLine      = "\033[K"
	clearBelow     = "\033[J"
	reverse        = "\033[7m"
	bold           = "\033[1m"
	reset          = "\033[0m"
)

// Render draws v (per thread or not) for a width x height terminal: the
// cursor goes home, every line is overwritten and cleared to its end (no
// flicker), and the rest of the screen is cleared. Lines use \r\n (the
// terminal is in raw mode). Two lines of status and the column headings
// come before the rows, so that the first rows (what the process spends
// its time in) are on the screen's fourth line (fifth, under a line naming
// the threads whose stacks changed while read, View.Torn); the keys (or
// the last error) are on its last.
func Render(h Header, v View, perThread bool, width, height int, paused bool) string {
	if width < 40 {
		width = 40
	}
	if height < 6 {
		height = 6
	}
	var b strings.Builder
	line := func(s string, style string) {
		s = truncate(s, width)
		if style != "" {
			b.WriteString(style)
			b.WriteString(s)
			b.WriteString(strings.Repeat(" ", max(0, width-utf8.RuneCountInString(s))))
			b.WriteString(reset)
		} else {
			b.WriteString(s)
		}
		b.WriteString(clearLine)
		b.WriteString("\r\n")
	}
	b.WriteString(home)
	keep := h.Keep
	if keep == "" {
		keep = stack.ModeWall
	}
	status := fmt.Sprintf("rbscope top  pid %d  Ruby %s  %g Hz %s  mode %s  %s elapsed", h.Pid, h.RubyVersion, h.Rate, h.Mode, keep, v.Elapsed.Truncate(time.Second))
	if paused {
		status += "  [display paused]"
	}
	line(status, bold)
	counts := fmt.Sprintf("Samples: %d (%d new)  Threads: %d  Errors: %d  Late: %d", v.Samples, v.Interval, v.Threads, v.Errors, v.Late)
	if v.Activities != nil {
		counts += fmt.Sprintf("  |  running %.1f%%  GVL wait %.1f%%  blocked %.1f%%  GC %.1f%%",
			v.Activities[stack.ActivityRunning], v.Activities[stack.ActivityGVLWait], v.Activities[stack.ActivityBlocked], v.Activities[stack.ActivityGC])
		if v.Unread > 0 {
			counts += fmt.Sprintf("  (%d unread stacks included)", v.Unread)
		}
	}
	line(counts, "")
	if v.Torn != "" {
		line("Stacks changed while read: "+v.Torn, "")
	}
	cols := []string{"%Own", "%Total", "OwnTime", "TotalTime"}
	for i := range cols {
		if SortKey(i) == v.Sort {
			cols[i] = "[" + cols[i] + "]"
		}
	}
	// The GVL-wait and GC columns appear when the samples carry activities.
	acts := v.Activities != nil
	head := fmt.Sprintf("%7s %7s %10s %10s  ", cols[0], cols[1], cols[2], cols[3])
	if acts {
		head = fmt.Sprintf("%7s %7s %10s %10s %7s %7s  ", cols[0], cols[1], cols[2], cols[3], "%GVLw", "%GC")
	}
	list := v.Rows
	threadWidth := 0
	if perThread {
		list = v.ThreadRows
		threadWidth = threadColumn(list, width)
		head += fmt.Sprintf("%-*s ", threadWidth, "Thread (tid)")
	}
	head += "Function (file)"
	line(head, reverse)
	rows := height - 4
	if v.Torn != "" {
		rows--
	}
	for i := 0; i < len(list) && i < rows; i++ {
		r := list[i]
		s := fmt.Sprintf("%6.2f%% %6.2f%% %9.2fs %9.2fs  ", r.OwnPct, r.TotalPct, r.OwnTime.Seconds(), r.TotalTime.Seconds())
		if acts {
			s = fmt.Sprintf("%6.2f%% %6.2f%% %9.2fs %9.2fs %6.2f%% %6.2f%%  ", r.OwnPct, r.TotalPct, r.OwnTime.Seconds(), r.TotalTime.Seconds(), r.GVLWaitPct, r.GCPct)
		}
		if perThread {
			s += threadLabel(r.Thread, r.TID, threadWidth) + " "
		}
		s += r.Function
		if r.Path != "" {
			s += " (" + filepath.Base(r.Path) + ")"
		}
		line(s, "")
	}
	for i := len(list); i < rows; i++ {
		line("", "")
	}
	help := "q quit  t threads  1-4 sort  space pause"
	if v.LastError != "" && v.Errors > 0 {
		help = "last error: " + v.LastError
	}
	b.WriteString(truncate(help, width))
	b.WriteString(clearBelow)
	return b.String()
}

// threadColumn is the width of the per-thread view's thread column: the
// longest "name (tid)" of the rows, at least its heading's, at most a
// third of the terminal.
func threadColumn(rows []Row, width int) int {
	w := utf8.RuneCountInString("Thread (tid)")
	for _, r := range rows {
		w = max(w, utf8.RuneCountInString(r.Thread)+len(stack.TIDText(r.TID))+3)
	}
	return min(w, max(16, width/3))
}

// threadLabel is a thread as the per-thread view shows it, "name (tid)"
// padded to width: threads of one name (a pool's) are told apart by tid,
// and a name too long for the column keeps its start and its end (where
// a pool numbers its threads) around "…", never cut as if it were whole.
func threadLabel(name string, tid, width int) string {
	id := " (" + stack.TIDText(tid) + ")"
	if name == "" {
		name = "?"
	}
	room := width - len(id)
	if r := []rune(name); len(r) > room {
		if room < 3 {
			name = ""
			id = strings.TrimPrefix(id, " ")
		} else {
			tail := (room - 1) / 2
			name = string(r[:room-1-tail]) + "…" + string(r[len(r)-tail:])
		}
	}
	return fmt.Sprintf("%-*s", width, name+id)
}

func truncate(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n])
}

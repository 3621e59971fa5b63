package output

import (
	"io"
	"sort"
	"strconv"
	"strings"

	"github.com/rbscope/rbscope/internal/stack"
)

// collapsed writes Brendan Gregg's folded stacks: one line per distinct
// stack, frames outermost first separated by ";", then a space and the
// number of samples. Frames are "name", or "name (path:line)" with
// Options.Lines (C, internal and pseudo-frames stay "name"); with
// Options.Threads each stack starts with "thread NAME (TID)", a thread's
// latest name and native thread ("no tid" when it had none). A ";" or
// newline inside a name becomes ":" or " " so lines stay parseable. Lines
// are sorted by stack text.
type collapsed struct {
	counter
	// With Options.Threads, each count's key starts with its thread's
	// index in thList and a NUL: the thread is shown by its latest name
	// and tid, so that a Ruby thread that moves between native threads
	// (M:N) or is renamed stays one.
	threads map[stack.ThreadKey]int
	thList  []collapsedThread
	labels  *memo[stack.Frame, string]
	counts  map[string]*int
	buf     []byte
	stacks  repeats[[]byte] // each thread's last stack, folded
}

func newCollapsed(o Options) Writer {
	c := &collapsed{counter: counter{o: o}, counts: make(map[string]*int)}
	c.stacks.off = o.noRepeats
	c.labels = newMemo(c.label)
	return c
}

var foldReplacer = strings.NewReplacer(";", ":", "\n", " ", "\r", " ")

func (c *collapsed) label(f stack.Frame) string {
	l := foldReplacer.Replace(f.Name)
	if c.o.Lines && f.Path != "" && !f.AtCaller() && !f.IsPseudo() {
		l += " (" + foldReplacer.Replace(f.Path) + ":" + strconv.Itoa(f.Line) + ")"
	}
	return l
}

func (c *collapsed) Add(s stack.Sample) {
	if !c.note(&s) {
		return
	}
	c.buf = c.buf[:0]
	if c.o.Threads {
		k := s.Key()
		ti, ok := c.threads[k]
		if !ok {
			if c.threads == nil {
				c.threads = map[stack.ThreadKey]int{}
			}
			ti = len(c.thList)
			c.threads[k] = ti
			c.thList = append(c.thList, collapsedThread{})
		}
		if t := &c.thList[ti]; s.TID != 0 || s.ThreadName != "" {
			if s.TID != 0 {
				t.tid = s.TID
			}
			if s.ThreadName != "" {
				t.name = s.ThreadName
			}
		}
		c.buf = strconv.AppendInt(c.buf, int64(ti), 10)
		c.buf = append(c.buf, 0)
	}
	st, same := c.stacks.at(&s)
	if !same {
		st.v = st.v[:0]
		for i := len(s.Frames) - 1; i >= 0; i-- {
			if i != len(s.Frames)-1 {
				st.v = append(st.v, ';')
			}
			st.v = append(st.v, c.labels.get(s.Frames[i])...)
		}
		st.keep(&s)
	}
	c.buf = append(c.buf, st.v...)
	if p := c.counts[string(c.buf)]; p != nil { // no allocation for a known stack
		*p++
		return
	}
	one := 1
	c.counts[string(c.buf)] = &one
}

// collapsedThread is how a thread is shown: its latest name and tid.
type collapsedThread struct {
	name string
	tid  int
}

func (c *collapsed) WriteTo(w io.Writer) (int64, error) {
	counts := c.counts
	if c.o.Threads {
		// Each thread's index becomes "thread NAME (TID);" (two threads
		// shown alike add up).
		counts = make(map[string]*int, len(c.counts))
		for k, n := range c.counts {
			i := strings.IndexByte(k, 0)
			ti, _ := strconv.Atoi(k[:i])
			t := c.thList[ti]
			label := "thread " + foldReplacer.Replace(t.name) + " (" + stack.TIDText(t.tid) + ");" + k[i+1:]
			if p := counts[label]; p != nil {
				*p += *n
			} else {
				v := *n
				counts[label] = &v
			}
		}
	}
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	cw := &countingWriter{w: w}
	for _, k := range keys {
		cw.printf("%s %d\n", k, *counts[k])
	}
	return cw.n, cw.err
}

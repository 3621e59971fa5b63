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
// Options.Lines (C and pseudo-frames without a path stay "name"); with
// Options.Threads each stack starts with "thread NAME (TID)". A ";" or
// newline inside a name becomes ":" or " " so lines stay parseable. Lines
// are sorted by stack text.
type collapsed struct {
	counter
	labels *memo[stack.Frame, string]
	counts map[string]*int
	buf    []byte
	stacks repeats[[]byte] // each thread's last stack, folded
}

func newCollapsed(o Options) Writer {
	c := &collapsed{counter: counter{o: o}, counts: make(map[string]*int)}
	c.labels = newMemo(c.label)
	return c
}

var foldReplacer = strings.NewReplacer(";", ":", "\n", " ", "\r", " ")

func (c *collapsed) label(f stack.Frame) string {
	l := foldReplacer.Replace(f.Name)
	if c.o.Lines && f.Path != "" && f.Kind != stack.KindCFunc && !f.IsPseudo() {
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
		c.buf = append(c.buf, "thread "...)
		c.buf = append(c.buf, foldReplacer.Replace(s.ThreadName)...)
		c.buf = append(c.buf, " ("...)
		c.buf = strconv.AppendInt(c.buf, int64(s.TID), 10)
		c.buf = append(c.buf, ");"...)
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

func (c *collapsed) WriteTo(w io.Writer) (int64, error) {
	keys := make([]string, 0, len(c.counts))
	for k := range c.counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	cw := &countingWriter{w: w}
	for _, k := range keys {
		cw.printf("%s %d\n", k, *c.counts[k])
	}
	return cw.n, cw.err
}

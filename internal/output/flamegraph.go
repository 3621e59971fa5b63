package output

import (
	"cmp"
	_ "embed"
	"fmt"
	"html/template"
	"io"
	"slices"
	"time"

	"github.com/rbscope/rbscope/internal/stack"
)

//go:embed flamegraph.html.tmpl
var flamegraphHTML string

var flamegraphTmpl = template.Must(template.New("flamegraph").Parse(flamegraphHTML))

// flamegraph writes a self-contained interactive flame graph: one HTML
// page with its data, style and script inline (no external resources).
// Frames are merged per function (see the package comment) along each
// path from the root, sorted alphabetically at every level as in Brendan
// Gregg's flamegraph.pl; the heading shows the title and the pid(s),
// duration and sample count. The graph is an icicle, the root on top and
// callees below, so that the page opens on the roots and the hot paths;
// a chain of frames that adds nothing (each the only callee of the one
// above, with all its samples) longer than a few frames is folded into
// one row, which a click expands. Idle samples, those whose thread was
// blocked (had released the GVL: sleep, IO, select, Queue#pop) and not on
// a CPU, are hidden until the "Show idle threads" box is ticked (or the
// activity blocked or one thread is chosen), and the page says how many;
// GVL waits are not idle. In the page: hover shows a frame's function,
// file, samples and percentage; click zooms into a frame (click the root
// or press Escape to zoom out); the search box (a regular expression, or
// Ctrl-F) highlights matching frames and shows the share of samples they
// cover. A thread selector and an activity filter (running, gvl_wait,
// blocked, gc) narrow the graph to some samples; a timeline shows one lane
// per thread coloured by activity over time, and dragging across it
// selects a time range that the graph then shows alone (click to clear).
// The URL fragment can preset all of these:
// page.html#s=fib&z=%3Cmain%3E&th=4243&act=gvl_wait&r=1000-2500&idle=1 (r
// in milliseconds from the first sample; idle=1 shows idle samples).
type flamegraph struct {
	counter
	root    *fgNode
	samples []fgSample
	threads map[stack.ThreadKey]int
	thList  []fgThread
	stacks  repeats[[]*fgNode] // each thread's last stack, as its path from the root
}

// fgSample is one sample for the page's filters: when, which thread, what
// activity, and the tree node its stack ends at.
type fgSample struct {
	t      time.Time
	thread int
	act    stack.Activity
	onCPU  bool
	leaf   *fgNode
}

type fgThread struct {
	pid, tid int // tid: the latest native thread seen, 0 when none
	name     string
}

type fgNode struct {
	key         stack.Func
	kind        stack.Kind
	total, self int
	kids        map[stack.Func]*fgNode
	id          int // pre-order index in the page's tree
}

func newFlamegraph(o Options) Writer {
	f := &flamegraph{counter: counter{o: o}, root: &fgNode{key: stack.Func{Name: "all"}, kind: "root"}, threads: map[stack.ThreadKey]int{}}
	f.stacks.off = o.noRepeats
	return f
}

func (fg *flamegraph) Add(s stack.Sample) {
	if !fg.note(&s) {
		return
	}
	n := fg.root
	n.total++
	st, same := fg.stacks.at(&s)
	if !same {
		st.v = st.v[:0]
		for i := len(s.Frames) - 1; i >= 0; i-- {
			f := &s.Frames[i]
			k := f.Func()
			c := n.kids[k]
			if c == nil {
				if n.kids == nil {
					n.kids = make(map[stack.Func]*fgNode)
				}
				c = &fgNode{key: k, kind: f.Kind}
				n.kids[k] = c
			}
			st.v = append(st.v, c)
			n = c
		}
		st.keep(&s)
	}
	for _, c := range st.v {
		c.total++
		n = c
	}
	n.self++
	id := s.Key()
	ti, ok := fg.threads[id]
	if !ok {
		ti = len(fg.thList)
		fg.threads[id] = ti
		fg.thList = append(fg.thList, fgThread{pid: s.Pid})
	}
	if s.TID != 0 {
		fg.thList[ti].tid = s.TID
	}
	if s.ThreadName != "" {
		fg.thList[ti].name = s.ThreadName
	}
	fg.samples = append(fg.samples, fgSample{t: s.Time, thread: ti, act: s.Activity, onCPU: s.OnCPU, leaf: n})
}

// fgData is the page's data: a string table and the tree as nested arrays
// [name, file, kind, total, self, children...], all indexes into Strings
// except total and self; the threads as [pid, tid, name]; and the samples
// as one flat array of quintuples [milliseconds since the first sample,
// thread index, activity (index into Strings), node, flags] where node
// numbers the tree's nodes in pre-order (the root is 0, then each child's
// subtree in the order listed) and flags is 1 when the thread was on a
// CPU (stack.Sample.OnCPU), else 0.
type fgData struct {
	Strings []string `json:"strings"`
	Root    []any    `json:"root"`
	Threads [][3]any `json:"threads"`
	Samples []int64  `json:"samples"`
	Period  float64  `json:"period"` // ms per sample, 0 when unknown
}

func (fg *flamegraph) WriteTo(w io.Writer) (int64, error) {
	d := fgData{}
	ids := map[string]int{}
	str := func(s string) int {
		if i, ok := ids[s]; ok {
			return i
		}
		ids[s] = len(d.Strings)
		d.Strings = append(d.Strings, s)
		return ids[s]
	}
	next := 0
	var enc func(n *fgNode) []any
	enc = func(n *fgNode) []any {
		n.id = next
		next++
		a := []any{str(n.key.Name), str(n.key.Path), str(string(n.kind)), n.total, n.self}
		kids := make([]*fgNode, 0, len(n.kids))
		for _, c := range n.kids {
			kids = append(kids, c)
		}
		slices.SortFunc(kids, func(a, b *fgNode) int {
			return cmp.Or(cmp.Compare(a.key.Name, b.key.Name), cmp.Compare(a.key.Path, b.key.Path))
		})
		for _, c := range kids {
			a = append(a, enc(c))
		}
		return a
	}
	d.Root = enc(fg.root)
	d.Threads = make([][3]any, len(fg.thList))
	for i, t := range fg.thList {
		d.Threads[i] = [3]any{t.pid, t.tid, str(t.name)}
	}
	first := fg.first
	d.Samples = make([]int64, 0, 5*len(fg.samples))
	for _, s := range fg.samples {
		ms := int64(0)
		if !s.t.IsZero() && !first.IsZero() {
			ms = s.t.Sub(first).Milliseconds()
		}
		act := s.act
		if act == "" {
			act = stack.ActivityUnknown
		}
		flags := int64(0)
		if s.onCPU {
			flags = 1
		}
		d.Samples = append(d.Samples, ms, int64(s.thread), int64(str(string(act))), int64(s.leaf.id), flags)
	}
	d.Period = float64(fg.period()) / float64(time.Millisecond)
	// html/template escapes the title for HTML and encodes the data as
	// JSON safe inside its <script type="application/json">.
	cw := &countingWriter{w: w}
	err := flamegraphTmpl.Execute(cw, struct {
		Title, Desc string
		Data        fgData
	}{fg.title(), fg.describe(), d})
	if err != nil {
		return cw.n, fmt.Errorf("write flame graph: %w", err)
	}
	return cw.n, nil
}

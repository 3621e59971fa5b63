package output

import (
	"cmp"
	_ "embed"
	"fmt"
	"html/template"
	"io"
	"slices"

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
// duration and sample count. In the page: hover shows a frame's function,
// file, samples and percentage; click zooms into a frame (click the root
// or press Escape to zoom out); the search box (a regular expression, or
// Ctrl-F) highlights matching frames and shows the share of samples they
// cover. The URL fragment can preset both: page.html#s=fib&z=%3Cmain%3E.
type flamegraph struct {
	counter
	root *fgNode
}

type fgNode struct {
	key         stack.Func
	kind        string
	total, self int
	kids        map[stack.Func]*fgNode
}

func newFlamegraph(o Options) Writer {
	return &flamegraph{counter: counter{o: o}, root: &fgNode{key: stack.Func{Name: "all"}, kind: "root"}}
}

func (fg *flamegraph) Add(s stack.Sample) {
	if !fg.note(&s) {
		return
	}
	n := fg.root
	n.total++
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
		c.total++
		n = c
	}
	n.self++
}

// fgData is the page's data: a string table and the tree as nested arrays
// [name, file, kind, total, self, children...], all indexes into Strings
// except total and self.
type fgData struct {
	Strings []string `json:"strings"`
	Root    []any    `json:"root"`
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
	var enc func(n *fgNode) []any
	enc = func(n *fgNode) []any {
		a := []any{str(n.key.Name), str(n.key.Path), str(n.kind), n.total, n.self}
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

package output

import (
	"cmp"
	"io"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/rbscope/rbscope/internal/stack"
)

// nativeFile is the callgrind file of C and GC functions, which have no
// Ruby file of their own.
const nativeFile = "<native>"

// callgrind writes the callgrind profile format
// (https://valgrind.org/docs/manual/cl-format.html) with one event,
// Samples. Self cost is charged to the innermost frame's function at its
// line; each caller-to-callee edge gets a calls= line, charged at the
// caller's line, whose count is the number of samples with the edge
// (sampling cannot count calls) and whose inclusive cost counts the
// samples in which the callee is not already further out on the stack, so
// that recursion (fib calling fib, or a calling b calling a) is not
// counted twice in callgrind_annotate's and kcachegrind's inclusive
// totals; a recursive edge keeps cost 0.
type callgrind struct {
	counter
	funcs *memo[stack.Func, *cgFunc]
	order []*cgFunc
	frame *memo[stack.Frame, *cgFunc]
	gen   int
	// stacks: each thread's last stack, as its calls.
	stacks repeats[cgStack]
}

type cgFunc struct {
	key   stack.Func
	seen  int         // the last sample it was seen in
	self  map[int]int // line -> samples
	calls map[cgEdge]*cgCall
}

type cgEdge struct {
	line   int // caller's line
	callee *cgFunc
}

type cgCall struct {
	samples int // samples with the edge
	cost    int // samples where the callee is not already further out
	seen    int
}

func newCallgrind(o Options) Writer {
	c := &callgrind{counter: counter{o: o}}
	c.stacks.off = o.noRepeats
	c.frame = newMemo(func(f stack.Frame) *cgFunc { return c.funcs.get(f.Func()) })
	c.funcs = newMemo(func(k stack.Func) *cgFunc {
		fn := &cgFunc{key: k, self: make(map[int]int), calls: make(map[cgEdge]*cgCall)}
		c.order = append(c.order, fn)
		return fn
	})
	return c
}

func (c *callgrind) Add(s stack.Sample) {
	if !c.note(&s) {
		return
	}
	c.gen++
	ent, same := c.stacks.at(&s)
	st := &ent.v
	if !same {
		last := len(s.Frames) - 1
		st.root = c.frame.get(s.Frames[last])
		st.steps = st.steps[:0]
		caller := st.root
		for i := last - 1; i >= 0; i-- {
			callee := c.frame.get(s.Frames[i])
			e := cgEdge{max(s.Frames[i+1].Line, 0), callee}
			call := caller.calls[e]
			if call == nil {
				call = &cgCall{}
				caller.calls[e] = call
			}
			st.steps = append(st.steps, cgStep{callee, call})
			caller = callee
		}
		ent.keep(&s)
	}
	st.root.seen = c.gen
	leaf := st.root
	for _, x := range st.steps {
		if x.call.seen != c.gen {
			x.call.seen = c.gen
			x.call.samples++
		}
		if x.callee.seen != c.gen {
			x.callee.seen = c.gen
			x.call.cost++
		}
		leaf = x.callee
	}
	leaf.self[max(s.Frames[0].Line, 0)]++
}

// cgStack is a stack as callgrind counts it: its outermost function, then
// each call from there inwards.
type cgStack struct {
	root  *cgFunc
	steps []cgStep
}

type cgStep struct {
	callee *cgFunc
	call   *cgCall
}

func (c *callgrind) WriteTo(w io.Writer) (int64, error) {
	cw := &countingWriter{w: w}
	cw.printf("# callgrind format\nversion: 1\ncreator: rbscope\n")
	if len(c.pids) == 1 {
		cw.printf("pid: %d\n", c.pids[0])
	}
	cw.printf("cmd: %s\n", oneLine(c.heading("")))
	cw.printf("positions: line\nevents: Samples\nsummary: %d\n\n", c.samples)

	fns := append([]*cgFunc(nil), c.order...)
	slices.SortFunc(fns, func(a, b *cgFunc) int {
		return cmp.Or(cmp.Compare(a.key.Path, b.key.Path), cmp.Compare(a.key.Name, b.key.Name))
	})
	fileIDs := map[string]int{}
	fnIDs := map[stack.Func]int{}
	file := func(k stack.Func) string {
		name := k.Path
		if name == "" {
			name = nativeFile
		}
		if id, ok := fileIDs[name]; ok {
			return "(" + strconv.Itoa(id) + ")"
		}
		id := len(fileIDs) + 1
		fileIDs[name] = id
		return "(" + strconv.Itoa(id) + ") " + oneLine(name)
	}
	fnName := func(k stack.Func) string {
		if id, ok := fnIDs[k]; ok {
			return "(" + strconv.Itoa(id) + ")"
		}
		id := len(fnIDs) + 1
		fnIDs[k] = id
		return "(" + strconv.Itoa(id) + ") " + oneLine(k.Name)
	}
	for _, f := range fns {
		cw.printf("fl=%s\nfn=%s\n", file(f.key), fnName(f.key))
		lines := make([]int, 0, len(f.self))
		for l := range f.self {
			lines = append(lines, l)
		}
		sort.Ints(lines)
		for _, l := range lines {
			cw.printf("%d %d\n", l, f.self[l])
		}
		edges := make([]cgEdge, 0, len(f.calls))
		for e := range f.calls {
			edges = append(edges, e)
		}
		slices.SortFunc(edges, func(a, b cgEdge) int {
			return cmp.Or(cmp.Compare(a.line, b.line), cmp.Compare(a.callee.key.Path, b.callee.key.Path),
				cmp.Compare(a.callee.key.Name, b.callee.key.Name))
		})
		for _, e := range edges {
			call := f.calls[e]
			cw.printf("cfl=%s\ncfn=%s\ncalls=%d 0\n%d %d\n", file(e.callee.key), fnName(e.callee.key), call.samples, e.line, call.cost)
		}
		cw.printf("\n")
	}
	return cw.n, cw.err
}

var lineReplacer = strings.NewReplacer("\n", " ", "\r", " ")

func oneLine(s string) string { return lineReplacer.Replace(s) }

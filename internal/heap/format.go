package heap

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/google/pprof/profile"
)

// WriteText writes the census as a table sorted by bytes (top rows, all
// when top <= 0), with a header that says how it was taken.
func (c *Census) WriteText(w io.Writer, top int) error {
	var total Entry
	for _, e := range c.Entries {
		total.Count += e.Count
		total.SlotBytes += e.SlotBytes
		total.MallocBytes += e.MallocBytes
	}
	total.Bytes = total.SlotBytes + total.MallocBytes
	fmt.Fprintf(w, "Process %d: Ruby %s heap, %d pages, %d slots (%d free), %d live objects, %s\n",
		c.Pid, c.RubyVersion, c.Pages, c.Slots, c.Types["FREE"], total.Count, human(total.Bytes))
	if c.Stopped {
		if c.Pause > 0 {
			fmt.Fprintf(w, "Exact: the process was paused for %s (census %s, %s read)\n", c.Pause.Round(10e3), c.Duration.Round(10e3), human(c.BytesRead))
		} else {
			fmt.Fprintf(w, "Exact: read from a core file (%s read)\n", human(c.BytesRead))
		}
	} else {
		fmt.Fprintf(w, "Running process: %d slots changed while read and are not counted; %d pages changed (census %s, %s read; --stop for an exact census)\n",
			c.Changed, c.PagesChanged, c.Duration.Round(10e3), human(c.BytesRead))
	}
	if c.Bad > 0 || c.PagesBad > 0 {
		fmt.Fprintf(w, "%d slots and %d pages failed their checks and are not counted\n", c.Bad, c.PagesBad)
	}
	if c.Partial {
		fmt.Fprintf(w, "PARTIAL census: %s\n", c.Why)
	}
	for _, n := range c.Notes {
		fmt.Fprintf(w, "Note: %s\n", n)
	}
	if so := c.SlotOnlyTypes(); len(so) > 0 {
		fmt.Fprintf(w, "Bytes: slot + malloc'd buffers of strings, arrays, hashes%s; slot only for %s\n",
			map[bool]string{true: ", objects", false: ""}[!contains(so, "T_OBJECT")], strings.Join(so, ", "))
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "bytes\t%\tcount\tslot bytes\tmalloc bytes\t type\t class\t")
	for i, e := range c.Entries {
		if top > 0 && i >= top {
			fmt.Fprintf(tw, "\t\t\t\t\t ... %d more rows (--top 0 for all)\t\t\n", len(c.Entries)-top)
			break
		}
		fmt.Fprintf(tw, "%d\t%.1f\t%d\t%d\t%d\t %s\t %s\t\n", e.Bytes, pct(e.Bytes, total.Bytes), e.Count, e.SlotBytes, e.MallocBytes, e.Type, e.Class)
	}
	fmt.Fprintf(tw, "%d\t100.0\t%d\t%d\t%d\t total\t\t\n", total.Bytes, total.Count, total.SlotBytes, total.MallocBytes)
	return tw.Flush()
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

func pct(a, b uint64) float64 {
	if b == 0 {
		return 0
	}
	return 100 * float64(a) / float64(b)
}

func human(n uint64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// WriteJSON writes the census as indented JSON.
func (c *Census) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(c)
}

// Profile is the census as a pprof heap profile: inuse_objects and
// inuse_space, one sample per entry with the stack type;class (the class
// innermost), so that go tool pprof -diff_base shows what grew between
// two censuses.
func (c *Census) Profile() (*profile.Profile, error) {
	p := &profile.Profile{
		SampleType: []*profile.ValueType{
			{Type: "inuse_objects", Unit: "count"},
			{Type: "inuse_space", Unit: "bytes"},
		},
		DefaultSampleType: "inuse_space",
		PeriodType:        &profile.ValueType{Type: "space", Unit: "bytes"},
		Period:            1,
		TimeNanos:         c.Time.UnixNano(),
		Comments:          []string{fmt.Sprintf("rbscope heap: process %d, Ruby %s", c.Pid, c.RubyVersion)},
	}
	if c.Partial {
		p.Comments = append(p.Comments, "partial census: "+c.Why)
	}
	locs := map[string]*profile.Location{}
	loc := func(name string) *profile.Location {
		if l, ok := locs[name]; ok {
			return l
		}
		fn := &profile.Function{ID: uint64(len(p.Function) + 1), Name: name, SystemName: name}
		p.Function = append(p.Function, fn)
		l := &profile.Location{ID: uint64(len(p.Location) + 1), Line: []profile.Line{{Function: fn}}}
		p.Location = append(p.Location, l)
		locs[name] = l
		return l
	}
	for _, e := range c.Entries {
		stack := []*profile.Location{loc(e.Type)}
		if e.Class != "" {
			stack = append([]*profile.Location{loc(e.Class)}, stack...)
		}
		p.Sample = append(p.Sample, &profile.Sample{
			Location: stack,
			Value:    []int64{int64(e.Count), int64(e.Bytes)},
			Label:    map[string][]string{"type": {e.Type}},
		})
	}
	if err := p.CheckValid(); err != nil {
		return nil, fmt.Errorf("build pprof profile: %w", err)
	}
	return p, nil
}

// WritePprof writes the census as a gzipped pprof profile.
func (c *Census) WritePprof(w io.Writer) error {
	p, err := c.Profile()
	if err != nil {
		return err
	}
	return p.Write(w)
}

// Growth is how one (type, class) changed between two censuses.
type Growth struct {
	Type       string `json:"type"`
	Class      string `json:"class"`
	Count      int64  `json:"count"` // objects gained (negative: lost)
	Bytes      int64  `json:"bytes"`
	TotalCount uint64 `json:"total_count"` // objects now
}

// Grow compares cur with base and returns the entries by objects gained,
// most first.
func Grow(base, cur *Census) []Growth {
	type k [2]string
	m := map[k]*Growth{}
	for _, e := range cur.Entries {
		m[k{e.Type, e.Class}] = &Growth{Type: e.Type, Class: e.Class, Count: int64(e.Count), Bytes: int64(e.Bytes), TotalCount: e.Count}
	}
	for _, e := range base.Entries {
		g := m[k{e.Type, e.Class}]
		if g == nil {
			g = &Growth{Type: e.Type, Class: e.Class}
			m[k{e.Type, e.Class}] = g
		}
		g.Count -= int64(e.Count)
		g.Bytes -= int64(e.Bytes)
	}
	out := make([]Growth, 0, len(m))
	for _, g := range m {
		out = append(out, *g)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Count != out[j].Count {
			return out[i].Count > out[j].Count
		}
		if out[i].Bytes != out[j].Bytes {
			return out[i].Bytes > out[j].Bytes
		}
		return out[i].Type+out[i].Class < out[j].Type+out[j].Class
	})
	return out
}

// WriteGrowth writes the top growers (at most top rows with a positive
// count or bytes) of a step.
func WriteGrowth(w io.Writer, step int, since string, gs []Growth, top int) error {
	fmt.Fprintf(w, "step %d, %s since the first census: top growers\n", step, since)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "+objects\t+bytes\tnow\t type\t class\t")
	n := 0
	for _, g := range gs {
		if n >= top || (g.Count <= 0 && g.Bytes <= 0) {
			break
		}
		fmt.Fprintf(tw, "%+d\t%+d\t%d\t %s\t %s\t\n", g.Count, g.Bytes, g.TotalCount, g.Type, g.Class)
		n++
	}
	if n == 0 {
		fmt.Fprintln(tw, "\t\t\t nothing grew\t\t")
	}
	return tw.Flush()
}

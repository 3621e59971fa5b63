package alloc

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// LiveRow is one line of the live view: a class or a site, its count since
// the start and its rate since the previous report.
type LiveRow struct {
	Name  string
	Count uint64
	Rate  float64 // per second
}

// LiveView is what the live view shows of a report, given the previous one
// (nil for the first).
type LiveView struct {
	Total     uint64
	Rate      float64
	Classes   []LiveRow
	Sites     []LiveRow
	Estimated bool
}

// Live computes the live view of r against prev.
func Live(r, prev *Report) LiveView {
	dt := r.Duration.Seconds()
	if prev != nil {
		dt = (r.Duration - prev.Duration).Seconds()
	}
	v := LiveView{Estimated: r.Estimated}
	v.Classes = liveRows(classMap(r), classMap(prev), dt)
	var prevTotal uint64
	for _, c := range v.Classes {
		v.Total += c.Count
	}
	if prev != nil {
		for _, c := range prev.ByClass {
			prevTotal += c.Count
		}
	}
	if dt > 0 {
		v.Rate = float64(v.Total-min(v.Total, prevTotal)) / dt
	}
	v.Sites = liveRows(siteMap(r), siteMap(prev), dt)
	return v
}

// Lines renders the view for a terminal, top n rows of each table.
func (v LiveView) Lines(r *Report, n int) []string {
	est := ""
	if v.Estimated {
		est = " (estimated)"
	}
	out := []string{
		fmt.Sprintf("pid %d  %.0fs  %d allocations%s  %.0f/s   GC mark %v sweep %v",
			r.Pid, r.Duration.Seconds(), v.Total, est, v.Rate, r.GCMark.Round(time.Millisecond), r.GCSweep.Round(time.Millisecond)),
		fmt.Sprintf("%12s %10s  %s", "COUNT", "RATE/s", "CLASS"),
	}
	for _, c := range limit(v.Classes, n) {
		out = append(out, fmt.Sprintf("%12d %10.0f  %s", c.Count, c.Rate, c.Name))
	}
	out = append(out, fmt.Sprintf("%12s %10s  %s", "COUNT", "RATE/s", "FILE:LINE:CLASS"))
	for _, s := range limit(v.Sites, n) {
		out = append(out, fmt.Sprintf("%12d %10.0f  %s", s.Count, s.Rate, s.Name))
	}
	return out
}

// Summary renders the view as one line, for logs.
func (v LiveView) Summary(r *Report) string {
	est := ""
	if v.Estimated {
		est = " (estimated)"
	}
	var top []string
	for _, c := range limit(v.Classes, 5) {
		top = append(top, fmt.Sprintf("%s %d", c.Name, c.Count))
	}
	return fmt.Sprintf("rbscope alloc: %.0fs %d allocations%s, %.0f/s; top: %s",
		r.Duration.Seconds(), v.Total, est, v.Rate, strings.Join(top, ", "))
}

// liveRows pairs each entry's cumulative count with its rate since prev.
func liveRows(cur, prev map[string]uint64, dt float64) []LiveRow {
	out := make([]LiveRow, 0, len(cur))
	for k, v := range cur {
		r := LiveRow{Name: k, Count: v}
		if dt > 0 {
			r.Rate = float64(v-min(v, prev[k])) / dt
		}
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Count != out[j].Count {
			return out[i].Count > out[j].Count
		}
		return out[i].Name < out[j].Name
	})
	return out
}

func classMap(r *Report) map[string]uint64 {
	return countsBy(r, func(r *Report) []ClassCount { return r.ByClass },
		func(c ClassCount) (string, uint64) { return c.Class, c.Count })
}

func siteMap(r *Report) map[string]uint64 {
	return countsBy(r, func(r *Report) []SiteCount { return r.BySite },
		func(s SiteCount) (string, uint64) {
			return fmt.Sprintf("%s:%d:%s", sitePath(s.Path), s.Line, s.Class), s.Count
		})
}

// countsBy maps each row of r (rows picks ByClass or BySite) to its count
// under the name key gives it; empty for a nil report.
func countsBy[T any](r *Report, rows func(*Report) []T, key func(T) (string, uint64)) map[string]uint64 {
	m := map[string]uint64{}
	if r == nil {
		return m
	}
	for _, row := range rows(r) {
		k, n := key(row)
		m[k] = n
	}
	return m
}

// Command benchchart draws scripts/bench-record.sh's rate sweep as an SVG
// chart: rbscope's CPU (% of one core) and late or missed ticks (%)
// against the sampling rate, one line per build and mode. It reads lines
// "BUILD MODE RATE CPU% LATE%" on stdin (a CPU or late field of "-" is a
// rate the build does not accept) and writes the SVG to stdout; the script
// turns it into a PNG with headless Chromium.
//
//	benchchart 'title' < sweep.tsv > chart.svg
package main

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
)

type point struct{ rate, cpu, late float64 }

type series struct {
	name   string
	points []point
}

func main() {
	title := ""
	if len(os.Args) > 1 {
		title = os.Args[1]
	}
	ss, err := read(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchchart:", err)
		os.Exit(1)
	}
	if err := draw(os.Stdout, title, ss); err != nil {
		fmt.Fprintln(os.Stderr, "benchchart:", err)
		os.Exit(1)
	}
}

func read(r io.Reader) ([]*series, error) {
	by := map[string]*series{}
	var order []string
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		f := strings.Fields(sc.Text())
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		if len(f) != 5 {
			return nil, fmt.Errorf("line %d: want BUILD MODE RATE CPU LATE, got %q", n, sc.Text())
		}
		if f[3] == "-" || f[4] == "-" {
			continue
		}
		rate, err1 := strconv.ParseFloat(f[2], 64)
		cpu, err2 := strconv.ParseFloat(f[3], 64)
		late, err3 := strconv.ParseFloat(f[4], 64)
		if err1 != nil || err2 != nil || err3 != nil || rate <= 0 {
			return nil, fmt.Errorf("line %d: bad numbers in %q", n, sc.Text())
		}
		name := f[0] + " " + f[1]
		s := by[name]
		if s == nil {
			s = &series{name: name}
			by[name] = s
			order = append(order, name)
		}
		s.points = append(s.points, point{rate, cpu, late})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	out := make([]*series, 0, len(order))
	for _, n := range order {
		s := by[n]
		sort.Slice(s.points, func(i, j int) bool { return s.points[i].rate < s.points[j].rate })
		out = append(out, s)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no data")
	}
	return out, nil
}

var colors = []string{"#d62728", "#ff9896", "#1f77b4", "#aec7e8", "#2ca02c", "#98df8a",
	"#9467bd", "#c5b0d5", "#ff7f0e", "#ffbb78", "#8c564b", "#c49c94"}

const (
	panelW, panelH                 = 460, 320
	marginL, marginT, marginB, gap = 60, 50, 50, 80
)

func draw(w io.Writer, title string, ss []*series) error {
	minR, maxR := math.Inf(1), 0.0
	maxCPU, maxLate := 1.0, 1.0
	for _, s := range ss {
		for _, p := range s.points {
			minR, maxR = math.Min(minR, p.rate), math.Max(maxR, p.rate)
			maxCPU, maxLate = math.Max(maxCPU, p.cpu), math.Max(maxLate, p.late)
		}
	}
	if maxR <= minR {
		maxR = minR * 10
	}
	width := marginL*2 + panelW*2 + gap
	height := marginT + panelH + marginB + 20*len(ss) + 20
	fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", width, height)
	fmt.Fprintf(w, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(w, `<text x="%d" y="22" font-size="15">%s</text>`+"\n", marginL, esc(title))
	panels := []struct {
		x     int
		label string
		max   float64
		get   func(point) float64
	}{
		{marginL, "rbscope CPU, % of one core", niceMax(maxCPU), func(p point) float64 { return p.cpu }},
		{marginL + panelW + gap, "late or missed ticks, %", niceMax(maxLate), func(p point) float64 { return p.late }},
	}
	lx := func(r float64) float64 { return math.Log10(r/minR) / math.Log10(maxR/minR) }
	for _, pn := range panels {
		x0, y0 := float64(pn.x), float64(marginT)
		fmt.Fprintf(w, `<rect x="%g" y="%g" width="%d" height="%d" fill="none" stroke="#444"/>`+"\n", x0, y0, panelW, panelH)
		fmt.Fprintf(w, `<text x="%g" y="%g">%s</text>`+"\n", x0, y0-8, esc(pn.label))
		for i := 0; i <= 4; i++ {
			v := pn.max * float64(i) / 4
			y := y0 + panelH - float64(panelH)*float64(i)/4
			fmt.Fprintf(w, `<line x1="%g" x2="%g" y1="%g" y2="%g" stroke="#ddd"/>`, x0, x0+panelW, y, y)
			fmt.Fprintf(w, `<text x="%g" y="%g" text-anchor="end">%s</text>`+"\n", x0-5, y+4, trim(v))
		}
		for r := minR; r <= maxR*1.001; r *= 10 {
			for _, m := range []float64{1, 2, 5} {
				rr := r * m
				if rr < minR || rr > maxR*1.001 {
					continue
				}
				x := x0 + lx(rr)*panelW
				fmt.Fprintf(w, `<line x1="%g" x2="%g" y1="%g" y2="%g" stroke="#eee"/>`, x, x, y0, y0+panelH)
				fmt.Fprintf(w, `<text x="%g" y="%g" text-anchor="middle">%s</text>`+"\n", x, y0+panelH+16, hz(rr))
			}
		}
		fmt.Fprintf(w, `<text x="%g" y="%g" text-anchor="middle">sampling rate (log scale)</text>`+"\n", x0+panelW/2, y0+panelH+34)
		for i, s := range ss {
			var pts []string
			for _, p := range s.points {
				v := math.Min(pn.get(p), pn.max)
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", x0+lx(p.rate)*panelW, y0+panelH-v/pn.max*panelH))
			}
			c := colors[i%len(colors)]
			fmt.Fprintf(w, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", c, strings.Join(pts, " "))
			for _, p := range pts {
				xy := strings.Split(p, ",")
				fmt.Fprintf(w, `<circle cx="%s" cy="%s" r="3" fill="%s"/>`, xy[0], xy[1], c)
			}
		}
	}
	for i, s := range ss {
		y := marginT + panelH + marginB + 20*i + 10
		c := colors[i%len(colors)]
		fmt.Fprintf(w, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s" stroke-width="3"/>`, marginL, marginL+30, y, y, c)
		fmt.Fprintf(w, `<text x="%d" y="%d">%s</text>`+"\n", marginL+38, y+4, esc(s.name))
	}
	_, err := fmt.Fprintln(w, "</svg>")
	return err
}

func niceMax(v float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

func trim(v float64) string { return strconv.FormatFloat(v, 'g', 3, 64) }

func hz(r float64) string {
	if r >= 1000 {
		return trim(r/1000) + "k"
	}
	return trim(r)
}

func esc(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}

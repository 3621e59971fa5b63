package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/rbscope/rbscope/internal/alloc"
	"github.com/rbscope/rbscope/internal/target"
)

type allocFlags struct {
	pid          int
	duration     time.Duration
	by           string
	format       string
	output       string
	top          int
	samplePeriod uint32
	dutyCycle    float64
	interval     time.Duration
	silent       bool
	forceSymbols bool
	exact        bool
}

func init() {
	var f allocFlags
	cmd := &cobra.Command{
		Use:   "alloc --pid PID",
		Short: "Count a running Ruby process's allocations by class and file:line (eBPF)",
		Long: `alloc attaches eBPF programs to a running Ruby process's allocation
probes (USDT ruby:object__create, array__create, string__create,
hash__create, symbol__create) and counts, in the kernel, which classes are
allocated and from which file:line. The process is not stopped or changed;
it runs a little slower while rbscope is attached.

While it runs, a live view of the top classes and sites is drawn on
stderr (plain periodic lines when stderr is not a terminal). Ctrl-C, the
end of --duration or the target's exit stops it and writes the report.

Needs root (CAP_SYS_ADMIN). Counts are exact unless --sample-period or
--duty-cycle is given, in which case they are scaled estimates. Each
counted allocation costs the target a few microseconds (a breakpoint
trap); --duty-cycle 0.1 cuts that tenfold, --sample-period does not.

Exit status: 0 when stopped by Ctrl-C/SIGTERM, --duration or the target's
exit (the report covers what was seen); 1 on errors; 2 on bad flags.

Examples:
  rbscope alloc --pid 1234                      until Ctrl-C, memprof-style report
  rbscope alloc --pid 1234 --duration 10s --by class
  rbscope alloc --pid 1234 --format pprof -o alloc.pb.gz
  rbscope alloc --pid 1234 --format json --sample-period 10`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error { return runAlloc(cmd, f) },
	}
	fl := cmd.Flags()
	fl.IntVarP(&f.pid, "pid", "p", 0, "process id of the Ruby process")
	fl.DurationVarP(&f.duration, "duration", "d", 0, "stop after this long (default: until Ctrl-C or the process exits)")
	fl.StringVar(&f.by, "by", "line", "text report grouping: line (count file:line:Class) or class")
	fl.StringVarP(&f.format, "format", "f", "text", "report format: text, json or pprof")
	fl.StringVarP(&f.output, "output", "o", "", "write the report to FILE (default: stdout; pprof: rbscope-alloc-PID-TIME.pb.gz)")
	fl.IntVar(&f.top, "top", 0, "keep only the top N classes and sites in the report (0: all; the live view shows 10)")
	fl.Uint32Var(&f.samplePeriod, "sample-period", 1, "count 1 in N allocations (in the kernel) and scale; estimates")
	fl.Float64Var(&f.dutyCycle, "duty-cycle", alloc.DefaultDutyCycle, "fraction (0-1] of the time the probes count (default mode); counts are scaled by Ruby's own allocation counter")
	fl.BoolVar(&f.exact, "exact", false, "count every allocation (probes attached all the time: allocation-bound code runs 10-20x slower)")
	fl.DurationVar(&f.interval, "interval", time.Second, "live view refresh interval")
	fl.BoolVarP(&f.silent, "silent", "q", false, "no live view")
	fl.BoolVar(&f.forceSymbols, "symbols", false, "use uprobes on allocation functions even if the Ruby has USDT probes (classes only)")
	_ = fl.MarkHidden("symbols")
	rootCmd.AddCommand(cmd)
}

func runAlloc(cmd *cobra.Command, f allocFlags) error {
	if f.pid <= 0 {
		return exitError{2, errors.New("--pid is required")}
	}
	switch f.format {
	case "text", "json", "pprof":
	default:
		return exitError{2, fmt.Errorf("unknown --format %q (want text, json or pprof)", f.format)}
	}
	if f.by != "line" && f.by != "class" {
		return exitError{2, fmt.Errorf("unknown --by %q (want line or class)", f.by)}
	}
	if f.dutyCycle < 0 || f.dutyCycle > 1 {
		return exitError{2, fmt.Errorf("--duty-cycle %v is not between 0 and 1", f.dutyCycle)}
	}
	if f.interval <= 0 {
		f.interval = time.Second
	}
	stderr := cmd.ErrOrStderr()

	// Catch signals before attaching so that Ctrl-C during attach still
	// detaches cleanly.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)

	tr, err := alloc.Attach(f.pid, alloc.Options{
		SamplePeriod: f.samplePeriod,
		DutyCycle:    f.dutyCycle,
		Exact:        f.exact,
		ForceSymbols: f.forceSymbols,
	})
	if err != nil {
		var ex target.ErrProcessExited
		if errors.As(err, &ex) {
			return fmt.Errorf("process %d not found: check the pid", f.pid)
		}
		return fmt.Errorf("attach to process %d: %w", f.pid, err)
	}
	defer tr.Close()
	plan := tr.Plan()
	if !f.silent {
		fmt.Fprintf(stderr, "rbscope alloc: attached to %d sites in %s (%s) of process %d; Ctrl-C to stop\n",
			len(plan.Sites), plan.Binary, plan.Mode, f.pid)
		if plan.Mode == "symbols" {
			fmt.Fprintln(stderr, "rbscope alloc: this Ruby has no USDT probes: counting classes only, no file:line")
		}
	}

	live := newLiveView(stderr, isTerminal(stderr), f.silent)
	var deadline <-chan time.Time
	if f.duration > 0 {
		deadline = time.After(f.duration)
	}
	// Names are read from the target while it lives: refresh them more
	// often than the view so that a process that exits loses little.
	resolve := time.NewTicker(250 * time.Millisecond)
	defer resolve.Stop()
	var last *alloc.Report
	lastDraw := time.Now()
	exited := false
loop:
	for {
		select {
		case <-sigs:
			break loop
		case <-deadline:
			break loop
		case <-resolve.C:
			if !tr.Alive() {
				exited = true
				break loop
			}
			r, err := tr.Snapshot()
			if err != nil {
				if !tr.Alive() {
					exited = true
					break loop
				}
				return fmt.Errorf("read counts: %w", err)
			}
			if time.Since(lastDraw) >= f.interval {
				live.draw(r, last)
				last = r
				lastDraw = time.Now()
			}
		}
	}
	tr.Stop()
	live.finish()
	r, err := tr.Snapshot()
	if err != nil {
		return fmt.Errorf("read counts: %w", err)
	}
	if exited && !f.silent {
		fmt.Fprintf(stderr, "rbscope alloc: process %d exited; report covers %.1fs\n", f.pid, r.Duration.Seconds())
	}
	if r.UnreadableNames > 0 && !f.silent {
		fmt.Fprintf(stderr, "rbscope alloc: %d class or file names could not be read (freed, or the process exited first)\n", r.UnreadableNames)
	}
	return writeAllocReport(cmd, f, r)
}

func writeAllocReport(cmd *cobra.Command, f allocFlags, r *alloc.Report) error {
	out := f.output
	if out == "" && f.format == "pprof" {
		out = fmt.Sprintf("rbscope-alloc-%d-%s.pb.gz", f.pid, time.Now().Format("20060102-150405"))
	}
	var w io.Writer = cmd.OutOrStdout()
	var file *os.File
	if out != "" && out != "-" {
		var err error
		file, err = os.Create(out)
		if err != nil {
			return fmt.Errorf("create report: %w", err)
		}
		defer file.Close()
		w = file
	}
	var err error
	switch f.format {
	case "json":
		err = r.WriteJSON(w, f.top)
	case "pprof":
		err = r.WritePprof(w)
	default:
		err = r.WriteText(w, f.by, f.top)
	}
	if err != nil {
		return err
	}
	if file != nil {
		if err := file.Close(); err != nil {
			return fmt.Errorf("write report: %w", err)
		}
		if abs, err := filepath.Abs(out); err == nil {
			out = abs
		}
		fmt.Fprintf(cmd.ErrOrStderr(), "rbscope alloc: wrote %s\n", out)
	}
	return nil
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// liveView draws the refreshing view: a redrawn block on a terminal, one
// summary line per refresh otherwise.
type liveView struct {
	w      io.Writer
	tty    bool
	silent bool
	lines  int // lines drawn last time (tty)
}

func newLiveView(w io.Writer, tty, silent bool) *liveView {
	return &liveView{w: w, tty: tty, silent: silent}
}

type rated struct {
	name  string
	count uint64
	rate  float64
}

// rates pairs each entry's cumulative count with its rate since prev.
func rates(cur, prev map[string]uint64, dt float64) []rated {
	out := make([]rated, 0, len(cur))
	for k, v := range cur {
		r := rated{name: k, count: v}
		if dt > 0 {
			r.rate = float64(v-min(v, prev[k])) / dt
		}
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].count != out[j].count {
			return out[i].count > out[j].count
		}
		return out[i].name < out[j].name
	})
	return out
}

func classMap(r *alloc.Report) map[string]uint64 {
	m := map[string]uint64{}
	if r == nil {
		return m
	}
	for _, c := range r.ByClass {
		m[c.Class] = c.Count
	}
	return m
}

func siteMap(r *alloc.Report) map[string]uint64 {
	m := map[string]uint64{}
	if r == nil {
		return m
	}
	for _, s := range r.BySite {
		p := s.Path
		if p == "" {
			p = "(unknown)"
		}
		m[fmt.Sprintf("%s:%d:%s", p, s.Line, s.Class)] = s.Count
	}
	return m
}

func (v *liveView) draw(r, prev *alloc.Report) {
	if v.silent {
		return
	}
	dt := r.Duration.Seconds()
	if prev != nil {
		dt = (r.Duration - prev.Duration).Seconds()
	}
	classes := rates(classMap(r), classMap(prev), dt)
	var total, prevTotal uint64
	for _, c := range classes {
		total += c.count
	}
	if prev != nil {
		for _, c := range prev.ByClass {
			prevTotal += c.Count
		}
	}
	totalRate := 0.0
	if dt > 0 {
		totalRate = float64(total-min(total, prevTotal)) / dt
	}
	est := ""
	if r.Estimated {
		est = " (estimated)"
	}
	if !v.tty {
		var top []string
		for i, c := range classes {
			if i == 5 {
				break
			}
			top = append(top, fmt.Sprintf("%s %d", c.name, c.count))
		}
		fmt.Fprintf(v.w, "rbscope alloc: %.0fs %d allocations%s, %.0f/s; top: %s\n",
			r.Duration.Seconds(), total, est, totalRate, strings.Join(top, ", "))
		return
	}
	var b strings.Builder
	if v.lines > 0 {
		fmt.Fprintf(&b, "\x1b[%dA\x1b[J", v.lines)
	}
	fmt.Fprintf(&b, "pid %d  %.0fs  %d allocations%s  %.0f/s   GC mark %v sweep %v\n",
		r.Pid, r.Duration.Seconds(), total, est, totalRate, r.GCMark.Round(time.Millisecond), r.GCSweep.Round(time.Millisecond))
	fmt.Fprintf(&b, "%12s %10s  %s\n", "COUNT", "RATE/s", "CLASS")
	n := 2
	for i, c := range classes {
		if i == 10 {
			break
		}
		fmt.Fprintf(&b, "%12d %10.0f  %s\n", c.count, c.rate, c.name)
		n++
	}
	fmt.Fprintf(&b, "%12s %10s  %s\n", "COUNT", "RATE/s", "FILE:LINE:CLASS")
	n++
	for i, s := range rates(siteMap(r), siteMap(prev), dt) {
		if i == 10 {
			break
		}
		fmt.Fprintf(&b, "%12d %10.0f  %s\n", s.count, s.rate, s.name)
		n++
	}
	v.lines = n
	io.WriteString(v.w, b.String())
}

func (v *liveView) finish() {
	if v.tty && v.lines > 0 && !v.silent {
		fmt.Fprintln(v.w)
	}
}

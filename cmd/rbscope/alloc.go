package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/rbscope/rbscope/internal/alloc"
	"github.com/rbscope/rbscope/internal/output"
	"github.com/rbscope/rbscope/internal/procfs"
	"github.com/rbscope/rbscope/internal/ruby"
	"github.com/rbscope/rbscope/internal/target"
	"github.com/rbscope/rbscope/internal/tui"
	"github.com/rbscope/rbscope/internal/upload"
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
	noStacks     bool
	noSites      bool
	perSite      bool
	retained     bool
	upload       uploadOpts
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

Needs root (CAP_SYS_ADMIN). By default the probes count in short windows
(3 ms of every 100 ms) and the counts are scaled by Ruby's own allocation
counter (GC.stat(:total_allocated_objects), read from the process at
every window): estimates, marked as such, that cost even an allocation-
bound loop only a few percent. --exact counts every allocation; each one
then costs the target about a microsecond (a breakpoint trap), so an
allocation-bound loop runs 10-20 times slower. One in 64 counted
allocations (one in 4096 with --exact) also has its Ruby stack copied:
--format flamegraph, speedscope, collapsed and pprof show where
allocations come from.

--retained reports instead the objects created while rbscope watched and
still alive at the end (memprof's view): count file:line:Class with their
bytes, and by stack (pprof inuse_objects/inuse_space, flame graph). It
tracks each object from its creation (a second probe where the
allocation returns) until a GC finds it unmarked; by default 20% of the
time, scaled like the counts (estimates), every object with --exact.

--upload pushes one allocation profile (alloc_objects, alloc_space) per
--upload-interval to a Pyroscope server while counting, as record
--upload pushes CPU profiles, and the last partial interval at the end.

Exit status: 0 when stopped by Ctrl-C/SIGTERM, --duration or the target's
exit (the report covers what was seen); 1 on errors; 2 on bad flags.

Examples:
  rbscope alloc --pid 1234                      until Ctrl-C, memprof-style report
  rbscope alloc --pid 1234 --duration 10s --by class
  rbscope alloc --pid 1234 --format pprof -o alloc.pb.gz
  rbscope alloc --pid 1234 --format flamegraph -o alloc.html   where allocations come from
  rbscope alloc --pid 1234 --exact --duration 5s      every allocation (slow!)
  rbscope alloc --pid 1234 --retained --duration 60s  objects created and still alive at the end
  rbscope alloc --pid 1234 --duration 60s --upload http://pyroscope:4040`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error { return runAlloc(cmd, f) },
	}
	fl := cmd.Flags()
	fl.IntVarP(&f.pid, "pid", "p", 0, "process id of the Ruby process")
	fl.DurationVarP(&f.duration, "duration", "d", 0, "stop after this long, more than 0 (default: until Ctrl-C or the process exits)")
	fl.StringVar(&f.by, "by", "line", "text report grouping: line (count file:line:Class) or class")
	fl.StringVarP(&f.format, "format", "f", "text", "report format: text, json or pprof")
	fl.StringVarP(&f.output, "output", "o", "", "write the report to FILE (default: stdout; pprof: rbscope-alloc-PID-TIME.pb.gz)")
	fl.IntVar(&f.top, "top", 0, "keep only the top N classes and sites in the report (0: all; the live view shows 10)")
	fl.Uint32Var(&f.samplePeriod, "sample-period", 1, "count 1 in N allocations (in the kernel) and scale; estimates")
	fl.Float64Var(&f.dutyCycle, "duty-cycle", alloc.DefaultDutyCycle, "most of the time (0-1] the probes count (default mode): windows shorten to about 1000 events when allocations come fast; counts are scaled by Ruby's own allocation counter")
	fl.BoolVar(&f.exact, "exact", false, "count every allocation (probes attached all the time: allocation-bound code runs 10-20x slower)")
	fl.DurationVar(&f.interval, "interval", time.Second, "live view refresh interval")
	fl.BoolVarP(&f.silent, "silent", "q", false, "no live view")
	fl.BoolVar(&f.forceSymbols, "symbols", false, "use uprobes on allocation functions even if the Ruby has USDT probes (classes only)")
	_ = fl.MarkHidden("symbols")
	fl.BoolVar(&f.noStacks, "no-stacks", false, "do not copy the Ruby stacks of sampled allocations")
	fl.BoolVar(&f.noSites, "no-sites", false, "count by class only, without each allocation's file:line (the cheapest --exact: Ruby passes the line on its stack, and reading it costs more than the rest of the probe)")
	fl.BoolVar(&f.retained, "retained", false, "report the objects created while attached and still alive at the end (memprof's view), by file:line:Class and by stack, with their bytes; pprof as inuse_objects/inuse_space")
	fl.BoolVar(&f.perSite, "per-site", false, "one perf-event uprobe per probe site instead of one uprobe_multi link (cost comparisons)")
	_ = fl.MarkHidden("per-site")
	f.upload.register(fl)
	rootCmd.AddCommand(cmd)
}

func runAlloc(cmd *cobra.Command, f allocFlags) error {
	if err := f.validate(); err != nil {
		return exitError{2, err}
	}
	if err := checkDuration(cmd, f.duration); err != nil {
		return err
	}
	stderr := cmd.ErrOrStderr()
	if o := f.output; o != "" && !output.StdoutPath(o) {
		// Before counting: what was counted is not lost to a path
		// that cannot be written.
		if err := output.CheckWritable(o); err != nil {
			return fmt.Errorf("output %s is not writable: %w", o, err)
		}
	}
	// Signals are caught before attaching, so that Ctrl-C during the
	// attach still detaches cleanly.
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	cfg := alloc.RunConfig{
		Pid:      f.pid,
		Duration: f.duration,
		Interval: f.interval,
		Options: alloc.Options{
			Exact:        f.exact,
			NoStacks:     f.noStacks,
			NoSites:      f.noSites,
			PerSite:      f.perSite,
			Retained:     f.retained,
			SamplePeriod: f.samplePeriod,
			DutyCycle:    dutyCycle(cmd, f),
			ForceSymbols: f.forceSymbols,
		},
	}
	if !f.silent {
		cfg.Log = stderr
		live := tui.NewBlock(stderr, tui.WriterIsTerminal(stderr))
		defer live.Finish()
		cfg.OnReport = func(r, prev *alloc.Report) {
			v := alloc.Live(r, prev)
			live.Draw(v.Summary(r), v.Lines(r, 10))
		}
	}
	var push *allocPusher
	if f.upload.url != "" {
		argv, _ := procfs.Cmdline(f.pid)
		up, err := f.upload.start(stderr, 0, argv)
		if err != nil {
			return err
		}
		push = &allocPusher{up: up, iv: alloc.NewIntervals(), stderr: stderr}
		if f.retained {
			// What is retained is known at the end: one memory
			// profile (inuse_objects, inuse_space) for the window.
			push.what = "retained-object profiles"
		} else {
			cfg.PushInterval, cfg.OnPush = f.upload.interval, push.push
		}
	}
	r, err := alloc.Run(ctx, cfg)
	// Counting is over: from here on SIGINT and SIGTERM end rbscope the
	// default way (a report waiting for a FIFO's reader, a stuck upload).
	stop()
	if err != nil {
		if push != nil {
			push.up.Close(context.Background())
		}
		if errors.Is(err, target.ErrExited) {
			return fmt.Errorf("process %d not found: check the pid", f.pid)
		}
		if errors.Is(err, ruby.ErrNotRuby) {
			return fmt.Errorf("process %d: %w", f.pid, err) // as snapshot and record say it
		}
		return fmt.Errorf("attach to process %d: %w", f.pid, err)
	}
	werr := writeAllocReport(cmd, f, r)
	if push != nil {
		if f.retained {
			push.pushRetained(r)
		} else {
			push.push(r)
		}
		if err := push.finish(f.upload); err != nil {
			return errors.Join(werr, err)
		}
	}
	return werr
}

// allocPusher pushes one allocation profile (alloc_objects and
// alloc_space, by stack where stacks were sampled) per --upload-interval,
// as record --upload pushes CPU profiles: the growth of the cumulative
// report since the last push.
type allocPusher struct {
	up     *upload.Uploader
	iv     *alloc.Intervals
	stderr io.Writer
	from   time.Time // end of the last pushed interval
	total  uint64    // allocations given to the uploader
	what   string    // what the profiles are ("" allocation profiles)
}

// pushRetained pushes the retained view of r (alloc --retained) as one
// memory profile covering the window.
func (a *allocPusher) pushRetained(r *alloc.Report) {
	now := time.Now()
	var n uint64
	for _, c := range r.ByClass {
		n += c.Count
	}
	p, err := r.Profile()
	if err == nil {
		err = a.up.AddProfile(now.Add(-r.Duration), now, p, int(min(n, math.MaxInt32)))
	}
	if err != nil {
		fmt.Fprintf(a.stderr, "rbscope alloc: upload: dropping the retained profile: %v\n", err)
		return
	}
	a.total += n
}

func (a *allocPusher) push(r *alloc.Report) {
	now := time.Now()
	if a.from.IsZero() {
		a.from = now.Add(-r.Duration)
	}
	d := a.iv.Next(r)
	n := d.Total()
	if n == 0 {
		return // an interval without allocations pushes nothing
	}
	p, err := d.Profile()
	if err == nil {
		err = a.up.AddProfile(a.from, now, p, int(min(n, math.MaxInt32)))
	}
	if err != nil {
		fmt.Fprintf(a.stderr, "rbscope alloc: upload: dropping an interval: %v\n", err)
		return
	}
	a.from = now
	a.total += n
}

// finish pushes what is still queued, for at most --upload-timeout, and
// says what was pushed.
func (a *allocPusher) finish(o uploadOpts) error {
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	err := a.up.Close(ctx)
	st := a.up.Stats()
	what, unit := "allocation profiles", "allocations"
	if a.what != "" {
		what, unit = a.what, "objects"
	}
	fmt.Fprintf(a.stderr, "rbscope alloc: pushed %d %s (%d %s) to %s as %s\n",
		st.Pushed, what, st.PushedSamples, unit, o.url, a.up.SeriesName())
	if err != nil {
		return fmt.Errorf("upload allocation profiles to %s: %w", o.url, err)
	}
	return nil
}

// dutyCycle is --duty-cycle, or retained mode's default when not given.
func dutyCycle(cmd *cobra.Command, f allocFlags) float64 {
	if f.retained && !cmd.Flags().Changed("duty-cycle") {
		return alloc.DefaultRetainedDutyCycle
	}
	return f.dutyCycle
}

func (f *allocFlags) validate() error {
	if f.pid <= 0 {
		return errors.New("--pid is required")
	}
	if !slices.Contains(alloc.Formats, f.format) {
		return fmt.Errorf("unknown --format %q (want %s)", f.format, strings.Join(alloc.Formats, ", "))
	}
	if f.by != "line" && f.by != "class" {
		return fmt.Errorf("unknown --by %q (want line or class)", f.by)
	}
	if f.dutyCycle <= 0 || f.dutyCycle > 1 {
		return fmt.Errorf("--duty-cycle %v is not in (0, 1]", f.dutyCycle)
	}
	if f.exact && f.dutyCycle != alloc.DefaultDutyCycle {
		return errors.New("--exact and --duty-cycle exclude each other")
	}
	if f.retained && f.noSites {
		return errors.New("--retained reports by file:line: it excludes --no-sites")
	}
	return nil
}

func writeAllocReport(cmd *cobra.Command, f allocFlags, r *alloc.Report) error {
	if why := r.NoStacks(f.format); why != "" {
		fmt.Fprintf(cmd.ErrOrStderr(), "rbscope alloc: %s\n", why)
	}
	out := f.output
	if out == "" && f.format == "pprof" {
		out = fmt.Sprintf("rbscope-alloc-%d-%s.pb.gz", f.pid, time.Now().Format("20060102-150405"))
	}
	if out == "" || out == "-" {
		return r.WriteFormat(cmd.OutOrStdout(), f.format, f.by, f.top)
	}
	stderr := cmd.ErrOrStderr()
	wo := output.WriteOptions{Say: func(msg string) { fmt.Fprintf(stderr, "rbscope alloc: %s\n", msg) }}
	file, err := output.WriteFile(out, wo, func(w io.Writer) error { return r.WriteFormat(w, f.format, f.by, f.top) })
	if err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	if file.Path != "" {
		out = file.Path
	}
	if abs, err := filepath.Abs(out); err == nil {
		out = abs
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "rbscope alloc: wrote %s\n", out)
	return nil
}

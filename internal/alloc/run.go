package alloc

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/rbscope/rbscope/internal/output"
	"github.com/rbscope/rbscope/internal/stack"
)

// RunConfig is one `rbscope alloc` session.
type RunConfig struct {
	Pid      int
	Options  Options
	Duration time.Duration // 0: until ctx ends or the process exits
	// Interval is how often OnReport is called (default 1s).
	Interval time.Duration
	// Log receives one-line notices (attached, exited); nil: none.
	Log io.Writer
	// OnReport is called every Interval with the cumulative report and
	// the previous one (nil the first time): the live view.
	OnReport func(r, prev *Report)
	// OnPush is called every PushInterval (default 10s) with the
	// cumulative report, while counting (rbscope alloc --upload cuts it
	// with Intervals; the final report, which Run returns, ends the last
	// interval).
	OnPush       func(r *Report)
	PushInterval time.Duration
	// OnAttach, when set, is called once the probes are attached, before
	// counting begins.
	OnAttach func(plan *Plan)
}

// Run attaches to the process, counts until ctx is done, Duration has
// passed or the process exits, detaches and returns the final report.
func Run(ctx context.Context, cfg RunConfig) (*Report, error) {
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.PushInterval <= 0 {
		cfg.PushInterval = 10 * time.Second
	}
	logf := func(format string, args ...any) {
		if cfg.Log != nil {
			fmt.Fprintf(cfg.Log, "rbscope alloc: "+format+"\n", args...)
		}
	}
	tr, err := Attach(cfg.Pid, cfg.Options)
	if err != nil {
		return nil, err
	}
	defer tr.Close()
	plan := tr.Plan()
	logf("attached to %d sites in %s (%s) of process %d; Ctrl-C to stop", len(plan.Sites), plan.Binary, plan.Mode, cfg.Pid)
	if cfg.OnAttach != nil {
		cfg.OnAttach(plan)
	}
	if plan.Mode == "symbols" {
		logf("this Ruby has no USDT probes: counting classes only, no file:line")
	}
	if cfg.Duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.Duration)
		defer cancel()
	}
	exited, err := tr.follow(ctx, cfg)
	if err != nil {
		return nil, err
	}
	tr.Stop()
	r, err := tr.Snapshot()
	if err != nil {
		return nil, fmt.Errorf("read counts: %w", err)
	}
	if exited {
		logf("process %d exited; report covers %.1fs%s", cfg.Pid, r.Duration.Seconds(), exitNote(r))
	}
	if r.UnreadableNames > 0 {
		logf("%d class or file names could not be read (freed, or the process exited first)", r.UnreadableNames)
	}
	return r, nil
}

// follow reads the counts until ctx ends or the process exits, which it
// looks for every followTick. Names are read from the target while it
// lives, every nameTick and after every counting window: a process that
// exits loses at most the names first counted since.
func (tr *Tracker) follow(ctx context.Context, cfg RunConfig) (exited bool, err error) {
	tick := time.NewTicker(followTick)
	defer tick.Stop()
	var last *Report
	lastDraw, lastPush, lastNames := time.Now(), time.Now(), time.Time{}
	for {
		select {
		case <-ctx.Done():
			return false, nil
		case <-tr.exitWoke():
			return true, nil
		case <-tick.C:
		}
		if tr.Exited() || !tr.Alive() {
			return true, nil
		}
		if time.Since(lastNames) >= nameTick {
			tr.resolveNames()
			lastNames = time.Now()
		}
		draw := cfg.OnReport != nil && time.Since(lastDraw) >= cfg.Interval
		push := cfg.OnPush != nil && time.Since(lastPush) >= cfg.PushInterval
		if !draw && !push {
			continue
		}
		if push {
			// The stacks copied so far, named: an interval pushed while
			// the reader was still opening its walker went without its
			// stacks (half a 2 s job's Widgets stackless in the agent).
			tr.drainStacks(pushDrainTimeout)
		}
		r, err := tr.Snapshot()
		if err != nil {
			if tr.Exited() || !tr.Alive() {
				return true, nil
			}
			return false, fmt.Errorf("read counts: %w", err)
		}
		if draw {
			cfg.OnReport(r, last)
			last, lastDraw = r, time.Now()
		}
		if push {
			cfg.OnPush(r)
			lastPush = lastPush.Add(cfg.PushInterval)
			if time.Since(lastPush) >= cfg.PushInterval {
				lastPush = time.Now() // fell behind: no burst of catch-up pushes
			}
		}
	}
}

// followTick is how often follow looks for the process's exit, nameTick
// how often it reads new names.
const (
	followTick = 50 * time.Millisecond
	nameTick   = 250 * time.Millisecond
)

// exitNote says how the totals of a process that exited were completed.
func exitNote(r *Report) string {
	switch {
	case r.CounterEnd == counterEndExit:
		return "; Ruby's allocation counter was read at its teardown"
	case r.Scaling != "counter":
		return ""
	case !r.ExitProbe:
		return fmt.Sprintf("; %s is not in this Ruby's symbols, so what it allocated after Ruby's counter was last read is missing", exitFunc)
	}
	return "; it ended without Ruby's teardown (exit!, a signal), so what it allocated after Ruby's counter was last read is missing"
}

// NoStacks says why a stack view (flamegraph, speedscope, collapsed) of r
// is empty, or "" when r has stacks to draw or format is not a stack view.
func (r *Report) NoStacks(format string) string {
	switch format {
	case "flamegraph", "speedscope", "collapsed":
	default:
		return ""
	}
	if len(r.Stacks) > 0 {
		return ""
	}
	why := "one counted allocation in 64 has its stack copied, and none was"
	if r.Retained {
		why = "no retained object had its stack copied"
	}
	if r.StackError != "" {
		why = r.StackError
	}
	return fmt.Sprintf("no allocation stack was sampled (%s): the %s is empty; a longer --duration or --exact samples more", why, format)
}

// Formats lists the report formats WriteFormat knows: text, json, pprof
// (alloc_objects and alloc_space by stack, or by site without stacks) and
// the stack views flamegraph, speedscope and collapsed.
var Formats = []string{"text", "json", "pprof", "flamegraph", "speedscope", "collapsed"}

// WriteFormat writes r in format: text (grouped by "line" or "class"),
// json or pprof; top > 0 keeps the top entries.
func (r *Report) WriteFormat(w io.Writer, format, by string, top int) error {
	switch format {
	case "json":
		return r.WriteJSON(w, top)
	case "pprof":
		return r.WritePprof(w)
	case "text", "":
		return r.WriteText(w, by, top)
	case "flamegraph", "speedscope", "collapsed":
		// No stack sampled (a short job in the default mode): an empty
		// view, as the caller says (see NoStacks), never no file.
		samples := r.StackSamplesList()
		i := 0
		_, err := output.Render(format, output.Options{Title: fmt.Sprintf("rbscope alloc: pid %d, %d sampled allocation stacks", r.Pid, len(samples))},
			func() (stack.Sample, error) {
				if i == len(samples) {
					return stack.Sample{}, io.EOF
				}
				i++
				return samples[i-1], nil
			}, w)
		return err
	}
	return fmt.Errorf("unknown format %q", format)
}

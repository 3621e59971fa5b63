package record

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/rbscope/rbscope/internal/output"
	"github.com/rbscope/rbscope/internal/procfs"
	"github.com/rbscope/rbscope/internal/proctree"
	"github.com/rbscope/rbscope/internal/recording"
	"github.com/rbscope/rbscope/internal/ruby"
	"github.com/rbscope/rbscope/internal/sampler"
	"github.com/rbscope/rbscope/internal/stack"
	"github.com/rbscope/rbscope/internal/target"
)

// errChildExited ends a recording whose launched command exited.
var errChildExited = errors.New("command exited")

// rec is one run of a recording.
type rec struct {
	cfg   Config
	con   *console
	sig   *signals
	child *child // launch mode
	pid   int
	// realtime: sampling runs at real-time priority (cfg.Realtime resolved)
	realtime bool
	ctx      context.Context
	cancel   context.CancelCauseFunc

	proc   *ruby.Process // nil when the root is not Ruby (--subprocesses)
	tree   *sampler.TreeSource
	start  time.Time
	raw    *recording.Writer
	rawErr error
	sinks  []Sink
	// cpuWarned: the warning that --mode cpu could not watch some
	// threads was given.
	cpuWarned bool
	// releaseRaw gives up the raw recording's file (see recording.Claim)
	// once the profile is rendered.
	releaseRaw func()
	// placeholder is the default output file reserved when the recording
	// began, removed unless the profile was written to it.
	placeholder string
	rendered    bool
}

// Run records cfg's target until --duration ends, the process exits or a
// stop signal arrives (StopSignals; SIGTSTP suspends the recording
// without leaving the process paused), then writes the profile. The raw
// recording is streamed to disk while sampling. Errors from a bad Config
// are UsageErrors.
func Run(ctx context.Context, cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	r := &rec{cfg: cfg, con: newConsole(cfg.Stderr, cfg.Silent), pid: cfg.Pid, releaseRaw: func() {}}
	defer r.releaseFiles()
	if err := r.checkOutputs(); err != nil {
		return err
	}
	rt, err := cfg.resolveRealtime()
	if err != nil {
		return err
	}
	r.realtime = rt
	r.ctx, r.cancel = context.WithCancelCause(ctx)
	defer r.cancel(nil)
	// Signals are caught before the command starts; they are handled
	// once it has (forward needs it).
	r.sig = watchSignals()
	defer r.sig.close()
	if cfg.Launch() {
		c, err := launch(cfg.Command)
		if err != nil {
			return err
		}
		r.child, r.pid = c, c.pid
	}
	go r.sig.run(r.ctx, func(sig os.Signal) {
		r.child.forward(sig)
		r.cancel(fmt.Errorf("interrupted by %v", sig))
	})
	if err := r.open(); err != nil {
		r.child.kill()
		return err
	}
	st, err := r.sample()
	if err != nil {
		r.child.kill()
		return err
	}
	err = r.finish(st)
	r.child.settle(r.sig.signal(), r.con.say)
	return err
}

// checkOutputs fails before anything starts when an output cannot be
// written.
func (r *rec) checkOutputs() error {
	if o := r.cfg.Output; o != "" {
		if err := output.CheckWritable(o); err != nil {
			return fmt.Errorf("output %s is not writable: %w", o, err)
		}
	} else if err := output.CheckWritable("rbscope-output"); err != nil {
		return fmt.Errorf("cannot write the output to the current directory (give --output FILE): %w", err)
	}
	if raw := r.cfg.Raw; raw != "" {
		if fi, err := os.Stat(raw); err == nil && !fi.Mode().IsRegular() {
			// It is read back to render the profile: a FIFO would
			// block the recording's start, a device lose it.
			what := "not a regular file"
			switch {
			case fi.Mode()&os.ModeNamedPipe != 0:
				what = "a FIFO"
			case fi.Mode()&os.ModeDevice != 0:
				what = "a device"
			case fi.IsDir():
				what = "a directory"
			}
			return fmt.Errorf("raw recording %s is %s: rbscope reads the raw recording back to render "+
				"the profile; give a regular file with --raw", raw, what)
		}
		if err := os.MkdirAll(filepath.Dir(raw), 0o755); err != nil {
			return fmt.Errorf("raw recording %s is not writable: %w", raw, err)
		}
		if err := output.CheckWritable(raw); err != nil {
			return fmt.Errorf("raw recording %s is not writable: %w", raw, err)
		}
		// Another recording writing the same file would mix its
		// samples with these (an older recording is replaced): refused
		// now, and claimed when the recording begins (createRaw).
		if err := recording.CheckFree(raw); err != nil {
			return rawInUse(raw)
		}
	}
	return nil
}

// rawInUse is the error of a recording to a raw file another one writes.
func rawInUse(raw string) error {
	return fmt.Errorf("raw recording %s: %w: give another --raw, or none", raw, recording.ErrInUse)
}

// releaseFiles gives up the raw recording's file, and removes the default
// output's placeholder when no profile was written to it.
func (r *rec) releaseFiles() {
	r.releaseRaw()
	if r.placeholder != "" && !r.rendered {
		if st, err := os.Stat(r.placeholder); err == nil && st.Mode().IsRegular() && st.Size() == 0 {
			os.Remove(r.placeholder)
		}
	}
}

// reserveOutput creates the first of base+ext, base-2+ext, base-3+ext, ...
// that does not exist (O_EXCL), empty, for the profile to replace: two
// recordings of one process started in the same second in one directory
// write two profiles.
func reserveOutput(base, ext string) (string, error) {
	name := base + ext
	for i := 2; ; i++ {
		f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err == nil {
			return name, f.Close()
		}
		if !errors.Is(err, os.ErrExist) || i > 1000 {
			return "", fmt.Errorf("create output %s: %w", name, err)
		}
		name = base + "-" + strconv.Itoa(i) + ext
	}
}

// open finds Ruby in the target. In launch mode it waits up to
// StartTimeout for Ruby to start, and gives up when the command exits.
func (r *rec) open() error {
	timeout := time.Duration(0)
	if r.cfg.Launch() {
		timeout = r.cfg.StartTimeout
	}
	openCtx, openCancel := context.WithCancel(r.ctx)
	go func() {
		select {
		case <-r.child.Done():
			openCancel()
		case <-openCtx.Done():
		}
	}()
	proc, err := ruby.Open(openCtx, ruby.Spec{Pid: r.pid, Wait: timeout, Options: ruby.Options{Version: r.cfg.RubyVersion}})
	openCancel()
	if err == nil {
		r.proc = proc
		return nil
	}
	if r.child.exited() && !r.cfg.Subprocesses {
		r.child.reap()
		return fmt.Errorf("%s exited%s before Ruby could be read: %w", r.cfg.Command[0], r.child.exitNote(), err)
	}
	if !r.cfg.Subprocesses || errors.Is(err, target.ErrExited) || errors.Is(err, target.ErrDenied) {
		if cause := context.Cause(r.ctx); cause != nil && r.ctx.Err() != nil {
			return cause
		}
		if errors.Is(err, ruby.ErrNotRuby) && r.cfg.Launch() {
			return fmt.Errorf("%w (use --subprocesses to record its Ruby children)", err)
		}
		return err
	}
	// --subprocesses: the command itself may be a wrapper (a shell);
	// record the Ruby processes it starts.
	r.con.say("%v; recording its Ruby subprocesses", err)
	return nil
}

// command is the target's command line, for the raw header and the
// uploader's application name.
func (r *rec) command() []string {
	if r.cfg.Launch() {
		return r.cfg.Command
	}
	args, _ := procfs.Cmdline(r.pid)
	return args
}

// sample runs the sampler until the recording ends. It runs on the
// calling goroutine, which also does the pausing.
func (r *rec) sample() (sampler.Stats, error) {
	mode, _ := r.cfg.SampleMode() // checked by Validate
	scfg := sampler.Config{Rate: r.cfg.Rate, Duration: r.cfg.Duration, Mode: mode, Realtime: r.realtime,
		Progress: r.progress, ProgressEvery: 250 * time.Millisecond}
	ro := sampler.RubyOptions{NoGC: r.cfg.NoGC, WatchCPU: scfg.AsksCPU()}
	if !r.cfg.Nonblocking {
		// Run on this goroutine, which also runs the sampler: no thread
		// hand-off per pause (the goroutine is locked to its OS thread
		// from each pause to its resume, and sleeps unlocked).
		pauser := target.NewThreadPauser()
		defer func() {
			if err := pauser.Close(); err != nil {
				r.con.say("warning: %v", err)
			}
		}()
		ro.Pauser = pauser
	}
	r.tree = r.newTree(ro)
	defer r.tree.Close()
	if err := r.createRaw(); err != nil {
		return sampler.Stats{}, err
	}
	r.say()
	go func() { // a launched command that exits ends the recording
		select {
		case <-r.child.Done():
			r.cancel(errChildExited)
		case <-r.ctx.Done():
		}
	}()
	if r.cfg.Sinks != nil {
		sinks, err := r.cfg.Sinks(r.command())
		if err != nil {
			_ = r.raw.Close(recording.Stats{End: time.Now()})
			return sampler.Stats{}, err
		}
		r.sinks = sinks
	}
	st, err := sampler.Run(r.ctx, r.sig.gate.wrap(r.tree), scfg, r.add)
	for _, s := range r.sinks {
		if serr := s.Finish(); serr != nil {
			r.con.say("warning: %v", serr)
		}
	}
	if err != nil {
		_ = r.raw.Close(recording.Stats{End: time.Now()})
		return st, err
	}
	return st, nil
}

// refusedTicks is how many ticks, all refused by the kernel and none
// sampled, end a recording: what refused will not change by itself.
const refusedTicks = 5

// progress shows the sampler's progress, and ends a recording whose every
// tick so far was refused (pauses denied by a seccomp filter, say) at
// once, instead of recording nothing until Ctrl-C; the report's last
// error then names what refused.
func (r *rec) progress(st sampler.Stats) {
	perm := st.Errors[sampler.KindPermission]
	if st.Samples+st.Filtered == 0 && perm >= refusedTicks && perm == st.ErrorCount() {
		r.cancel(fmt.Errorf("stopped: the kernel refused all %d samples so far (the last error says why)", perm))
	}
	r.warnCPU(st)
	r.con.show(st)
}

// warnCPU says, once, that --mode cpu could not tell some threads on a
// CPU from waiting for one.
func (r *rec) warnCPU(st sampler.Stats) {
	if st.CPUError == nil || r.cpuWarned {
		return
	}
	r.cpuWarned = true
	r.con.say("warning: --mode cpu: %v; a thread not watched counts as on a CPU whenever the kernel says it can run (state R), waiting for a CPU included (watching needs root, CAP_PERFMON or kernel.perf_event_paranoid <= 2, and a seccomp profile that allows perf_event_open)", st.CPUError)
}

// newTree is the one source for both modes: it follows the target across
// exec (`bundle exec`), and with --subprocesses also its descendants.
func (r *rec) newTree(ro sampler.RubyOptions) *sampler.TreeSource {
	// A process seen again has exec'd (the root under `bundle exec`, a
	// forked copy of Ruby running system's command). The tree announces
	// an already opened root at once: that one goes unsaid.
	seen := map[int]bool{}
	return sampler.NewTreeSource(r.pid, r.proc, sampler.TreeOptions{
		Ruby: ro, Open: ruby.Options{Version: r.cfg.RubyVersion}, NoChildren: !r.cfg.Subprocesses,
		OnNewProcess: func(p int, rp *ruby.Process) {
			switch {
			case seen[p]:
				r.con.say("process %d exec'd: recording the new program (Ruby %s)", p, rp.Version())
			case p != r.pid:
				r.con.say("recording subprocess %d (Ruby %s)", p, rp.Version())
			}
			seen[p] = true
		},
	})
}

// add feeds one batch of samples to the raw recording and the sinks.
func (r *rec) add(b []stack.Sample) {
	if r.rawErr != nil {
		return
	}
	for i := range b {
		for _, s := range r.sinks {
			s.Add(b[i])
		}
		if err := r.raw.Add(b[i]); err != nil {
			r.rawErr = err
			r.cancel(fmt.Errorf("write raw recording: %w", err))
			return
		}
	}
}

// OnCPUOption is the raw recording's option saying what its samples'
// on-CPU flags mean: OnCPUSwitches (recorded with --mode cpu) or
// OnCPURunState (absent in recordings that predate it).
const (
	OnCPUOption   = "on_cpu_from"
	OnCPUSwitches = "switches"
	OnCPURunState = "run_state"
)

// createRaw starts the raw recording.
func (r *rec) createRaw() error {
	r.start = time.Now()
	if r.cfg.Raw == "" {
		path, release, err := recording.ClaimDefault(r.pid, r.start)
		if err != nil {
			return err
		}
		r.cfg.Raw, r.releaseRaw = path, release
	} else {
		release, err := recording.Claim(r.cfg.Raw)
		if errors.Is(err, recording.ErrInUse) {
			return rawInUse(r.cfg.Raw)
		}
		if err != nil {
			return fmt.Errorf("create raw recording: %w", err)
		}
		r.releaseRaw = release
	}
	// What a sample's on-CPU flag means: in Mode cpu, on a CPU at the
	// tick's deadline by the kernel's context-switch records; otherwise
	// the kernel's run state (R: runnable or running).
	onCPU := OnCPURunState
	if mode, _ := r.cfg.SampleMode(); mode == stack.ModeCPU {
		onCPU = OnCPUSwitches
	}
	hdr := recording.Header{
		RateHz: r.cfg.Rate, Start: r.start, RbscopeVersion: r.cfg.Version, Pids: []int{r.pid}, Command: r.command(),
		Options: map[string]string{
			"blocking":     strconv.FormatBool(!r.cfg.Nonblocking),
			"on_cpu":       strconv.FormatBool(r.cfg.OnCPU || r.cfg.Mode == stack.ModeCPU),
			"mode":         string(r.cfg.Mode),
			"no_gc":        strconv.FormatBool(r.cfg.NoGC),
			OnCPUOption:    onCPU,
			"subprocesses": strconv.FormatBool(r.cfg.Subprocesses),
		},
	}
	if r.proc != nil {
		hdr.RubyVersion, hdr.LayoutSource = r.proc.Version(), r.proc.LayoutSource()
	}
	raw, err := recording.Create(r.cfg.Raw, hdr)
	if err != nil {
		return fmt.Errorf("create raw recording: %w", err)
	}
	r.raw = raw
	if r.cfg.Output == "" {
		out, err := reserveOutput("rbscope-"+r.start.Format("20060102-150405")+"-"+strconv.Itoa(r.pid), output.DefaultExtension(r.cfg.Format))
		if err != nil {
			_ = r.raw.Close(recording.Stats{End: time.Now()})
			return err
		}
		r.cfg.Output, r.placeholder = out, out
	}
	return nil
}

// say announces the recording.
func (r *rec) say() {
	what := fmt.Sprintf("process %d", r.pid)
	if r.cfg.Launch() {
		what = fmt.Sprintf("%s (pid %d)", strings.Join(r.cfg.Command, " "), r.pid)
	}
	mode := "pausing it for each sample"
	if r.cfg.Nonblocking {
		mode = "nonblocking"
	}
	r.con.say("recording %s at %g Hz (%s); raw samples to %s; Ctrl-C to stop", what, r.cfg.Rate, mode, r.cfg.Raw)
}

// chownToSudoUser gives a file rbscope created to the user who ran sudo.
func chownToSudoUser(path string) {
	if cred, err := proctree.SudoCredential(); err == nil && cred != nil {
		_ = os.Chown(path, int(cred.Uid), int(cred.Gid))
	}
}

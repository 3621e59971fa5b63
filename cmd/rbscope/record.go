package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/rbscope/rbscope/internal/output"
	"github.com/rbscope/rbscope/internal/procfs"
	"github.com/rbscope/rbscope/internal/proctree"
	"github.com/rbscope/rbscope/internal/recording"
	"github.com/rbscope/rbscope/internal/ruby"
	"github.com/rbscope/rbscope/internal/sampler"
	"github.com/rbscope/rbscope/internal/stack"
	"github.com/rbscope/rbscope/internal/target"
)

type recordOpts struct {
	pid          int
	rate         float64
	duration     time.Duration
	format       string
	output       string
	raw          string
	subprocesses bool
	nonblocking  bool
	onCPU        bool
	silent       bool
	startTimeout time.Duration
	rubyVersion  string
	up           uploadOpts
}

func init() {
	var o recordOpts
	cmd := &cobra.Command{
		Use:   "record (--pid PID | -- COMMAND [ARGS...])",
		Short: "Sample a Ruby process's stacks for a while and write a profile",
		Long: `Sample every Ruby thread's stack at --rate per second until --duration has
passed, the process exits or you press Ctrl-C, then write a profile.

Samples are streamed to a raw recording as they are taken (its path is
printed; re-render it with 'rbscope report'); at the end the --format
output is written to --output (default rbscope-<time>-<pid>.<ext> in the
current directory).

By default each sample pauses the process (ptrace) for as long as it
takes to read its stacks (tens to hundreds of microseconds), so that
every stack is consistent; the process is always resumed, also on
Ctrl-C, errors and SIGTERM (and the kernel resumes it if rbscope is
killed). --nonblocking reads the running process instead: no pauses,
but a stack that changes while it is read is counted as an error.

Launch mode ('rbscope record -- ruby app.rb') starts the command (as the
invoking user when run with sudo), waits until Ruby has started, and
samples it until it exits. Ctrl-C (SIGINT) or SIGTERM stops the recording
and is passed on to the command (a Ctrl-C typed in the terminal already
reaches it); the profile is written, then rbscope waits up to 5 s for the
command to exit and otherwise leaves it running (it is never left
paused). When --duration ends the recording first, the command goes on
running. A command that execs another Ruby (bundle exec) is followed.

--subprocesses also samples Ruby processes that descend from the target
(fork, system, spawn), found as they appear; non-Ruby ones are skipped.
The recording ends when the first process exits.`,
		Example: `  rbscope record --pid 1234 --duration 30s
  rbscope record --pid 1234 --format speedscope -o profile.json
  rbscope record --subprocesses -- bundle exec rake test`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if dash := cmd.ArgsLenAtDash(); dash > 0 || (dash < 0 && len(args) > 0) {
				return fmt.Errorf("unexpected argument %q: put the command to launch after --", args[0])
			}
			return runRecord(cmd.ErrOrStderr(), o, args)
		},
	}
	f := cmd.Flags()
	f.IntVarP(&o.pid, "pid", "p", 0, "process id of the Ruby process to record")
	f.Float64VarP(&o.rate, "rate", "r", sampler.DefaultRate, "samples per second (up to 10000)")
	f.DurationVarP(&o.duration, "duration", "d", 0, "stop after this long (default: until Ctrl-C or the process exits)")
	f.StringVarP(&o.format, "format", "f", "flamegraph", "output format: "+strings.Join(output.Formats(), ", "))
	f.StringVarP(&o.output, "output", "o", "", "output file ('-' for standard output; default rbscope-<time>-<pid>.<ext>)")
	f.StringVar(&o.raw, "raw", "", "raw recording file (default in the user cache directory)")
	f.BoolVarP(&o.subprocesses, "subprocesses", "s", false, "also record Ruby child processes, including ones started later")
	f.BoolVar(&o.nonblocking, "nonblocking", false, "do not pause the process while reading its stacks")
	f.BoolVar(&o.onCPU, "on-cpu", false, "keep only samples of threads running on a CPU (kernel state R: running or\nwaiting for a CPU; threads that a pause woke up can look runnable for a moment)")
	f.BoolVar(&o.silent, "silent", false, "print no progress or summary")
	f.DurationVar(&o.startTimeout, "start-timeout", 10*time.Second, "launch mode: how long Ruby may take to start")
	f.StringVar(&o.rubyVersion, "ruby-version", "", "Ruby version to assume when it cannot be detected (e.g. 3.1.2)")
	o.up.register(f)
	rootCmd.AddCommand(cmd)
}

// checkWritable fails when path cannot be written, creating nothing.
func checkWritable(path string) error {
	if path == "-" {
		return nil
	}
	dir := filepath.Dir(path)
	if st, err := os.Stat(path); err == nil {
		if st.IsDir() {
			return fmt.Errorf("%s is a directory", path)
		}
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			return err
		}
		f.Close()
	}
	f, err := os.CreateTemp(dir, ".rbscope-check-*")
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			return fmt.Errorf("cannot create files in %s: %w", dir, pe.Err)
		}
		return err
	}
	f.Close()
	return os.Remove(f.Name())
}

// recorder is one run of rbscope record.
type recorder struct {
	o      recordOpts
	stderr io.Writer
	tty    bool

	mu       sync.Mutex
	progress bool // a progress line is on screen
}

func (r *recorder) say(format string, args ...any) {
	if r.o.silent {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.progress {
		fmt.Fprint(r.stderr, "\r\033[K")
		r.progress = false
	}
	fmt.Fprintf(r.stderr, "rbscope: "+format+"\n", args...)
}

func (r *recorder) showProgress(st sampler.Stats) {
	if r.o.silent || !r.tty {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	fmt.Fprintf(r.stderr, "\r\033[K%6.1fs  %d samples  %d errors  %d late",
		st.End.Sub(st.Start).Seconds(), st.Samples, st.ErrorCount(), st.Late+st.Missed)
	r.progress = true
}

func runRecord(stderr io.Writer, o recordOpts, argv []string) error {
	launch := len(argv) > 0
	switch {
	case o.pid != 0 && launch:
		return errors.New("give either --pid or a command after --, not both")
	case o.pid == 0 && !launch:
		return errors.New("nothing to record: give --pid PID or a command after -- (rbscope record -- ruby app.rb)")
	case o.pid < 0:
		return fmt.Errorf("invalid pid %d", o.pid)
	case o.rate <= 0 || o.rate > sampler.MaxRate:
		return fmt.Errorf("--rate %g is outside 0..%d", o.rate, sampler.MaxRate)
	case o.duration < 0:
		return fmt.Errorf("negative --duration %v", o.duration)
	}
	if _, err := output.New(o.format, output.Options{}); err != nil {
		return err
	}
	r := &recorder{o: o, stderr: stderr}
	if f, ok := stderr.(*os.File); ok {
		r.tty = term.IsTerminal(int(f.Fd()))
	}

	// Outputs must be writable before anything starts.
	if o.output != "" {
		if err := checkWritable(o.output); err != nil {
			return fmt.Errorf("output %s is not writable: %w", o.output, err)
		}
	} else if err := checkWritable("rbscope-output"); err != nil {
		return fmt.Errorf("cannot write the output to the current directory (give --output FILE): %w", err)
	}
	if o.raw != "" {
		if err := os.MkdirAll(filepath.Dir(o.raw), 0o755); err != nil {
			return fmt.Errorf("raw recording %s is not writable: %w", o.raw, err)
		}
		if err := checkWritable(o.raw); err != nil {
			return fmt.Errorf("raw recording %s is not writable: %w", o.raw, err)
		}
	}

	// Signals: the first SIGINT/SIGTERM stops sampling (and is passed to a
	// launched command); the process is resumed before rbscope returns.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)

	var child *exec.Cmd
	childDone := make(chan struct{})
	var childErr error
	pid := o.pid
	if launch {
		cmd, err := proctree.Command(argv)
		if err != nil {
			return err
		}
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("start %s: %w", argv[0], err)
		}
		child = cmd
		pid = cmd.Process.Pid
		// The command's exit is noticed by polling its state, not with
		// cmd.Wait: rbscope is also its tracer while pausing it, and a
		// wait from another thread would take the ptrace stops. It is
		// reaped (reap) once no pause can happen any more.
		go func() {
			for {
				st, err := procfs.ReadStat(pid)
				if err != nil || st.State == 'Z' || st.State == 'X' {
					close(childDone)
					return
				}
				time.Sleep(20 * time.Millisecond)
			}
		}()
	}
	var reapOnce sync.Once
	reap := func() {
		if child == nil {
			return
		}
		reapOnce.Do(func() {
			<-childDone
			childErr = child.Wait()
		})
	}
	stopChild := func(sig os.Signal) {
		if child == nil {
			return
		}
		select {
		case <-childDone:
			return
		default:
		}
		if sig == syscall.SIGINT && proctree.InForeground() {
			return // the terminal sent it to the command too
		}
		_ = child.Process.Signal(sig)
	}
	var gotSignal os.Signal
	var sigMu sync.Mutex
	go func() {
		select {
		case sig := <-sigs:
			// A second Ctrl-C kills rbscope the default way (the kernel
			// then resumes a paused target).
			signal.Stop(sigs)
			sigMu.Lock()
			gotSignal = sig
			sigMu.Unlock()
			stopChild(sig)
			cancel(fmt.Errorf("interrupted by %v", sig))
		case <-ctx.Done():
		}
	}()
	// In launch mode, a failure before sampling must not leave the
	// command behind: stop it and reap it.
	abort := func(err error) error {
		if child != nil {
			select {
			case <-childDone:
			default:
				_ = child.Process.Signal(syscall.SIGTERM)
				select {
				case <-childDone:
				case <-time.After(3 * time.Second):
					_ = child.Process.Kill()
					<-childDone
				}
			}
			reap()
		}
		return err
	}

	// Find Ruby in the target.
	ropts := ruby.Options{Version: o.rubyVersion}
	timeout := time.Duration(0)
	if launch {
		timeout = o.startTimeout
	}
	openCtx, openCancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-childDone:
			openCancel()
		case <-openCtx.Done():
		}
	}()
	proc, err := sampler.OpenRuby(openCtx, pid, ropts, timeout)
	openCancel()
	if err != nil {
		select {
		case <-childDone:
			if !o.subprocesses {
				reap()
				return abort(fmt.Errorf("%s exited%s before Ruby could be read: %w", argv[0], exitNote(childErr), err))
			}
		default:
		}
		var perm target.ErrPermission
		if !o.subprocesses || target.IsExited(err) || errors.As(err, &perm) {
			if context.Cause(ctx) != nil && ctx.Err() != nil {
				return abort(context.Cause(ctx))
			}
			if errors.Is(err, ruby.ErrNotRuby) {
				return abort(fmt.Errorf("process %d: %w (use --subprocesses to record its Ruby children)", pid, err))
			}
			return abort(fmt.Errorf("find the Ruby VM in process %d: %w", pid, err))
		}
		// --subprocesses: the command itself may be a wrapper (a shell);
		// record the Ruby processes it starts.
		r.say("process %d is not Ruby (%v); recording its Ruby subprocesses", pid, err)
		proc = nil
	}

	// Source.
	var pauser *target.Pauser
	ro := sampler.RubyOptions{}
	if !o.nonblocking {
		// Bound to this goroutine's OS thread, which also runs the
		// sampler: no thread hand-off per pause.
		pauser = target.NewThreadPauser()
		defer pauser.Close()
		ro.Pauser = pauser
	}
	// One source for both modes: it follows the target across exec
	// (`bundle exec`), and with --subprocesses also its descendants.
	rootOpened := false
	tree := sampler.NewTreeSource(pid, proc, sampler.TreeOptions{
		Ruby: ro, Open: ropts, NoChildren: !o.subprocesses,
		OnNewProcess: func(p int, rp *ruby.Process) {
			switch {
			case p != pid:
				r.say("recording subprocess %d (Ruby %s)", p, rp.Version())
			case rootOpened:
				r.say("process %d exec'd: recording the new program (Ruby %s)", p, rp.Version())
			default:
				rootOpened = true
			}
		},
	})
	defer tree.Close()
	src := sampler.Source(tree)

	// Raw recording.
	start := time.Now()
	rawPath := o.raw
	if rawPath == "" {
		rawPath = recording.DefaultPath(pid, start)
	}
	hdr := recording.Header{
		RateHz: o.rate, Start: start, RbscopeVersion: version, Pids: []int{pid}, Command: argv,
		Options: map[string]string{
			"blocking":     strconv.FormatBool(!o.nonblocking),
			"on_cpu":       strconv.FormatBool(o.onCPU),
			"subprocesses": strconv.FormatBool(o.subprocesses),
		},
	}
	if proc != nil {
		hdr.RubyVersion, hdr.LayoutSource = proc.Version(), proc.LayoutSource()
	}
	if !launch {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil {
			hdr.Command = strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		}
	}
	raw, err := recording.Create(rawPath, hdr)
	if err != nil {
		return abort(fmt.Errorf("create raw recording: %w", err))
	}
	outPath := o.output
	if outPath == "" {
		outPath = "rbscope-" + start.Format("20060102-150405") + "-" + strconv.Itoa(pid) + output.DefaultExtension(o.format)
	}

	what := fmt.Sprintf("process %d", pid)
	if launch {
		what = fmt.Sprintf("%s (pid %d)", strings.Join(argv, " "), pid)
	}
	mode := "pausing it for each sample"
	if o.nonblocking {
		mode = "nonblocking"
	}
	r.say("recording %s at %g Hz (%s); raw samples to %s; Ctrl-C to stop", what, o.rate, mode, rawPath)

	// A launched command that exits ends the recording; a --pid target is
	// noticed by the sampler itself.
	go func() {
		select {
		case <-childDone:
			cancel(errChildExited)
		case <-ctx.Done():
		}
	}()

	// --upload: push each interval to Pyroscope while recording.
	command := argv
	if !launch {
		command = pidCommand(o.pid)
	}
	up, err := o.up.start(stderr, o.rate, command)
	if err != nil {
		_ = raw.Close(recording.Stats{End: time.Now()})
		return abort(err)
	}

	var rawErr error
	cfg := sampler.Config{
		Rate: o.rate, Duration: o.duration, OnCPUOnly: o.onCPU,
		Progress: r.showProgress, ProgressEvery: 250 * time.Millisecond,
	}
	st, err := sampler.Run(ctx, src, cfg, func(b []stack.Sample) {
		if rawErr != nil {
			return
		}
		for i := range b {
			if up != nil {
				up.Add(b[i])
			}
			if err := raw.Add(b[i]); err != nil {
				rawErr = err
				cancel(fmt.Errorf("write raw recording: %w", err))
				return
			}
		}
	})
	if uerr := o.up.finish(stderr, up); uerr != nil {
		r.say("warning: %v", uerr)
	}
	if err != nil {
		_ = raw.Close(recording.Stats{End: time.Now()})
		return abort(err)
	}
	if pauser != nil {
		// Every thread detached before going on.
		if err := pauser.Close(); err != nil {
			r.say("warning: %v", err)
		}
	}
	if child != nil {
		if st.Exited {
			// The sampler saw it exit (a zombie): the poller is about
			// to notice too.
			select {
			case <-childDone:
			case <-time.After(2 * time.Second):
			}
		}
		select {
		case <-childDone:
			reap()
		default:
		}
	}
	cause := context.Cause(ctx)
	sigMu.Lock()
	sig := gotSignal
	sigMu.Unlock()
	exited := st.Exited || errors.Is(cause, errChildExited)

	rst := recording.Stats{Late: int64(st.Late + st.Missed), End: st.End, Errors: map[string]int64{}}
	for k, n := range st.Errors {
		if n > 0 {
			rst.Errors[sampler.ErrorKind(k).String()] = int64(n)
		}
	}
	if err := raw.Close(rst); err != nil && rawErr == nil {
		rawErr = err
	}
	if r.progress {
		r.mu.Lock()
		fmt.Fprint(stderr, "\r\033[K")
		r.progress = false
		r.mu.Unlock()
	}

	// Summary.
	switch {
	case exited && launch:
		r.say("%s exited%s; writing what was sampled", argv[0], exitNote(childErr))
	case exited:
		r.say("process %d exited; writing what was sampled", pid)
	case errors.Is(cause, context.Canceled) || cause == nil:
	case rawErr == nil:
		r.say("%v; writing what was sampled", cause)
	}
	r.say("%d samples of %d threads in %.1fs (%d ticks, %d late, %d missed); errors: %s",
		st.Samples, len(st.Threads), st.End.Sub(st.Start).Seconds(), st.Ticks, st.Late, st.Missed, st.ErrorSummary())
	if cpu, ok := selfCPU(); ok && st.End.After(st.Start) {
		r.say("own CPU use: %.2fs (%.1f%% of one core)", cpu.Seconds(), 100*cpu.Seconds()/st.End.Sub(st.Start).Seconds())
	}
	if st.ErrorCount() > 0 && st.LastError != nil && st.Errors[sampler.ErrOther]+st.Errors[sampler.ErrPermission] > 0 {
		r.say("last error: %v", st.LastError)
	}
	if o.subprocesses {
		if sk := tree.Skipped(); len(sk) > 0 {
			r.say("%d non-Ruby subprocesses skipped", len(sk))
		}
	}
	if rawErr != nil {
		return r.finish(child, childDone, reap, sig, exitError{1, fmt.Errorf("write raw recording %s: %w", rawPath, rawErr)})
	}
	r.say("raw recording: %s", rawPath)

	if st.Samples == 0 {
		return r.finish(child, childDone, reap, sig, exitError{1, fmt.Errorf("no samples were taken (errors: %s); nothing to render", st.ErrorSummary())})
	}
	rd, err := recording.Open(rawPath)
	if err != nil {
		return r.finish(child, childDone, reap, sig, fmt.Errorf("read back raw recording: %w", err))
	}
	defer rd.Close()
	// A torn block (a full disk, say) keeps what was recorded before it.
	n, err := output.RenderFile(o.format, output.Options{RateHz: o.rate, Start: st.Start}, rd.Samples(), outPath)
	if derr := rd.Damage(); derr != nil {
		r.say("warning: raw recording is damaged after %d samples: %v", n, derr)
	}
	if err != nil {
		return r.finish(child, childDone, reap, sig, fmt.Errorf("render %s: %w", o.format, err))
	}
	if outPath != "-" {
		// Under sudo, the profile belongs to the user who asked for it.
		if cred, err := proctree.SudoCredential(); err == nil && cred != nil {
			_ = os.Chown(outPath, int(cred.Uid), int(cred.Gid))
		}
		r.say("wrote %s (%d samples) to %s", o.format, n, outPath)
	}
	return r.finish(child, childDone, reap, sig, nil)
}

var errChildExited = errors.New("command exited")

func exitNote(err error) string {
	if err == nil {
		return " with status 0"
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return " (" + ee.ProcessState.String() + ")"
	}
	if errors.Is(err, syscall.ECHILD) {
		return "" // reaped while it was being paused: status unknown
	}
	return " (" + err.Error() + ")"
}

// finish waits a little for a launched command that was told to stop,
// and says so when it leaves it running.
func (r *recorder) finish(child *exec.Cmd, done chan struct{}, reap func(), sig os.Signal, err error) error {
	if child == nil {
		return err
	}
	select {
	case <-done:
		reap()
		return err
	default:
	}
	if sig == nil {
		// Stopped by --duration: the command goes on.
		r.say("%s (pid %d) is still running; rbscope leaves it running", child.Path, child.Process.Pid)
		return err
	}
	select {
	case <-done:
		reap()
	case <-time.After(5 * time.Second):
		r.say("%s (pid %d) did not exit after %v; rbscope leaves it running", child.Path, child.Process.Pid, sig)
	}
	return err
}

// selfCPU is rbscope's own CPU time (user+system) so far.
func selfCPU() (time.Duration, bool) {
	st, err := procfs.ReadStat(os.Getpid())
	if err != nil {
		return 0, false
	}
	// Clock ticks are 1/100 s on Linux (USER_HZ).
	return time.Duration(st.UTime+st.STime) * 10 * time.Millisecond, true
}

// pidCommand returns the command line of process pid, for naming its
// profiles; nil when it cannot be read.
func pidCommand(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || len(b) == 0 {
		return nil
	}
	return strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
}

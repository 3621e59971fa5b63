package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/rbscope/rbscope/internal/ruby"
	"github.com/rbscope/rbscope/internal/sampler"
	"github.com/rbscope/rbscope/internal/stack"
	"github.com/rbscope/rbscope/internal/target"
	"github.com/rbscope/rbscope/internal/tui"
)

type snapshotOpts struct {
	targetFlags
	core      string
	exe       string
	format    string
	noSymbols bool
	stderr    io.Writer // progress of a long decompression
}

func init() {
	var o snapshotOpts
	cmd := &cobra.Command{
		Use:   "snapshot (--pid PID | --core FILE [--exe PATH])",
		Short: "Print every Ruby thread's stack, now",
		Long: `Print the stack of every Ruby thread of a running process (or of a core
file), innermost frame first, like py-spy dump.

The process is not paused or changed: rbscope reads its memory
(process_vm_readv), which needs CAP_SYS_PTRACE (root, or
--cap-add=SYS_PTRACE in a container). A busy thread's stack may change
while it is read: such a read is retried (for up to about a second), as
record retries it. A stack still unread is never hidden: the thread shows
why ("error" in JSON), and the exit status says so.

Thread names: Thread#name; for a thread without one, the file:line of
the block it started with (the name Ruby gives its native thread, in
full); else the kernel's name of the native thread, marked as such (the
kernel keeps 15 bytes of a name). "status" is Thread#status's word (run,
sleep, aborting, dead); "kernel" the kernel's state of the native thread.

Exit status: 0 when every stack was read; 3 when the stacks were printed
but at least one thread's could not be read whole; 1 on other errors
(nothing printed); 2 for usage errors.`,
		Example: `  rbscope snapshot --pid 1234
  rbscope snapshot --pid 1234 --format json
  rbscope snapshot --core core.1234 --exe /usr/bin/ruby`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.stderr = cmd.ErrOrStderr()
			return runSnapshot(cmd.OutOrStdout(), o)
		},
	}
	o.register(cmd.Flags())
	rootCmd.AddCommand(cmd)
}

// register adds the flags that name a target and how to read it, shared
// by snapshot and inspect.
func (o *snapshotOpts) register(f *pflag.FlagSet) {
	o.targetFlags.register(f, 0)
	f.StringVar(&o.core, "core", "", "core file to read instead of a live process (plain or compressed)")
	f.StringVar(&o.exe, "exe", "", "with --core: the ruby executable that produced the core")
	f.StringVar(&o.format, "format", "text", "output format: text or json")
	f.BoolVar(&o.noSymbols, "no-symbols", false, "ignore symbol tables and find the VM by scanning memory")
}

// check validates the flags: a live process or a core file, and a format.
func (o *snapshotOpts) check() error {
	switch {
	case o.Pid != 0 && o.core != "":
		return usage("give either --pid or --core, not both")
	case o.Pid == 0 && o.core == "":
		return usage("no target: give --pid PID or --core FILE")
	case o.exe != "" && o.core == "":
		return usage("--exe goes with --core")
	case o.Pid < 0:
		return usage("invalid pid %d", o.Pid)
	}
	return checkFormat(o.format, "text", "json")
}

// open opens the live process or core file the flags name, and Ruby in it
// (ruby.Open: a read that races with the running process is tried again).
func (o *snapshotOpts) open() (target.Target, *ruby.Process, error) {
	if err := o.check(); err != nil {
		return nil, nil, err
	}
	opts := ruby.Options{Version: o.RubyVersion, NoSymbols: o.noSymbols}
	if o.Pid != 0 {
		p, err := ruby.Open(context.Background(), ruby.Spec{Pid: o.Pid, Options: opts})
		if err != nil {
			return nil, nil, err
		}
		return p.Target(), p, nil
	}
	t, err := target.OpenCore(o.core, coreOptions(o.exe, o.stderr))
	if err != nil {
		return nil, nil, fmt.Errorf("open core file %s: %w", o.core, err)
	}
	p, err := ruby.Open(context.Background(), ruby.Spec{Target: t, Consistency: ruby.Stopped, Options: opts})
	if err != nil {
		t.Close()
		return nil, nil, err
	}
	return t, p, nil
}

// snapshotJSON is the machine contract of DESIGN.md.
type snapshotJSON struct {
	Pid          int            `json:"pid"`
	RubyVersion  string         `json:"ruby_version"`
	LayoutSource string         `json:"layout_source"`
	Threads      []stack.Thread `json:"threads"`
}

// exitUnread is snapshot's exit status when it printed the stacks but
// could not read some thread's stack (whole).
const exitUnread = 3

func runSnapshot(w io.Writer, o snapshotOpts) error {
	t, p, err := o.open()
	if err != nil {
		return err
	}
	defer t.Close()
	var threads []stack.Thread
	if o.Pid != 0 {
		// A busy thread's stack may change while it is read: the
		// snapshot is taken again, as record retries such reads.
		threads, err = sampler.Snapshot(context.Background(), p)
	} else {
		threads, err = p.Snapshot()
	}
	var unread *sampler.ThreadErrors
	if errors.As(err, &unread) {
		err = nil // the threads say which, and why
	}
	if err != nil {
		return fmt.Errorf("read stacks of process %d: %w", t.Pid(), err)
	}
	kernelStates(t, threads)
	for i := range threads {
		if threads[i].Frames == nil {
			threads[i].Frames = []stack.Frame{}
		}
	}
	if o.format == "json" {
		err = writeJSON(w, snapshotJSON{Pid: t.Pid(), RubyVersion: p.Version(), LayoutSource: p.LayoutSource(), Threads: threads})
	} else {
		fmt.Fprintf(w, "Process %d: %s\nRuby %s (layout %s)\n", t.Pid(), t.Executable(), p.Version(), p.LayoutSource())
		for _, th := range threads {
			writeThread(w, th)
		}
	}
	if err != nil {
		return err
	}
	return unreadError(threads)
}

// unreadError is the error (exit status exitUnread) of a snapshot that
// could not read every thread's stack whole, nil when it read them all.
func unreadError(threads []stack.Thread) error {
	var bad []stack.Thread
	for _, th := range threads {
		if th.Error != "" {
			bad = append(bad, th)
		}
	}
	if len(bad) == 0 {
		return nil
	}
	th := bad[0]
	what := fmt.Sprintf("thread %s %q", stack.TIDText(th.TID), th.DisplayName())
	if len(bad) > 1 {
		what = fmt.Sprintf("%d of %d threads, first %s", len(bad), len(threads), what)
	}
	return exitError{code: exitUnread, err: fmt.Errorf("stacks printed, but not whole: %s: %s", what, th.Error)}
}

// writeThread prints one thread's stack as text.
func writeThread(w io.Writer, th stack.Thread) {
	var tags []string
	tid := strconv.Itoa(th.TID)
	if th.TID == 0 {
		// A Ruby thread under M:N threads waiting for a native thread.
		tid = "-"
		tags = append(tags, "no native thread")
	}
	if th.Main {
		tags = append(tags, "main")
	}
	if th.GVL {
		tags = append(tags, "has GVL")
	}
	tags = append(tags, "status "+th.State)
	if th.Activity != "" {
		tags = append(tags, "activity "+string(th.Activity))
	}
	if th.KernelState != "" {
		tags = append(tags, "kernel "+th.KernelState)
	}
	fmt.Fprintf(w, "\nThread %s %q%s (%s)\n", tid, th.Name, nameNote(th), strings.Join(tags, ", "))
	if len(th.Frames) == 0 && th.Error == "" {
		fmt.Fprintln(w, "    (no Ruby frames)")
	}
	for _, f := range th.Frames {
		if f.IsPseudo() {
			fmt.Fprintf(w, "    %s\n", f.Name)
			continue
		}
		loc := f.Path
		if f.Line > 0 {
			loc = fmt.Sprintf("%s:%d", f.Path, f.Line)
		}
		if loc == "" {
			loc = "(unknown)"
		}
		fmt.Fprintf(w, "    %s (%s)\n", f.Name, loc)
	}
	switch {
	case th.Error != "" && len(th.Frames) == 0:
		fmt.Fprintf(w, "    (stack not read: %s)\n", th.Error)
	case th.Error != "":
		fmt.Fprintf(w, "    (stack cut short: %s)\n", th.Error)
	}
}

// nameNote says where a thread's name comes from when it is not
// Thread#name.
func nameNote(th stack.Thread) string {
	switch {
	case th.NameSource == stack.NameStart:
		return " [no Thread#name: the file:line it started at]"
	case th.NameMayBeCut():
		return fmt.Sprintf(" [kernel's name, cut to %d bytes if longer]", stack.KernelNameMax)
	case th.NameSource == stack.NameKernel:
		return " [kernel's name]"
	}
	return ""
}

// kernelStates sets each thread's kernel state, and completes the
// activities Ruby's state could not tell from it (see
// ruby.KernelActivity).
func kernelStates(t target.Target, threads []stack.Thread) {
	osThreads, err := t.Threads()
	if err != nil {
		return
	}
	states := make(map[int]byte, len(osThreads))
	for _, ot := range osThreads {
		states[ot.TID] = ot.State
	}
	for i := range threads {
		st := states[threads[i].TID]
		if st != 0 {
			threads[i].KernelState = string(st)
		}
		ruby.KernelActivity(&threads[i], st)
	}
}

// coreOptions are the options of a core opened for a person: a
// compressed core's decompression, when it takes a while, shows its
// progress on stderr (one line redrawn on a terminal, a line every few
// seconds elsewhere).
func coreOptions(exe string, stderr io.Writer) target.CoreOptions {
	opts := target.CoreOptions{Exe: exe}
	if stderr == nil {
		return opts
	}
	tty := tui.WriterIsTerminal(stderr)
	line := tui.NewBlock(stderr, tty)
	opts.ProgressEvery = 5 * time.Second
	if tty {
		opts.ProgressEvery = time.Second
	}
	opts.Progress = func(p target.DecompressProgress) {
		s := "rbscope: " + p.String()
		line.Draw(s, []string{s})
	}
	return opts
}

package main

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/rbscope/rbscope/internal/record"
	"github.com/rbscope/rbscope/internal/ruby"
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
--cap-add=SYS_PTRACE in a container).`,
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

// open opens the live process or core file the flags name, and Ruby in it.
func (o *snapshotOpts) open() (target.Target, *ruby.Process, error) {
	if err := o.check(); err != nil {
		return nil, nil, err
	}
	var t target.Target
	var err error
	if o.Pid != 0 {
		if t, err = target.OpenLive(o.Pid); err != nil {
			return nil, nil, fmt.Errorf("open process %d: %w", o.Pid, err)
		}
	} else if t, err = target.OpenCore(o.core, coreOptions(o.exe, o.stderr)); err != nil {
		return nil, nil, fmt.Errorf("open core file %s: %w", o.core, err)
	}
	p, err := ruby.Open(t, ruby.Options{Version: o.RubyVersion, NoSymbols: o.noSymbols})
	if err != nil {
		t.Close()
		if errors.Is(err, ruby.ErrNotRuby) {
			return nil, nil, fmt.Errorf("process %d (%s): %w", t.Pid(), t.Executable(), err)
		}
		return nil, nil, record.OpenError(t.Pid(), err)
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

func runSnapshot(w io.Writer, o snapshotOpts) error {
	t, p, err := o.open()
	if err != nil {
		return err
	}
	defer t.Close()
	threads, err := p.Snapshot()
	if err != nil {
		return fmt.Errorf("read stacks of process %d: %w", t.Pid(), err)
	}
	completeActivities(t, threads)
	for i := range threads {
		if threads[i].Frames == nil {
			threads[i].Frames = []stack.Frame{}
		}
	}
	if o.format == "json" {
		return writeJSON(w, snapshotJSON{Pid: t.Pid(), RubyVersion: p.Version(), LayoutSource: p.LayoutSource(), Threads: threads})
	}
	fmt.Fprintf(w, "Process %d: %s\nRuby %s (layout %s)\n", t.Pid(), t.Executable(), p.Version(), p.LayoutSource())
	for _, th := range threads {
		writeThread(w, th)
	}
	return nil
}

// writeThread prints one thread's stack as text.
func writeThread(w io.Writer, th stack.Thread) {
	var tags []string
	if th.Main {
		tags = append(tags, "main")
	}
	if th.GVL {
		tags = append(tags, "has GVL")
	}
	tags = append(tags, th.State)
	if th.Activity != "" {
		tags = append(tags, "activity "+th.Activity)
	}
	fmt.Fprintf(w, "\nThread %d %q (%s)\n", th.TID, th.Name, strings.Join(tags, ", "))
	if len(th.Frames) == 0 {
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
}

// completeActivities asks the kernel about the threads whose activity
// Ruby's state could not tell (see ruby.KernelActivity).
func completeActivities(t target.Target, threads []stack.Thread) {
	need := false
	for i := range threads {
		if threads[i].Activity == stack.ActivityUnknown {
			need = true
		}
	}
	if !need {
		return
	}
	osThreads, err := t.Threads()
	if err != nil {
		return
	}
	states := make(map[int]byte, len(osThreads))
	for _, ot := range osThreads {
		states[ot.TID] = ot.State
	}
	for i := range threads {
		ruby.KernelActivity(&threads[i], states[threads[i].TID])
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

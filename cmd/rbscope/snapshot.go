package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/rbscope/rbscope/internal/ruby"
	"github.com/rbscope/rbscope/internal/stack"
	"github.com/rbscope/rbscope/internal/target"
)

type snapshotOpts struct {
	pid         int
	core        string
	exe         string
	format      string
	rubyVersion string
	noSymbols   bool
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
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runSnapshot(cmd.OutOrStdout(), o)
		},
	}
	o.register(cmd.Flags())
	rootCmd.AddCommand(cmd)
}

// register adds the flags that name a target and how to read it, shared
// by snapshot and inspect.
func (o *snapshotOpts) register(f *pflag.FlagSet) {
	f.IntVarP(&o.pid, "pid", "p", 0, "process id of the Ruby process")
	f.StringVar(&o.core, "core", "", "core file to read instead of a live process (plain or compressed)")
	f.StringVar(&o.exe, "exe", "", "with --core: the ruby executable that produced the core")
	f.StringVar(&o.format, "format", "text", "output format: text or json")
	f.StringVar(&o.rubyVersion, "ruby-version", "", "Ruby version to assume when it cannot be detected (e.g. 3.1.2)")
	f.BoolVar(&o.noSymbols, "no-symbols", false, "ignore symbol tables and find the VM by scanning memory")
}

// openTarget opens the live process or core file the flags name.
func openTarget(pid int, core, exe string) (target.Target, error) {
	switch {
	case pid != 0 && core != "":
		return nil, errors.New("give either --pid or --core, not both")
	case pid != 0:
		t, err := target.OpenLive(pid)
		if err != nil {
			return nil, fmt.Errorf("open process %d: %w", pid, err)
		}
		return t, nil
	case core != "":
		t, err := target.OpenCore(core, target.CoreOptions{Exe: exe})
		if err != nil {
			return nil, fmt.Errorf("open core file %s: %w", core, err)
		}
		return t, nil
	}
	return nil, errors.New("no target: give --pid PID or --core FILE")
}

func openRuby(t target.Target, version string, noSymbols bool) (*ruby.Process, error) {
	p, err := ruby.Open(t, ruby.Options{Version: version, NoSymbols: noSymbols})
	if err != nil {
		if errors.Is(err, ruby.ErrNotRuby) {
			return nil, fmt.Errorf("process %d (%s): %w", t.Pid(), t.Executable(), err)
		}
		return nil, fmt.Errorf("find the Ruby VM in process %d: %w", t.Pid(), err)
	}
	return p, nil
}

// snapshotJSON is the machine contract of DESIGN.md.
type snapshotJSON struct {
	Pid          int            `json:"pid"`
	RubyVersion  string         `json:"ruby_version"`
	LayoutSource string         `json:"layout_source"`
	Threads      []stack.Thread `json:"threads"`
}

func runSnapshot(w io.Writer, o snapshotOpts) error {
	if o.format != "text" && o.format != "json" {
		return fmt.Errorf("unknown format %q: use text or json", o.format)
	}
	t, err := openTarget(o.pid, o.core, o.exe)
	if err != nil {
		return err
	}
	defer t.Close()
	p, err := openRuby(t, o.rubyVersion, o.noSymbols)
	if err != nil {
		return err
	}
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
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(snapshotJSON{Pid: t.Pid(), RubyVersion: p.Version(), LayoutSource: p.LayoutSource(), Threads: threads})
	}
	fmt.Fprintf(w, "Process %d: %s\nRuby %s (layout %s)\n", t.Pid(), t.Executable(), p.Version(), p.LayoutSource())
	for _, th := range threads {
		var tags []string
		if th.Main {
			tags = append(tags, "main")
		}
		if th.GVL {
			tags = append(tags, "has GVL")
		}
		tags = append(tags, th.State, "activity "+th.Activity)
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
	return nil
}

var _ = os.Stdout

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

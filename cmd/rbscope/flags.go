package main

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/rbscope/rbscope/internal/record"
	"github.com/rbscope/rbscope/internal/sampler"
	"github.com/rbscope/rbscope/internal/stack"
)

// Which of the shared target flags a command takes, beyond --pid and
// --ruby-version.
const (
	withSampling = 1 << iota // --rate, --nonblocking
	withLaunch               // --subprocesses, --start-timeout (and -- CMD)
)

// targetFlags are the flags that name the process to work on, the same
// for every command (py-spy's shared config): --pid, --ruby-version,
// and as the command needs --rate, --nonblocking, --subprocesses,
// --start-timeout.
type targetFlags struct {
	record.Target
}

// register adds the flags to f.
func (t *targetFlags) register(f *pflag.FlagSet, what int) {
	t.Rate = sampler.DefaultRate
	f.IntVarP(&t.Pid, "pid", "p", 0, "process id of the Ruby process")
	f.StringVar(&t.RubyVersion, "ruby-version", "", "Ruby version to assume when it cannot be detected (e.g. 3.1.2)")
	if what&withSampling != 0 {
		f.Float64VarP(&t.Rate, "rate", "r", sampler.DefaultRate, fmt.Sprintf("samples per second (up to %d)", sampler.MaxRate))
		f.BoolVar(&t.Nonblocking, "nonblocking", false, "do not pause the process while reading its stacks")
		f.Var(&t.Realtime, "realtime", "sample at real-time priority (SCHED_FIFO 1; root or CAP_SYS_NICE): true (or\n"+
			"--realtime alone) always, refused where it may not; auto: wherever rbscope may, at\n"+
			"rates up to "+strconv.Itoa(record.AutoRealtimeMaxRate)+" Hz; false (the default) never. On a machine busier than its\n"+
			"cores an ordinary sampler waits for the target's next system call, and its samples\n"+
			"pile up there: use --realtime there")
		f.Lookup("realtime").NoOptDefVal = "true"
	}
	if what&withLaunch != 0 {
		f.BoolVarP(&t.Subprocesses, "subprocesses", "s", false, "also record Ruby child processes, including ones started later")
		f.DurationVar(&t.StartTimeout, "start-timeout", 10*time.Second, "launch mode: how long Ruby may take to start")
	}
}

// checkDuration refuses a --duration given as 0 or less: left out, a
// command runs until Ctrl-C or the process exits; given, it must be a
// length of time (a "0s" that meant no limit surprised).
func checkDuration(cmd *cobra.Command, d time.Duration) error {
	if cmd.Flags().Changed("duration") && d <= 0 {
		return usage("--duration %v: give a positive duration (e.g. 30s), or leave --duration out "+
			"to run until Ctrl-C or the process exits", d)
	}
	return nil
}

// registerMode adds --mode (wall, cpu or gvl: which samples to keep),
// the same for record and top, to f.
func registerMode(f *pflag.FlagSet, m *stack.Mode) {
	f.Var(modeFlag{m}, "mode", "which samples to keep: wall (every thread, always), cpu (threads on a CPU by\n"+
		"the kernel's context switches, running Ruby or C code or GC; not waiting for\n"+
		"a CPU or the GVL), gvl (the GVL's owner only, on a CPU or not)")
}

// modeFlag is --mode: wall, cpu or gvl.
type modeFlag struct{ m *stack.Mode }

func (f modeFlag) String() string {
	if f.m == nil || *f.m == "" {
		return string(stack.ModeWall)
	}
	return string(*f.m)
}

func (f modeFlag) Set(s string) error {
	m, err := stack.ParseMode(s)
	if err != nil {
		return err
	}
	*f.m = m
	return nil
}

func (f modeFlag) Type() string { return "mode" }

// usage is a usage error (exit status 2).
func usage(format string, args ...any) error { return record.Usagef(format, args...) }

// usageArgs makes an argument validator's errors usage errors.
func usageArgs(v cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := v(cmd, args); err != nil {
			return record.UsageError{Err: err}
		}
		return nil
	}
}

// launchArgs returns the command after --, refusing arguments before it.
func launchArgs(cmd *cobra.Command, args []string) ([]string, error) {
	if dash := cmd.ArgsLenAtDash(); dash > 0 || (dash < 0 && len(args) > 0) {
		return nil, usage("unexpected argument %q: put the command to launch after --", args[0])
	}
	return args, nil
}

// checkFormat accepts format when it is one of choices.
func checkFormat(format string, choices ...string) error {
	if !slices.Contains(choices, format) {
		return usage("unknown format %q: use %s", format, strings.Join(choices, " or "))
	}
	return nil
}

// writeJSON writes v as indented JSON.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

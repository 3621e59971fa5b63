package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/rbscope/rbscope/internal/postmortem"
)

type coreHandlerOpts struct {
	dir         string
	maxCoreSize int64
	keepCore    bool
	keep        int
	minFree     int64
	chain       string
	timeout     time.Duration
}

const coreHandlerLong = `Save every Ruby thread's stack when a Ruby process dies from a signal.

The kernel pipes the core of a crashing process to the program named in
/proc/sys/kernel/core_pattern. Install rbscope there (as root):

  rbscope core-handler install --dir /var/lib/rbscope/crashes

which sets core_pattern to (with rbscope's absolute path):

  |/usr/local/bin/rbscope core-handler --dir /var/lib/rbscope/crashes %P %i %s %t %e

For each crash of a Ruby process the handler writes DIR/<ID>.json and
DIR/<ID>.txt: every Ruby thread's stack, the signal, time, executable,
command line and mappings (list them with 'rbscope crashes --dir DIR').
Other processes leave one line in DIR/handler.log, or go to the handler
core_pattern named before (systemd-coredump, apport), which install
keeps in DIR/chain. Every outcome and error is logged to DIR/handler.log.

Good to know:
  - Ruby catches SIGSEGV, prints its own crash report and aborts: the
    report of a segfaulting Ruby process says SIGABRT (6).
  - With a pipe, RLIMIT_CORE (ulimit -c) 0 does not stop the dump (Linux
    6.x, observed): every crashing process reaches the handler. Only a
    limit of 1 does (the kernel reserves it to stop recursive dumps).
  - The handler reads the binaries through /proc/PID/root while the kernel
    is still writing the core; it keeps that directory open, so the
    stacks are read even after the process is gone. Setting
    /proc/sys/kernel/core_pipe_limit above 0 makes the kernel also keep
    /proc/PID until the handler exits; 0 (the default) is enough here.
  - The whole run is bounded (--timeout), the saved core is capped
    (--max-core-size; a longer core is truncated and the report says so)
    and nothing is written that takes the file system below --min-free.
  - The core_pattern line must fit in 127 bytes: install rbscope at a
    short path and use a short --dir.`

func init() {
	var o coreHandlerOpts
	cmd := &cobra.Command{
		Use:   "core-handler --dir DIR %P %i %s %t %e",
		Short: "Kernel core_pattern handler: Ruby stacks of crashed processes",
		Long:  coreHandlerLong,
		Example: `  rbscope core-handler install --dir /var/lib/rbscope/crashes --keep 20
  rbscope crashes --dir /var/lib/rbscope/crashes
  rbscope core-handler uninstall --dir /var/lib/rbscope/crashes`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usage("the kernel runs the handler with the core_pattern specifiers %%P %%i %%s %%t %%e: " +
					"set it up with 'rbscope core-handler install --dir DIR'")
			}
			return runCoreHandler(o, args)
		},
	}
	f := cmd.PersistentFlags()
	f.StringVar(&o.dir, "dir", "", "report directory (absolute path)")
	f.Int64Var(&o.maxCoreSize, "max-core-size", postmortem.DefaultMaxCoreSize, "bytes of core to save and read at most")
	f.BoolVar(&o.keepCore, "keep-core", false, "keep the core, gzip-compressed, beside the report")
	f.IntVar(&o.keep, "keep", postmortem.DefaultKeep, "reports to keep (the newest)")
	f.Int64Var(&o.minFree, "min-free", postmortem.DefaultMinFree, "bytes to leave free on the report directory's file system")
	f.DurationVar(&o.timeout, "timeout", postmortem.DefaultTimeout, "bound on the whole handling of one crash")
	cmd.Flags().StringVar(&o.chain, "chain", "", "core_pattern pipe for non-Ruby cores ('|/usr/lib/systemd/systemd-coredump %P %u %g %s %t %c %h'); default: DIR/chain")

	var chain string
	install := &cobra.Command{
		Use:   "install --dir DIR [--keep N] [--max-core-size BYTES] [--keep-core] [--min-free BYTES]",
		Short: "Point the kernel's core_pattern at this rbscope (root)",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runCoreHandlerInstall(cmd, o, chain)
		},
	}
	install.Flags().StringVar(&chain, "chain", "", "pipe for non-Ruby cores; default: the previous core_pattern if it is a pipe; 'none' for none")
	uninstall := &cobra.Command{
		Use:   "uninstall --dir DIR",
		Short: "Restore the core_pattern saved by install (root)",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := needRoot("uninstall"); err != nil {
				return err
			}
			if err := needDir(o.dir); err != nil {
				return err
			}
			prev, err := postmortem.Uninstall(o.dir, "")
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "core_pattern restored to %q\n", prev)
			return nil
		},
	}
	cmd.AddCommand(install, uninstall)
	rootCmd.AddCommand(cmd)
}

func needRoot(what string) error {
	if os.Geteuid() != 0 {
		return exitError{1, fmt.Errorf("core-handler %s changes /proc/sys/kernel/core_pattern, which needs root: run it with sudo", what)}
	}
	return nil
}

func needDir(dir string) error {
	if dir == "" {
		return usage("give the report directory with --dir")
	}
	if !filepath.IsAbs(dir) {
		return usage("--dir %q must be an absolute path (the kernel runs the handler in /)", dir)
	}
	return nil
}

func runCoreHandlerInstall(cmd *cobra.Command, o coreHandlerOpts, chain string) error {
	if err := needRoot("install"); err != nil {
		return err
	}
	if err := needDir(o.dir); err != nil {
		return err
	}
	bin, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find rbscope's own path: %w", err)
	}
	if bin, err = filepath.EvalSymlinks(bin); err != nil {
		return fmt.Errorf("find rbscope's own path: %w", err)
	}
	var flags []string
	pf := cmd.Flags()
	for _, name := range []string{"max-core-size", "keep", "min-free", "timeout"} {
		if pf.Changed(name) {
			flags = append(flags, "--"+name+"="+pf.Lookup(name).Value.String())
		}
	}
	if o.keepCore {
		flags = append(flags, "--keep-core")
	}
	line, err := postmortem.Install(postmortem.InstallOptions{Bin: bin, Dir: o.dir, Flags: flags, Chain: chain})
	if err != nil {
		return err
	}
	w := cmd.OutOrStdout()
	fmt.Fprintf(w, "core_pattern set to %q\n", line)
	fmt.Fprintf(w, "previous value saved in %s; undo with: %s core-handler uninstall --dir %s\n",
		filepath.Join(o.dir, postmortem.PreviousPatternName), bin, o.dir)
	if c := postmortem.ReadChain(o.dir); c != "" {
		fmt.Fprintf(w, "cores of non-Ruby processes go on to %q\n", c)
	}
	return nil
}

// runCoreHandler is the handler itself, run by the kernel: no useful
// stderr, no environment, cwd /. Everything goes to DIR/handler.log.
func runCoreHandler(o coreHandlerOpts, args []string) error {
	if err := needDir(o.dir); err != nil {
		return err
	}
	cfg := postmortem.Config{
		Dir: o.dir, MaxCoreSize: o.maxCoreSize, KeepCore: o.keepCore, Keep: o.keep,
		MinFree: o.minFree, Chain: o.chain, Timeout: o.timeout,
	}
	if cfg.Chain == "" {
		cfg.Chain = postmortem.ReadChain(o.dir)
	}
	c, err := postmortem.ParseArgs(args)
	if err != nil {
		os.MkdirAll(o.dir, 0o700)
		logLine(o.dir, "bad arguments: "+err.Error())
		return err
	}
	// The hard bound: a read of the kernel's pipe cannot be interrupted,
	// so the process ends itself a little after the deadline.
	timeout := o.timeout
	if timeout <= 0 {
		timeout = postmortem.DefaultTimeout
	}
	time.AfterFunc(timeout+2*time.Second, func() {
		logLine(o.dir, "pid="+strconv.Itoa(c.Pid)+": gave up at the deadline ("+timeout.String()+")")
		os.Exit(3)
	})
	_, err = postmortem.Handle(context.Background(), cfg, c, os.Stdin)
	return err
}

func logLine(dir, msg string) {
	f, err := os.OpenFile(filepath.Join(dir, postmortem.LogName), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return
	}
	fmt.Fprintf(f, "%s %s\n", time.Now().UTC().Format(time.RFC3339), msg)
	f.Close()
}

// Command rbscope profiles running Ruby processes from the outside: stack
// snapshots, sampling recordings, allocation tracking and post-mortem
// stacks from core files.
//
// Each subcommand lives in its own file and registers itself on rootCmd in
// an init function. The commands are thin: they map flags to the library
// packages' configurations (internal/record for record and top). Exit
// status: 2 for a usage error (a bad flag or argument), 3 for a snapshot
// printed with a stack missing, 1 for any other error.
package main

import (
	"errors"
	"fmt"
	"os"
	"runtime/pprof"
	"strings"

	"github.com/spf13/cobra"

	"github.com/rbscope/rbscope/internal/record"
)

// version is rbscope's version, set at build time with -ldflags "-X main.version=...".
var version = "0.1.0-dev"

var rootCmd = &cobra.Command{
	Use:   "rbscope",
	Short: "Profile running Ruby processes from the outside",
	Long: `rbscope reads a running Ruby process's memory (or a core file) to show
where it spends its time and what it allocates, without changing or
restarting it.

Exit status: 0 on success, 1 on errors, 2 on usage errors (bad flags),
3 when snapshot printed the stacks but could not read one whole.

Examples:
  rbscope snapshot --pid 1234            every Ruby thread's stack, now
  rbscope record --pid 1234 -o prof.html sample for a while, write a flame graph
  rbscope record -- ruby app.rb          start a program and profile it
  rbscope inspect --pid 1234             what rbscope found in the process, and how`,
	Version:       version,
	SilenceUsage:  true,
	SilenceErrors: true,
}

func init() {
	rootCmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		return record.UsageError{Err: err}
	})
}

// exitError carries an exit code through cobra.
type exitError struct {
	code int
	err  error
}

func (e exitError) Error() string { return e.err.Error() }
func (e exitError) Unwrap() error { return e.err }

// exitCode is the one exit-status policy: 2 for usage errors (ours, and
// cobra's unknown commands), 1 for the rest.
func exitCode(err error) int {
	var ee exitError
	switch {
	case errors.As(err, &ee):
		return ee.code
	case record.IsUsage(err), strings.HasPrefix(err.Error(), "unknown command "):
		return 2
	}
	return 1
}

func main() {
	stop := startCPUProfile()
	err := rootCmd.Execute()
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "rbscope: %v\n", err)
		os.Exit(exitCode(err))
	}
}

// startCPUProfile writes a Go CPU profile of rbscope itself to the file
// named by RBSCOPE_CPUPROFILE, for work on rbscope's own cost (go tool
// pprof rbscope FILE). It returns the function that stops it.
func startCPUProfile() func() {
	path := os.Getenv("RBSCOPE_CPUPROFILE")
	if path == "" {
		return func() {}
	}
	f, err := os.Create(path)
	if err != nil {
		fmt.Fprintf(os.Stderr, "rbscope: RBSCOPE_CPUPROFILE: %v\n", err)
		return func() {}
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		fmt.Fprintf(os.Stderr, "rbscope: RBSCOPE_CPUPROFILE: %v\n", err)
		f.Close()
		return func() {}
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}
}

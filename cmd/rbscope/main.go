// Command rbscope profiles running Ruby processes from the outside: stack
// snapshots, sampling recordings, allocation tracking and post-mortem
// stacks from core files.
//
// Each subcommand lives in its own file and registers itself on rootCmd in
// an init function.
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

// version is rbscope's version, set at build time with -ldflags "-X main.version=...".
var version = "0.1.0-dev"

var rootCmd = &cobra.Command{
	Use:   "rbscope",
	Short: "Profile running Ruby processes from the outside",
	Long: `rbscope reads a running Ruby process's memory (or a core file) to show
where it spends its time and what it allocates, without changing or
restarting it.

Examples:
  rbscope snapshot --pid 1234            every Ruby thread's stack, now
  rbscope record --pid 1234 -o prof.svg  sample for a while, write a flame graph
  rbscope record -- ruby app.rb          start a program and profile it
  rbscope inspect --pid 1234             what rbscope found in the process, and how`,
	Version:       version,
	SilenceUsage:  true,
	SilenceErrors: true,
}

// exitError carries an exit code through cobra.
type exitError struct {
	code int
	err  error
}

func (e exitError) Error() string { return e.err.Error() }
func (e exitError) Unwrap() error { return e.err }

func main() {
	if err := rootCmd.Execute(); err != nil {
		fmt.Fprintf(os.Stderr, "rbscope: %v\n", err)
		var ee exitError
		if errors.As(err, &ee) {
			os.Exit(ee.code)
		}
		os.Exit(1)
	}
}

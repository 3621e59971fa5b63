package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/rbscope/rbscope/internal/layout"
)

var layoutFlags struct {
	structs    []string
	debugRoots []string
}

var layoutCmd = &cobra.Command{
	Use:   "layout FILE",
	Short: "Print the Ruby struct layout from a binary's DWARF as JSON",
	Long: `layout reads the DWARF debug information of FILE (a libruby or ruby
executable), or of its separate debug file, and prints the layout of the
Ruby VM structs rbscope uses, as JSON in the schema of the built-in tables,
to compare with them or with pahole.

Separate debug files are looked for by build id under each --debug-root,
then $RBSCOPE_DEBUG_ROOT (colon-separated), then /usr/lib/debug; and by
.gnu_debuglink next to FILE, in .debug/ beside it and under each root.
With DEBUGINFOD_URLS set, they are then downloaded from debuginfod.

Examples:
  rbscope layout /opt/ruby/lib/libruby.so.3.4
  rbscope layout --struct rb_control_frame_struct ./ruby`,
	Args: usageArgs(cobra.ExactArgs(1)),
	RunE: runLayout,
}

func init() {
	layoutCmd.Flags().StringArrayVar(&layoutFlags.structs, "struct", nil,
		"struct to print (repeatable; default: the structs rbscope reads for the file's Ruby version, or every struct it knows when the version cannot be read)")
	layoutCmd.Flags().StringArrayVar(&layoutFlags.debugRoots, "debug-root", nil,
		"directory holding separate debug files (repeatable)")
	rootCmd.AddCommand(layoutCmd)
}

func runLayout(cmd *cobra.Command, args []string) error {
	file := args[0]
	version := fileRubyVersion(file)
	want := layoutFlags.structs
	if len(want) == 0 {
		want = layout.WantedStructs
		if version != "" {
			// Only the structs this Ruby defines: reading stops
			// once they are found.
			want = layout.NeededStructs(version)
		}
	}
	roots := layout.WithDefaultDebugRoots(layoutFlags.debugRoots)
	l, err := layout.FromBinaryFile(file, want, roots)
	if err != nil {
		return exitError{2, fmt.Errorf("%w\n(install the binary's debug symbols or point --debug-root at them)", err)}
	}
	l.RubyVersion = version
	out, err := json.MarshalIndent(l, "", "  ")
	if err != nil {
		return fmt.Errorf("encode layout: %w", err)
	}
	out = append(out, '\n')
	_, err = cmd.OutOrStdout().Write(out)
	return err
}

// fileRubyVersion reads the ruby_version string ("3.1.2") that libruby and
// a static ruby export, or returns "" when FILE has none.
func fileRubyVersion(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	return layout.FileRubyVersion(f)
}

package main

import (
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"github.com/rbscope/rbscope/internal/layout"
	"github.com/rbscope/rbscope/internal/ruby"
)

type inspectOpts struct {
	snapshotOpts
}

// inspectJSON is what `rbscope inspect --format json` prints.
type inspectJSON struct {
	Pid          int               `json:"pid"`
	Executable   string            `json:"executable"`
	Info         ruby.Info         `json:"ruby"`
	FieldSources map[string]string `json:"field_sources,omitempty"`
	Threads      int               `json:"threads"`
	Permissions  string            `json:"permissions"`
}

func init() {
	var o inspectOpts
	cmd := &cobra.Command{
		Use:   "inspect (--pid PID | --core FILE)",
		Short: "Show what rbscope found in a Ruby process, and how",
		Long: `Show the Ruby version and how it was found, the Ruby binaries with their
build ids and symbol sources, the addresses of the VM and the global
symbol table (and whether they came from symbols, hints or a memory
scan), and where the struct offsets came from (DWARF or the built-in
table, field by field).`,
		Example: `  rbscope inspect --pid 1234
  rbscope inspect --pid 1234 --format json`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.stderr = cmd.ErrOrStderr()
			return runInspect(cmd.OutOrStdout(), o)
		},
	}
	o.register(cmd.Flags())
	rootCmd.AddCommand(cmd)
}

func runInspect(w io.Writer, o inspectOpts) error {
	t, p, err := o.open()
	if err != nil {
		return err
	}
	defer t.Close()
	out := inspectJSON{Pid: t.Pid(), Executable: t.Executable(), Info: p.Info(), FieldSources: fieldSources(p.Layout())}
	if ths, err := p.Snapshot(); err == nil {
		out.Threads = len(ths)
	}
	out.Permissions = "memory readable"
	if o.Pid != 0 {
		out.Permissions = fmt.Sprintf("memory readable (uid %d; CAP_SYS_PTRACE or same user)", os.Geteuid())
	}
	if o.format == "json" {
		return writeJSON(w, out)
	}
	writeInspectText(w, out)
	return nil
}

// writeInspectText prints what inspect found, as text.
func writeInspectText(w io.Writer, out inspectJSON) {
	fmt.Fprintf(w, "Process:       %d (%s)\n", out.Pid, out.Executable)
	fmt.Fprintf(w, "Ruby version:  %s (from %s)\n", out.Info.Version, out.Info.VersionSource)
	fmt.Fprintf(w, "Layout:        %s\n", out.Info.LayoutSource)
	fmt.Fprintf(w, "GVL owner:     %s\n", out.Info.GVLSource)
	fmt.Fprintf(w, "GC state:      %s\n", out.Info.GCSource)
	for _, b := range out.Info.Binaries {
		fmt.Fprintf(w, "Binary:        %s\n", b.Path)
		fmt.Fprintf(w, "  mapped at 0x%x, load bias 0x%x\n", b.Base, b.Bias)
		if b.BuildID != "" {
			fmt.Fprintf(w, "  build id %s\n", b.BuildID)
		}
		fmt.Fprintf(w, "  symbols: %s\n", b.SymSource)
	}
	var names []string
	for n := range out.Info.Addresses {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "Address:       %-36s 0x%x (%s)\n", n, out.Info.Addresses[n], out.Info.AddressSources[n])
	}
	if len(out.FieldSources) > 0 {
		fmt.Fprintf(w, "Fields not in DWARF (taken from the built-in table): %d\n", len(out.FieldSources))
		var fs []string
		for f, src := range out.FieldSources {
			fs = append(fs, f+" <- "+src)
		}
		sort.Strings(fs)
		for _, f := range fs {
			fmt.Fprintf(w, "  %s\n", f)
		}
	}
	fmt.Fprintf(w, "Ruby threads:  %d\n", out.Threads)
	fmt.Fprintf(w, "Permissions:   %s\n", out.Permissions)
}

// fieldSources lists the fields whose offsets came from somewhere other
// than the layout's main source.
func fieldSources(l *layout.Layout) map[string]string {
	out := map[string]string{}
	for sn, s := range l.Structs {
		for fn, f := range s.Fields {
			if f.Source != "" && !strings.EqualFold(f.Source, l.Source) {
				out[sn+"."+fn] = f.Source
			}
		}
	}
	return out
}

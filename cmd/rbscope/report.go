package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/rbscope/rbscope/internal/output"
	"github.com/rbscope/rbscope/internal/record"
	"github.com/rbscope/rbscope/internal/recording"
	"github.com/rbscope/rbscope/internal/stack"
)

type reportOpts struct {
	input, format, output, title string
	lines                        bool
	threads, noGC                bool
	mode                         string
	top                          int
	up                           uploadOpts
}

func init() {
	var o reportOpts
	cmd := &cobra.Command{
		Use:   "report [RAW | --input RAW] [--format FORMAT] [--output FILE]",
		Short: "Render a raw recording in any output format",
		Long: `Render a raw recording (written by rbscope record, by default under
~/.cache/rbscope/recordings) as a flame graph, a pprof or speedscope
profile, a callgrind file, collapsed stacks or a text summary.

The output goes to --output; "-" is standard output. By default it is
named after the input, in the current directory, with the format's
extension (rbscope-20261121-083000-4242-1665343645.raw.gz ->
rbscope-20261121-083000-4242-1665343645.html), and its path is printed
on standard error.

A recording cut short (the recorder was killed, the disk filled up) is
rendered up to its last complete block, with a warning.

Formats:
` + formatHelp(),
		Example: `  rbscope report ~/.cache/rbscope/recordings/rbscope-20261121-083000-4242-1665343645.raw.gz
  rbscope report -i rec.raw.gz --format pprof -o cpu.pb.gz && go tool pprof -top cpu.pb.gz
  rbscope report -i rec.raw.gz --format summary --top 20 -o -
  rbscope report -i rec.raw.gz --format collapsed --lines -o - | flamegraph.pl > fg.svg
  rbscope report -i rec.raw.gz --upload http://pyroscope:4040 --app-name shop --tag env=prod`,
		Args: usageArgs(cobra.MaximumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 {
				if o.input != "" && o.input != args[0] {
					return usage("report reads one recording: %s and --input %s", args[0], o.input)
				}
				o.input = args[0]
			}
			if o.up.url == "" {
				return runReport(cmd.ErrOrStderr(), o)
			}
			if err := checkUploadReport(cmd); err != nil {
				return err
			}
			if o.input == "" {
				return usage("report --upload needs --input RAW (a raw recording written by rbscope record)")
			}
			return o.up.uploadRecording(cmd.ErrOrStderr(), o.input)
		},
	}
	f := cmd.Flags()
	f.StringVarP(&o.input, "input", "i", "", "raw recording to read (or give it as the argument)")
	f.StringVarP(&o.format, "format", "f", "flamegraph", "output format: "+strings.Join(output.Formats(), ", "))
	f.StringVarP(&o.output, "output", "o", "", `file to write, "-" for standard output (default: named after the input)`)
	f.StringVar(&o.title, "title", "", "profile title (default: rbscope and the recorded command)")
	f.BoolVar(&o.lines, "lines", false, "collapsed: name frames \"name (path:line)\"")
	f.IntVar(&o.top, "top", 0, "summaries: show only the first N rows (0: all)")
	f.BoolVar(&o.threads, "threads", false, "collapsed: root each stack at \"thread NAME (TID)\"")
	f.StringVar(&o.mode, "mode", "wall", "keep only the samples of this mode: wall (all), cpu (on a CPU, not waiting for the GVL), gvl (the GVL's owner)")
	f.BoolVar(&o.noGC, "no-gc", false, "leave out the GC pseudo-frames")
	o.up.register(f)
	rootCmd.AddCommand(cmd)
}

// formatHelp lists the formats with their descriptions and extensions.
func formatHelp() string {
	var b strings.Builder
	for _, f := range output.Formats() {
		fmt.Fprintf(&b, "  %-16s %s (%s)\n", f, output.Describe(f), output.DefaultExtension(f))
	}
	return b.String()
}

// renderOptions are the output options for a recording with header h: its
// rate, start time, and a title naming the recorded command.
func renderOptions(h recording.Header) output.Options {
	o := output.Options{RateHz: h.RateHz, Start: h.Start}
	if len(h.Command) > 0 {
		t := strings.Join(h.Command, " ")
		if len(t) > 100 {
			t = t[:97] + "..."
		}
		o.Title = "rbscope: " + t
	}
	return o
}

// reportPath names the output for input in the current directory:
// its base name without .raw.gz (or .gz, .raw) plus the format's extension.
func reportPath(input, format string) string {
	base := filepath.Base(input)
	for _, suf := range []string{".raw.gz", ".gz", ".raw"} {
		if strings.HasSuffix(base, suf) && len(base) > len(suf) {
			base = strings.TrimSuffix(base, suf)
			break
		}
	}
	return base + output.DefaultExtension(format)
}

func runReport(stderr io.Writer, o reportOpts) error {
	if o.input == "" {
		return usage("report needs --input RAW (a raw recording written by rbscope record)")
	}
	if _, err := output.New(o.format, output.Options{}); err != nil {
		return record.UsageError{Err: err}
	}
	if o.top < 0 {
		return usage("--top %d: must be 0 (all) or more", o.top)
	}
	mode, err := stack.ParseMode(o.mode)
	if err != nil {
		return usage("--mode: %v", err)
	}
	rd, err := recording.Open(o.input)
	if err != nil {
		return fmt.Errorf("read recording: %w", err)
	}
	defer rd.Close()
	h := rd.Header()
	if mode == stack.ModeCPU && h.Options[record.OnCPUOption] != record.OnCPUSwitches {
		fmt.Fprintf(stderr, "rbscope: warning: %s was not recorded with --mode cpu: its on-CPU flags are the kernel's run state, which counts a thread waiting for a CPU as on one (record with --mode cpu for CPU time)\n", o.input)
	}
	opts := renderOptions(h)
	if o.title != "" {
		opts.Title = o.title
	}
	opts.Lines, opts.Top, opts.Threads = o.lines, o.top, o.threads
	opts.Unread = record.UnreadOptions(rd, mode)

	out := o.output
	if out == "" {
		out = reportPath(o.input, o.format)
	}
	// A recording cut short is rendered up to where it was cut.
	// A FIFO is waited for (bounded, and said); SIGINT and SIGTERM end
	// the wait the default way.
	wo := output.WriteOptions{Say: func(msg string) { fmt.Fprintf(stderr, "rbscope: %s\n", msg) }}
	n, f, err := output.RenderFile(o.format, opts, filterSamples(rd.Samples(), mode, o.noGC), out, wo)
	if err != nil {
		return fmt.Errorf("render %s: %w", o.format, err)
	}
	switch {
	case rd.Damage() != nil:
		fmt.Fprintf(stderr, "rbscope: warning: %s is damaged after %d samples (%v); rendered those\n", o.input, n, rd.Damage())
	case rd.Truncated():
		fmt.Fprintf(stderr, "rbscope: warning: %s ends without its trailer (the recorder was stopped before closing it); rendered its %d samples\n", o.input, n)
	}
	if n == 0 {
		if f.Replaced {
			os.Remove(f.Path)
		}
		return fmt.Errorf("%s holds no samples; nothing to render", o.input)
	}
	if !output.StdoutPath(out) {
		fmt.Fprintf(stderr, "wrote %s (%d samples) to %s\n", o.format, n, out)
	}
	return nil
}

// filterSamples drops the samples mode does not keep and, with noGC, the
// GC pseudo-frames.
func filterSamples(next func() (stack.Sample, error), mode stack.Mode, noGC bool) func() (stack.Sample, error) {
	if mode == stack.ModeWall && !noGC {
		return next
	}
	return func() (stack.Sample, error) {
		for {
			s, err := next()
			if err != nil {
				return s, err
			}
			if !mode.Keeps(&s) {
				continue
			}
			if noGC {
				s.DropGC()
			}
			return s, nil
		}
	}
}

package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/rbscope/rbscope/internal/postmortem"
)

type crashesOpts struct {
	dir    string
	format string
}

// crashSummary is one line of `rbscope crashes --format json`.
type crashSummary struct {
	ID          string    `json:"id"`
	Time        time.Time `json:"time"`
	Pid         int       `json:"pid"`
	Executable  string    `json:"executable"`
	Signal      int       `json:"signal"`
	SignalName  string    `json:"signal_name"`
	TopFrame    string    `json:"top_frame"`
	RubyVersion string    `json:"ruby_version"`
	Truncated   bool      `json:"core_truncated"`
}

func init() {
	var o crashesOpts
	cmd := &cobra.Command{
		Use:   "crashes --dir DIR [--format text|json] [show ID]",
		Short: "List the crash reports core-handler wrote",
		Long: `List the crash reports 'rbscope core-handler' wrote in DIR, newest
first: time, pid, executable, signal and the innermost Ruby frame of the
thread that crashed. 'crashes show ID' prints one report whole.`,
		Example: `  rbscope crashes --dir /var/lib/rbscope/crashes
  rbscope crashes --dir /var/lib/rbscope/crashes show 20261121T083625Z-1234`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runCrashes(cmd.OutOrStdout(), o)
		},
	}
	cmd.PersistentFlags().StringVar(&o.dir, "dir", "", "report directory")
	cmd.PersistentFlags().StringVar(&o.format, "format", "text", "output format: text or json")
	show := &cobra.Command{
		Use:   "show ID",
		Short: "Print one crash report",
		Args:  usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runCrashShow(cmd.OutOrStdout(), o, args[0])
		},
	}
	cmd.AddCommand(show)
	rootCmd.AddCommand(cmd)
}

func checkCrashesOpts(o crashesOpts) error {
	if o.dir == "" {
		return usage("give the report directory with --dir (the one core-handler install was given)")
	}
	if err := checkFormat(o.format, "text", "json"); err != nil {
		return err
	}
	if _, err := os.Stat(o.dir); err != nil {
		return fmt.Errorf("report directory: %w", err)
	}
	return nil
}

func runCrashes(w io.Writer, o crashesOpts) error {
	if err := checkCrashesOpts(o); err != nil {
		return err
	}
	reports, lerr := postmortem.List(o.dir)
	if reports == nil && lerr != nil {
		return lerr
	}
	if o.format == "json" {
		out := make([]crashSummary, 0, len(reports))
		for _, r := range reports {
			out = append(out, crashSummary{ID: r.ID, Time: r.Time, Pid: r.Pid, Executable: r.Executable,
				Signal: r.Signal, SignalName: r.SignalName, TopFrame: r.TopFrame(),
				RubyVersion: r.RubyVersion, Truncated: r.Core.Truncated})
		}
		if err := writeJSON(w, out); err != nil {
			return err
		}
	} else {
		if len(reports) == 0 {
			fmt.Fprintf(w, "no crash reports in %s\n", o.dir)
		} else {
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tTIME\tPID\tEXECUTABLE\tSIGNAL\tTOP FRAME")
			for _, r := range reports {
				top := r.TopFrame()
				if top == "" {
					top = "(none)"
				}
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\n", r.ID, r.Time.Local().Format("2006-01-02 15:04:05"),
					r.Pid, r.Executable, r.SignalName, top)
			}
			tw.Flush()
		}
	}
	if lerr != nil {
		return fmt.Errorf("some reports could not be read: %w", lerr)
	}
	return nil
}

func runCrashShow(w io.Writer, o crashesOpts, id string) error {
	if err := checkCrashesOpts(o); err != nil {
		return err
	}
	id = strings.TrimSuffix(strings.TrimSuffix(id, ".json"), ".txt")
	r, err := postmortem.Load(o.dir, id)
	if err != nil {
		return err
	}
	if o.format == "json" {
		return writeJSON(w, r)
	}
	return postmortem.WriteText(w, r)
}

package main

import (
	"context"
	"strings"

	"github.com/spf13/cobra"

	"github.com/rbscope/rbscope/internal/output"
	"github.com/rbscope/rbscope/internal/record"
)

const recordLong = `Sample every Ruby thread's stack at --rate per second until --duration has
passed, the process exits or you press Ctrl-C, then write a profile.

Samples are streamed to a raw recording as they are taken (its path is
printed; re-render it with 'rbscope report'): by default a new file in
the user cache directory (rbscope-<time>-<pid>-<random>.raw.gz), or
--raw FILE, which is replaced unless another recording is writing it
(refused). At the end the --format output is written to --output
(default rbscope-<time>-<pid>.<ext> in the current directory, or -2, -3,
... when taken). A device, FIFO or '-' is written in place; a symbolic
link's target is written, never the link replaced.

By default each sample pauses the process (ptrace) for as long as it
takes to read its stacks (tens to hundreds of microseconds), so that
every stack is consistent: only the thread holding the GVL, the one that
can change a Ruby stack, or every Ruby thread when none holds it; the process is always resumed, also on
Ctrl-C, errors, SIGTERM and SIGHUP (and the kernel resumes it if rbscope
is killed). --nonblocking reads the running process instead: no pauses,
but a stack that keeps changing while it is read is kept with the frames
that held still under a "(stack changed while read)" frame (the summary
says which threads had such samples).

Ctrl-C (SIGINT), SIGTERM and SIGHUP (a dropped ssh connection) end the
recording and write the output. Ctrl-Z (SIGTSTP) suspends rbscope
between two samples, never leaving the process paused; 'fg' (SIGCONT)
resumes sampling. SIGSTOP cannot be caught: a rbscope stopped with it in
the middle of a sample holds the process paused until it is continued;
--nonblocking never does.

Launch mode ('rbscope record -- ruby app.rb') starts the command (as the
invoking user when run with sudo), waits until Ruby has started, and
samples it until it exits. Ctrl-C (SIGINT) or SIGTERM stops the recording
and is passed on to the command (a Ctrl-C typed in the terminal already
reaches it); the profile is written, then rbscope waits up to 5 s for the
command to exit and otherwise leaves it running (it is never left
paused). When --duration ends the recording first, the command goes on
running. A command that execs another Ruby (bundle exec) is followed.

--subprocesses also samples Ruby processes that descend from the target
(fork, system, spawn), found as they appear; non-Ruby ones are skipped.
The recording ends when the first process exits.`

// recordFlags are record's flags; Config is what they map to.
type recordFlags struct {
	targetFlags
	cfg record.Config
	up  uploadOpts
}

func init() {
	var o recordFlags
	cmd := &cobra.Command{
		Use:   "record (--pid PID | -- COMMAND [ARGS...])",
		Short: "Sample a Ruby process's stacks for a while and write a profile",
		Long:  recordLong,
		Example: `  rbscope record --pid 1234 --duration 30s
  rbscope record --pid 1234 --format speedscope -o profile.json
  rbscope record --subprocesses -- bundle exec rake test`,
		RunE: func(cmd *cobra.Command, args []string) error {
			argv, err := launchArgs(cmd, args)
			if err != nil {
				return err
			}
			return o.run(cmd, argv)
		},
	}
	f := cmd.Flags()
	o.register(f, withSampling|withLaunch)
	f.DurationVarP(&o.cfg.Duration, "duration", "d", 0, "stop after this long, more than 0 (default: until Ctrl-C or the process exits)")
	f.StringVarP(&o.cfg.Format, "format", "f", "flamegraph", "output format: "+strings.Join(output.Formats(), ", "))
	f.StringVarP(&o.cfg.Output, "output", "o", "", "output file ('-' for standard output; default rbscope-<time>-<pid>.<ext>)")
	f.StringVar(&o.cfg.Raw, "raw", "", "raw recording file (default a new file in the user cache directory;\nrefused while another recording writes it)")
	registerMode(f, &o.cfg.Mode)
	f.BoolVar(&o.cfg.OnCPU, "on-cpu", false, "the same as --mode cpu")
	f.BoolVar(&o.cfg.NoGC, "no-gc", false, "leave out the (garbage collection) / (marking) / (sweeping) frames\n(GC time is then charged to the Ruby frame that triggered it)")
	f.BoolVar(&o.cfg.Threads, "threads", false, "collapsed format: root each stack at \"thread NAME (TID)\"")
	f.BoolVar(&o.cfg.Silent, "silent", false, "print no progress or summary")
	o.up.register(f)
	rootCmd.AddCommand(cmd)
}

func (o *recordFlags) run(cmd *cobra.Command, argv []string) error {
	if err := checkDuration(cmd, o.cfg.Duration); err != nil {
		return err
	}
	cfg := o.cfg
	cfg.Target = o.Target
	cfg.Command = argv
	cfg.Stderr = cmd.ErrOrStderr()
	cfg.Version = version
	if o.up.url != "" {
		cfg.Sinks = func(command []string) ([]record.Sink, error) {
			up, err := o.up.start(cfg.Stderr, cfg.Rate, command)
			if err != nil {
				return nil, err
			}
			return []record.Sink{uploadSink{o: &o.up, up: up, stderr: cfg.Stderr}}, nil
		}
	}
	return record.Run(context.Background(), cfg)
}

package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/rbscope/rbscope/internal/record"
	"github.com/rbscope/rbscope/internal/sampler"
	"github.com/rbscope/rbscope/internal/stack"
	"github.com/rbscope/rbscope/internal/tui"
)

type topFlags struct {
	targetFlags
	interval time.Duration
	mode     stack.Mode
}

func init() {
	var o topFlags
	cmd := &cobra.Command{
		Use:   "top --pid PID",
		Short: "Live view of the functions a Ruby process spends its time in",
		Long: `Show, like top, which functions a running Ruby process spends its time
in, refreshed every --interval. %Own is the share of the last interval's
samples in which a function was running itself, %Total the share in which
it was anywhere on the stack; OwnTime and TotalTime add up since the
start. --mode cpu counts only the threads running Ruby or C code or GC
(as record's), --mode gvl only the GVL's owner; wall (the default) every
thread, sleeping or not.

The per-thread view names each thread with its tid: threads of one name
(a pool's) are told apart, and a name too long for the column is cut in
the middle, marked with "…".

Keys: q or Ctrl-C quits (the terminal is restored and the process
resumed), t toggles the per-thread view, 1-4 sort by %Own, %Total,
OwnTime or TotalTime, space pauses the display (sampling goes on).
SIGTERM and SIGHUP quit the same way.

Needs a terminal (it works over ssh and in tmux).`,
		Example: `  rbscope top --pid 1234
  rbscope top --pid 1234 --mode cpu
  rbscope top --pid 1234 --interval 2s --nonblocking`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			return o.run()
		},
	}
	f := cmd.Flags()
	o.register(f, withSampling)
	f.DurationVar(&o.interval, "interval", time.Second, "refresh interval")
	registerMode(f, &o.mode)
	rootCmd.AddCommand(cmd)
}

func (o *topFlags) run() error {
	if o.Pid == 0 {
		return usage("give the process to watch: rbscope top --pid PID")
	}
	if err := o.Validate(); err != nil {
		return err
	}
	if o.interval < 50*time.Millisecond {
		return usage("--interval %v is too short (50ms at least)", o.interval)
	}
	if !tui.IsTerminal(os.Stdin, os.Stdout) {
		return errors.New("top needs a terminal; use 'rbscope record --format summary' to sample without one")
	}
	if err := o.Target.CheckRealtime(); err != nil {
		return err
	}
	proc, err := record.OpenLive(context.Background(), o.Target)
	if err != nil {
		return err
	}
	defer proc.Target().Close()
	screen, err := tui.OpenScreen(os.Stdin, os.Stdout)
	if err != nil {
		return err
	}
	defer screen.Close()

	agg := tui.NewTop(o.Rate)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sampled := make(chan sampler.Stats, 1)
	var sampleErr error // set before the stats are sent
	go func() {
		st, err := record.SampleLive(ctx, proc, o.Target, sampler.Config{
			Mode:          o.mode,
			ProgressEvery: 250 * time.Millisecond,
			Progress: func(st sampler.Stats) {
				msg := ""
				if st.LastError != nil {
					msg = st.LastError.Error()
				}
				agg.SetStatus(st.ErrorCount(), st.Late+st.Missed, msg)
				unread := map[stack.Activity]int{}
				for _, sp := range st.Threads {
					for a, n := range sp.Unread {
						unread[a] += n
					}
				}
				agg.SetUnread(unread)
				agg.SetTorn(record.TornSummary(record.TornThreads(st)))
			},
		}, agg.Add)
		sampleErr = err
		sampled <- st
	}()
	v := topView{agg: agg, screen: screen, sortBy: tui.SortOwnPct,
		h: tui.Header{Pid: o.Pid, RubyVersion: proc.Version(), Mode: mode(o.Nonblocking), Keep: o.mode, Rate: o.Rate, Interval: o.interval}}
	st, stopped := v.loop(o.interval, sampled)
	if stopped {
		cancel()
		<-sampled
		return nil
	}
	screen.Close()
	if sampleErr != nil {
		return sampleErr
	}
	if st.Exited {
		fmt.Fprintf(os.Stderr, "rbscope: process %d exited\n", o.Pid)
	}
	return nil
}

func mode(nonblocking bool) string {
	if nonblocking {
		return "nonblocking"
	}
	return "blocking"
}

// topView is top's screen state.
type topView struct {
	agg       *tui.Top
	screen    *tui.Screen
	h         tui.Header
	sortBy    tui.SortKey
	perThread bool
	paused    bool
	view      tui.View
}

func (v *topView) draw() {
	v.screen.Draw(func(w, h int) string { return tui.Render(v.h, v.view, v.perThread, w, h, v.paused) })
}

// loop redraws every interval and handles keys and signals until the
// user quits (stopped) or sampling ends by itself (the stats).
func (v *topView) loop(interval time.Duration, sampled <-chan sampler.Stats) (st sampler.Stats, stopped bool) {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, append(record.StopSignals, syscall.SIGWINCH)...)
	defer signal.Stop(sigs)
	v.view = v.agg.Snapshot(v.sortBy)
	v.draw()
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		select {
		case <-ticker.C:
			if !v.paused {
				v.view = v.agg.Snapshot(v.sortBy)
			}
		case c, ok := <-v.screen.Keys():
			if !ok || !v.key(c) {
				return st, true
			}
		case sig := <-sigs:
			if sig != syscall.SIGWINCH {
				return st, true
			}
		case st = <-sampled:
			return st, false
		}
		v.draw()
	}
}

// key handles one key; false quits.
func (v *topView) key(c byte) bool {
	switch c {
	case 'q', 'Q', 3, 4: // Ctrl-C, Ctrl-D
		return false
	case 't', 'T':
		v.perThread = !v.perThread
	case '1', '2', '3', '4':
		v.sortBy = tui.SortKey(c - '1')
		v.view.Resort(v.sortBy)
	case ' ':
		v.paused = !v.paused
	}
	return true
}

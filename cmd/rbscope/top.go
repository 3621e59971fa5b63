package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/rbscope/rbscope/internal/ruby"
	"github.com/rbscope/rbscope/internal/sampler"
	"github.com/rbscope/rbscope/internal/target"
	"github.com/rbscope/rbscope/internal/tui"
)

type topOpts struct {
	pid         int
	rate        float64
	interval    time.Duration
	nonblocking bool
	rubyVersion string
}

func init() {
	var o topOpts
	cmd := &cobra.Command{
		Use:   "top --pid PID",
		Short: "Live view of the functions a Ruby process spends its time in",
		Long: `Show, like top, which functions a running Ruby process spends its time
in, refreshed every --interval. %Own is the share of the last interval's
samples in which a function was running itself, %Total the share in which
it was anywhere on the stack; OwnTime and TotalTime add up since the
start.

Keys: q or Ctrl-C quits (the terminal is restored and the process
resumed), t toggles the per-thread view, 1-4 sort by %Own, %Total,
OwnTime or TotalTime, space pauses the display (sampling goes on).

Needs a terminal (it works over ssh and in tmux).`,
		Example: `  rbscope top --pid 1234
  rbscope top --pid 1234 --interval 2s --nonblocking`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runTop(o)
		},
	}
	f := cmd.Flags()
	f.IntVarP(&o.pid, "pid", "p", 0, "process id of the Ruby process")
	f.Float64VarP(&o.rate, "rate", "r", sampler.DefaultRate, "samples per second")
	f.DurationVar(&o.interval, "interval", time.Second, "refresh interval")
	f.BoolVar(&o.nonblocking, "nonblocking", false, "do not pause the process while reading its stacks")
	f.StringVar(&o.rubyVersion, "ruby-version", "", "Ruby version to assume when it cannot be detected (e.g. 3.1.2)")
	rootCmd.AddCommand(cmd)
}

func runTop(o topOpts) error {
	switch {
	case o.pid <= 0:
		return errors.New("give the process to watch: rbscope top --pid PID")
	case o.rate <= 0 || o.rate > sampler.MaxRate:
		return fmt.Errorf("--rate %g is outside 0..%d", o.rate, sampler.MaxRate)
	case o.interval < 50*time.Millisecond:
		return fmt.Errorf("--interval %v is too short (50ms at least)", o.interval)
	}
	in, out := int(os.Stdin.Fd()), int(os.Stdout.Fd())
	if !term.IsTerminal(in) || !term.IsTerminal(out) {
		return errors.New("top needs a terminal; use 'rbscope record --format summary' to sample without one")
	}
	proc, err := sampler.OpenRuby(context.Background(), o.pid, ruby.Options{Version: o.rubyVersion}, 0)
	if err != nil {
		if errors.Is(err, ruby.ErrNotRuby) {
			return fmt.Errorf("process %d: %w", o.pid, err)
		}
		return fmt.Errorf("find the Ruby VM in process %d: %w", o.pid, err)
	}
	defer proc.Target().Close()

	mode := "nonblocking"
	if !o.nonblocking {
		mode = "blocking"
	}
	agg := tui.NewTop(o.rate)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sampled := make(chan sampler.Stats, 1)
	go func() {
		ro := sampler.RubyOptions{}
		if !o.nonblocking {
			// Bound to this goroutine's OS thread, which runs the sampler.
			pauser := target.NewThreadPauser()
			defer pauser.Close()
			ro.Pauser = pauser
		}
		src := sampler.NewRubySource(proc, ro)
		defer src.Close()
		st, _ := sampler.Run(ctx, src, sampler.Config{
			Rate: o.rate, ProgressEvery: 250 * time.Millisecond,
			Progress: func(st sampler.Stats) {
				msg := ""
				if st.LastError != nil {
					msg = st.LastError.Error()
				}
				agg.SetStatus(st.ErrorCount(), st.Late+st.Missed, msg)
			},
		}, agg.Add)
		sampled <- st
	}()

	// The terminal: raw mode (keys arrive at once; Ctrl-C is a key), the
	// alternate screen, no cursor. Restored on every way out.
	old, err := term.MakeRaw(in)
	if err != nil {
		return fmt.Errorf("set terminal to raw mode: %w", err)
	}
	restore := func() {
		_ = term.Restore(in, old)
		_, _ = io.WriteString(os.Stdout, tui.ShowCursor+tui.ExitAltScreen)
	}
	defer restore()
	_, _ = io.WriteString(os.Stdout, tui.EnterAltScreen+tui.HideCursor)

	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGWINCH)
	defer signal.Stop(sigs)
	keys := make(chan byte, 16)
	go func() {
		buf := make([]byte, 64)
		for {
			n, err := os.Stdin.Read(buf)
			for _, c := range buf[:n] {
				keys <- c
			}
			if err != nil {
				close(keys)
				return
			}
		}
	}()

	h := tui.Header{Pid: o.pid, RubyVersion: proc.Version(), Mode: mode, Rate: o.rate, Interval: o.interval}
	sortBy := tui.SortOwnPct
	perThread, paused := false, false
	view := agg.Snapshot(sortBy)
	draw := func() {
		w, hgt, err := term.GetSize(out)
		if err != nil {
			w, hgt = 80, 24
		}
		_, _ = io.WriteString(os.Stdout, tui.Render(h, view, perThread, w, hgt, paused))
	}
	draw()
	ticker := time.NewTicker(o.interval)
	defer ticker.Stop()
	for {
		select {
		case <-ticker.C:
			if !paused {
				view = agg.Snapshot(sortBy)
				draw()
			}
		case c, ok := <-keys:
			if !ok {
				return nil
			}
			switch c {
			case 'q', 'Q', 3, 4: // Ctrl-C, Ctrl-D
				cancel()
				<-sampled
				return nil
			case 't', 'T':
				perThread = !perThread
			case '1', '2', '3', '4':
				sortBy = tui.SortKey(c - '1')
				view.Resort(sortBy)
			case ' ':
				paused = !paused
			}
			draw()
		case sig := <-sigs:
			if sig == syscall.SIGWINCH {
				draw()
				continue
			}
			cancel()
			<-sampled
			return nil
		case st := <-sampled:
			restore()
			if st.Exited {
				fmt.Fprintf(os.Stderr, "rbscope: process %d exited\n", o.pid)
				return nil
			}
			return nil
		}
	}
}

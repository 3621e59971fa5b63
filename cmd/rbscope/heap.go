package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/rbscope/rbscope/internal/heap"
	"github.com/rbscope/rbscope/internal/output"
	"github.com/rbscope/rbscope/internal/procfs"
)

type heapOpts struct {
	snapshotOpts
	stop     bool
	output   string
	top      int
	interval time.Duration
	count    int
	dump     string
	upload   uploadOpts
}

func init() {
	var o heapOpts
	cmd := &cobra.Command{
		Use:   "heap (--pid PID | --core FILE [--exe PATH])",
		Short: "Count the live Ruby heap by type and class",
		Long: `Walk a Ruby process's object heap from outside (or a core file's) and
count its live objects by type and class: how many, the bytes of their
heap slots, and the bytes Ruby malloc'd for them outside the slots
(strings', arrays' and hashes' buffers, and objects' instance variables
except on 3.2; other types count their slot only, and the report says
so). Ruby 3.0 to 3.4.

By default the process keeps running: each batch of heap pages is read
twice and slots that changed in between are counted apart, never
guessed. --stop pauses the whole process for an exact census (and
always resumes it) and prints how long it was paused.

With --interval, rbscope takes a census every interval (--count times)
and prints the classes that grew most since the first one.

--upload pushes each census to a Pyroscope server as a memory profile
(inuse_objects, inuse_space by type;class), stamped with the time since
the previous census (--interval), or the one census.

--dump writes every live object as a line of Ruby's ObjectSpace.dump_all
format (address, type, slot_size, class, memsize, references of arrays,
objects and shared strings; no roots, string contents or allocation
sites), streamed as the census reads the heap.`,
		Example: `  rbscope heap --pid 1234                       # table by bytes
  rbscope heap --pid 1234 --stop                # exact: pause the process meanwhile
  rbscope heap --pid 1234 --format json
  rbscope heap --pid 1234 -f pprof -o before.pb.gz; ...; rbscope heap --pid 1234 -f pprof -o after.pb.gz
  go tool pprof -top -diff_base before.pb.gz after.pb.gz
  rbscope heap --pid 1234 --interval 30s --count 10   # what grows
  rbscope heap --pid 1234 --stop --dump heap.json      # ObjectSpace.dump_all's format
  rbscope heap --pid 1234 --interval 60s --upload http://pyroscope:4040 --app-name shop
  rbscope heap --core core.1234 --exe /usr/bin/ruby`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runHeap(cmd, o)
		},
	}
	f := cmd.Flags()
	o.targetFlags.register(f, 0)
	f.StringVar(&o.core, "core", "", "core file to read instead of a live process (plain or compressed)")
	f.StringVar(&o.exe, "exe", "", "with --core: the ruby executable that produced the core")
	f.StringVarP(&o.format, "format", "f", "text", "output format: text, json or pprof (inuse_objects/inuse_space by type;class)")
	f.StringVarP(&o.output, "output", "o", "", "write the report to FILE (default: stdout; pprof: rbscope-heap-PID-TIME.pb.gz)")
	f.BoolVar(&o.stop, "stop", false, "pause the process during the census (exact counts)")
	f.IntVar(&o.top, "top", 30, "text: rows to print (0: all)")
	f.DurationVar(&o.interval, "interval", 0, "take a census every interval and print the top growers since the first")
	f.IntVar(&o.count, "count", 0, "with --interval: how many censuses after the first (0: until interrupted)")
	f.StringVar(&o.dump, "dump", "", "also write every live object to FILE in Ruby's ObjectSpace.dump_all format (JSON lines)")
	o.upload.register(f)
	rootCmd.AddCommand(cmd)
}

func (o *heapOpts) check() error {
	if err := checkFormat(o.format, "text", "json", "pprof"); err != nil {
		return err
	}
	if o.interval < 0 || o.count < 0 {
		return usage("--interval and --count must not be negative")
	}
	if o.count > 0 && o.interval == 0 {
		return usage("--count goes with --interval")
	}
	if o.interval > 0 && o.core != "" {
		return usage("--interval needs a live process, not a core file")
	}
	if o.stop && o.core != "" {
		return usage("--stop needs a live process: a core file does not change")
	}
	if o.dump != "" && o.interval > 0 {
		return usage("--dump takes one census: not with --interval")
	}
	for _, p := range []string{o.output, o.dump} {
		if p == "" {
			continue
		}
		if err := output.CheckWritable(p); err != nil {
			return fmt.Errorf("output %s: %w", p, err)
		}
	}
	return nil
}

func runHeap(cmd *cobra.Command, o heapOpts) (err error) {
	if err := o.check(); err != nil {
		return err
	}
	format := o.format
	o.format = "text" // snapshotOpts.open checks its own formats
	t, p, err := o.snapshotOpts.open()
	if err != nil {
		return err
	}
	defer t.Close()
	h, err := heap.Open(p)
	if err != nil {
		return fmt.Errorf("process %d: %w", t.Pid(), err)
	}
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	argv, _ := procfs.Cmdline(t.Pid())
	up, err := o.upload.start(cmd.ErrOrStderr(), 0, argv)
	if err != nil {
		return err
	}
	push := func(c *heap.Census, from time.Time) {
		if up == nil {
			return
		}
		p, err := c.Profile()
		if err == nil {
			err = up.AddProfile(from, c.Time, p, int(min(liveCount(c), math.MaxInt32)))
		}
		if err != nil {
			fmt.Fprintf(cmd.ErrOrStderr(), "rbscope heap: upload: dropping a census: %v\n", err)
		}
	}
	defer func() {
		if ferr := o.upload.finish(cmd.ErrOrStderr(), up); ferr != nil && err == nil {
			err = ferr
		}
	}()
	opts := heap.Options{Stop: o.stop}
	var first *heap.Census
	if o.dump != "" {
		f, err := output.WriteFile(o.dump, heapWriteOptions(ctx, cmd), func(w io.Writer) error {
			dopts := opts
			dopts.Dump = w
			c, err := h.Census(ctx, dopts)
			first = c
			return err
		})
		if err != nil {
			return fmt.Errorf("census of process %d: %w", t.Pid(), err)
		}
		if !output.StdoutPath(o.dump) {
			fmt.Fprintf(cmd.ErrOrStderr(), "rbscope heap: wrote %d objects to %s\n", first.Dumped, f.Path)
		}
	} else if first, err = h.Census(ctx, opts); err != nil {
		return fmt.Errorf("census of process %d: %w", t.Pid(), err)
	}
	interval := o.interval
	if interval == 0 {
		interval = first.Duration
	}
	push(first, first.Time.Add(-interval))
	if o.interval == 0 {
		return writeHeap(cmd, o, format, first)
	}
	out := cmd.OutOrStdout()
	fmt.Fprintf(out, "first census: %d live objects in %d slots (%s); next every %s\n", liveCount(first), first.Slots, first.Duration.Round(time.Millisecond), o.interval)
	last := first
	for step := 1; o.count == 0 || step <= o.count; step++ {
		select {
		case <-ctx.Done():
			return writeHeap(cmd, o, format, last)
		case <-time.After(o.interval):
		}
		c, err := h.Census(ctx, opts)
		if err != nil {
			return fmt.Errorf("census %d of process %d: %w", step, t.Pid(), err)
		}
		if c.Partial && ctx.Err() != nil {
			break
		}
		push(c, last.Time)
		last = c
		fmt.Fprintln(out)
		if err := heap.WriteGrowth(out, step, c.Time.Sub(first.Time).Round(time.Second).String(), heap.Grow(first, c), 10); err != nil {
			return err
		}
	}
	if o.output != "" || format != "text" {
		return writeHeap(cmd, o, format, last)
	}
	return nil
}

func liveCount(c *heap.Census) uint64 {
	var n uint64
	for _, e := range c.Entries {
		n += e.Count
	}
	return n
}

func writeHeap(cmd *cobra.Command, o heapOpts, format string, c *heap.Census) error {
	write := func(w io.Writer) error {
		switch format {
		case "json":
			return c.WriteJSON(w)
		case "pprof":
			return c.WritePprof(w)
		}
		return c.WriteText(w, o.top)
	}
	out := o.output
	if out == "" && format == "pprof" {
		out = fmt.Sprintf("rbscope-heap-%d-%s.pb.gz", c.Pid, time.Now().Format("20060102-150405"))
	}
	if out == "" {
		return write(cmd.OutOrStdout())
	}
	f, err := output.WriteFile(out, heapWriteOptions(cmd.Context(), cmd), write)
	if err != nil {
		return fmt.Errorf("write heap report: %w", err)
	}
	if !output.StdoutPath(out) {
		path := f.Path
		if abs, err := filepath.Abs(path); err == nil {
			path = abs
		}
		fmt.Fprintf(cmd.ErrOrStderr(), "rbscope heap: wrote %s\n", path)
	}
	return nil
}

// heapWriteOptions: a wait on a FIFO's reader says what it waits for on
// stderr and ends with ctx.
func heapWriteOptions(ctx context.Context, cmd *cobra.Command) output.WriteOptions {
	stderr := cmd.ErrOrStderr()
	return output.WriteOptions{Context: ctx, Say: func(msg string) { fmt.Fprintf(stderr, "rbscope heap: %s\n", msg) }}
}

// Command readfloor measures, on a live Ruby process, the two baselines
// scripts/bench-record.sh divides every cost by: one 8-byte
// process_vm_readv, and the floor of a sample, one batched read of every
// Ruby thread's control-frame region, both measured back to back (hot
// caches); and the paced floor, that batched read made once per tick at
// 100 Hz for 3 s by the sampler's own clock, in CPU time per tick (the
// least a 100 Hz recording can cost: wake-up, read, sleep). It prints
// "one_read_ns=N floor_ns=N paced_floor_ns=N threads=N bytes=N".
//
// With -pids PID,PID,... it measures the paced floor of an agent that
// reads them all on one clock: every process's batched read once per tick
// at -paced RATE (100 Hz by default) for 3 s, and prints "processes=N
// ticks=N late=N missed=N cpu_ns_per_tick=N".
//
// With -paced RATE it measures instead the timer floor at that rate: the
// floor read made once per tick for 3 s by the sampler's own clock and
// tick counting (both modes'), and prints "ticks=N late=N missed=N cpu_ns_per_tick=N":
// the late and missed ticks no sampler can avoid on this machine at that
// rate, since this one reads nothing else.
//
//	go run ./tools/readfloor [-paced RATE] PID [ITERATIONS]
//	go run ./tools/readfloor [-paced RATE] -pids PID,PID,...
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/rbscope/rbscope/internal/ruby"
	"github.com/rbscope/rbscope/internal/sampler"
	"github.com/rbscope/rbscope/internal/stack"
	"github.com/rbscope/rbscope/internal/target"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "readfloor:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("readfloor", flag.ContinueOnError)
	pacedRate := fs.Float64("paced", 0, "measure the timer floor at this rate (Hz) instead")
	pids := fs.String("pids", "", "measure the paced floor of reading all these processes on one clock")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *pids != "" {
		rate := *pacedRate
		if rate == 0 {
			rate = 100
		}
		return pacedMany(strings.Split(*pids, ","), rate)
	}
	args = fs.Args()
	if len(args) < 1 {
		return fmt.Errorf("usage: readfloor [-paced RATE] PID [ITERATIONS]")
	}
	pid, err := strconv.Atoi(args[0])
	if err != nil {
		return fmt.Errorf("pid %q: %w", args[0], err)
	}
	iters := 5000
	if len(args) > 1 {
		if iters, err = strconv.Atoi(args[1]); err != nil || iters <= 0 {
			return fmt.Errorf("iterations %q: must be a positive number", args[1])
		}
	}
	t, err := target.OpenLive(pid)
	if err != nil {
		return err
	}
	defer t.Close()
	p, err := ruby.Open(context.Background(), ruby.Spec{Target: t, Consistency: ruby.Running})
	if err != nil {
		return fmt.Errorf("open Ruby process %d: %w", pid, err)
	}
	regions, err := p.FrameRegions()
	if err != nil {
		return fmt.Errorf("find control-frame regions: %w", err)
	}
	if len(regions) == 0 {
		return fmt.Errorf("process %d has no Ruby thread with a stack", pid)
	}
	if *pacedRate > 0 {
		st, err := paced(t, regions, *pacedRate)
		if err != nil {
			return err
		}
		fmt.Printf("ticks=%d late=%d missed=%d cpu_ns_per_tick=%d\n", st.Ticks, st.Late, st.Missed,
			(st.CPU / time.Duration(st.Ticks)).Nanoseconds())
		return nil
	}
	bytes := 0
	for _, r := range regions {
		bytes += len(r.Buf)
	}
	one := []target.Read{{Addr: regions[0].Addr, Buf: make([]byte, 8)}}
	measure := func(reqs []target.Read) (time.Duration, error) {
		best := time.Duration(1 << 62)
		// The median of five rounds, each the mean of iters/5 reads.
		var rounds []time.Duration
		for r := 0; r < 5; r++ {
			start := time.Now()
			for i := 0; i < iters/5; i++ {
				if err := t.ReadBatch(reqs); err != nil {
					return 0, err
				}
			}
			d := time.Since(start) / time.Duration(iters/5)
			rounds = append(rounds, d)
			best = min(best, d)
		}
		sortDurations(rounds)
		return rounds[len(rounds)/2], nil
	}
	oneNS, err := measure(one)
	if err != nil {
		return fmt.Errorf("one read: %w", err)
	}
	floorNS, err := measure(regions)
	if err != nil {
		return fmt.Errorf("floor read: %w", err)
	}
	st, err := paced(t, regions, 100)
	if err != nil {
		return err
	}
	paced := st.CPU / time.Duration(st.Ticks)
	fmt.Printf("one_read_ns=%d floor_ns=%d paced_floor_ns=%d threads=%d bytes=%d\n",
		oneNS.Nanoseconds(), floorNS.Nanoseconds(), paced.Nanoseconds(), len(regions), bytes)
	return nil
}

// pacedMany prints the paced floor of reading every process of pids on
// one clock at rate.
func pacedMany(pids []string, rate float64) error {
	var reads [][]target.Read
	var targets []target.Target
	defer func() {
		for _, t := range targets {
			t.Close()
		}
	}()
	for _, s := range pids {
		pid, err := strconv.Atoi(s)
		if err != nil {
			return fmt.Errorf("pid %q: %w", s, err)
		}
		t, err := target.OpenLive(pid)
		if err != nil {
			return err
		}
		targets = append(targets, t)
		p, err := ruby.Open(context.Background(), ruby.Spec{Target: t, Consistency: ruby.Running})
		if err != nil {
			return fmt.Errorf("open Ruby process %d: %w", pid, err)
		}
		regions, err := p.FrameRegions()
		if err != nil {
			return fmt.Errorf("find control-frame regions of %d: %w", pid, err)
		}
		reads = append(reads, regions)
	}
	var readErr error
	st, err := sampler.Run(context.Background(), sampler.SourceFunc(func(context.Context) ([]stack.Sample, error) {
		for i, r := range reads {
			if err := targets[i].ReadBatch(r); err != nil && readErr == nil {
				readErr = err
			}
		}
		return nil, nil
	}), sampler.Config{Rate: rate, Duration: 3 * time.Second}, nil)
	if err == nil {
		err = readErr
	}
	if err != nil || st.Ticks == 0 {
		return fmt.Errorf("paced floor of %d processes at %g Hz: %v (%d ticks)", len(reads), rate, err, st.Ticks)
	}
	fmt.Printf("processes=%d ticks=%d late=%d missed=%d cpu_ns_per_tick=%d\n", len(reads), st.Ticks, st.Late, st.Missed,
		(st.CPU / time.Duration(st.Ticks)).Nanoseconds())
	return nil
}

// paced makes the floor read once per tick at rate for 3 s with the
// sampler's clock.
func paced(t target.Target, regions []target.Read, rate float64) (sampler.Stats, error) {
	var readErr error
	st, err := sampler.Run(context.Background(), sampler.SourceFunc(func(context.Context) ([]stack.Sample, error) {
		if err := t.ReadBatch(regions); err != nil && readErr == nil {
			readErr = err
		}
		return nil, nil
	}), sampler.Config{Rate: rate, Duration: 3 * time.Second}, nil)
	if err == nil {
		err = readErr
	}
	if err != nil || st.Ticks == 0 {
		return st, fmt.Errorf("paced floor at %g Hz: %v (%d ticks)", rate, err, st.Ticks)
	}
	return st, nil
}

func sortDurations(d []time.Duration) {
	for i := 1; i < len(d); i++ {
		for j := i; j > 0 && d[j] < d[j-1]; j-- {
			d[j], d[j-1] = d[j-1], d[j]
		}
	}
}

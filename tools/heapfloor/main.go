// Command heapfloor measures, on a live Ruby process, the floor of a heap
// census for scripts/bench-heap.sh: one plain copy of every heap page's
// bytes (the same spans rbscope heap reads, from the body header to the
// last slot) with process_vm_readv, in batches of 2 MiB into one reused
// buffer, nothing decoded. It prints the best of ITERATIONS as
// "floor_ns=N cpu_ns=N bytes=N pages=N".
//
//	go run ./tools/heapfloor PID [ITERATIONS]
package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/rbscope/rbscope/internal/heap"
	"github.com/rbscope/rbscope/internal/ruby"
	"github.com/rbscope/rbscope/internal/target"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "heapfloor:", err)
		os.Exit(1)
	}
}

func cpuNow() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func run(args []string) error {
	if len(args) < 1 {
		return fmt.Errorf("usage: heapfloor PID [ITERATIONS]")
	}
	pid, err := strconv.Atoi(args[0])
	if err != nil {
		return err
	}
	iters := 5
	if len(args) > 1 {
		if iters, err = strconv.Atoi(args[1]); err != nil {
			return err
		}
	}
	t, err := target.OpenLive(pid)
	if err != nil {
		return err
	}
	defer t.Close()
	p, err := ruby.Open(context.Background(), ruby.Spec{Target: t, Consistency: ruby.Running})
	if err != nil {
		return err
	}
	h, err := heap.Open(p)
	if err != nil {
		return err
	}
	pages, err := h.Pages()
	if err != nil {
		return err
	}
	const batch = 2 << 20
	buf := make([]byte, batch)
	var total uint64
	best, bestCPU := time.Duration(1<<62), time.Duration(0)
	for i := 0; i < iters; i++ {
		c0, t0 := cpuNow(), time.Now()
		total = 0
		var reqs []target.Read
		off := 0
		flush := func() error {
			err := t.ReadBatch(reqs)
			reqs, off = reqs[:0], 0
			return err
		}
		for _, pg := range pages {
			span := int(pg.Start + pg.Slots*pg.SlotSize - pg.Body)
			if off+span > batch {
				if err := flush(); err != nil {
					return err
				}
			}
			reqs = append(reqs, target.Read{Addr: pg.Body, Buf: buf[off : off+span]})
			off += span
			total += uint64(span)
		}
		if err := flush(); err != nil {
			return err
		}
		if d := time.Since(t0); d < best {
			best, bestCPU = d, cpuNow()-c0
		}
	}
	fmt.Printf("floor_ns=%d cpu_ns=%d bytes=%d pages=%d\n", best.Nanoseconds(), bestCPU.Nanoseconds(), total, len(pages))
	return nil
}

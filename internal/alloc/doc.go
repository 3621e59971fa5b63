// Package alloc counts a running Ruby process's object allocations, by
// class and by file:line, with eBPF — without touching the process's code.
//
// It attaches one small eBPF program (bpf/alloc.bpf.c, compiled by bpf2go
// and committed) to Ruby's USDT probes ruby:object__create, array__create,
// hash__create, string__create and symbol__create, and to the GC phase
// probes for GC time. The kernel increments each probe's semaphore while
// the program is attached, which is what makes Ruby fire the probes.
// Counts are aggregated in the kernel per (probe kind, class-name pointer,
// file-name pointer, line); user space reads the maps once per refresh and
// reads each distinct name pointer once from the target's memory. Rubies
// built without probes but with symbols fall back to uprobes on the entry
// of the exported allocation functions (rb_wb_protected_newobj_of, ...),
// which give the class but not the allocating file:line.
//
// Counting is exact by default. Sampling (1 in N events, in the kernel)
// and a duty cycle (attached for part of each second) trade precision for
// overhead; reports made that way are marked Estimated.
//
// Cost: every probe hit is a breakpoint trap, 1.0-1.2 µs on the
// development VM when idle (scripts/bench-alloc.sh; 2-7 µs under load),
// within 10-30% of bcc's uobjnew, which records no file:line. The trap, not the eBPF program, dominates, so in-kernel
// sampling keeps estimates unbiased but barely lowers the overhead; only
// the duty cycle does. Duty-cycle estimates scale by wall time, so they
// are accurate for steady workloads that are not themselves allocation-
// bound, and biased low for tight allocation loops, which run slower
// exactly while the probes are attached.
package alloc

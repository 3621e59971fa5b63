// Package alloc counts a running Ruby process's object allocations, by
// class, by file:line and by Ruby stack, with eBPF — without touching the
// process's code.
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
// # Modes
//
// Every probe hit is a breakpoint trap (about a microsecond), and Ruby
// builds a source location for every event once the semaphore is set, so
// an allocation-bound loop runs 10-20 times slower while the probes are
// attached, whatever the eBPF program does. The default mode therefore
// attaches them in short windows (DefaultDutyCycle of every
// DefaultDutyWindow, at a random phase) and scales the counts by Ruby's
// own allocation counter — the number GC.stat(:total_allocated_objects)
// returns — read from the process when each window opens and closes: the
// windows give the distribution, the counter the total. Unlike scaling by
// time, the total stays unbiased however much the probes slow the target,
// on tight, paced and bursty loads alike. The distribution needs one more
// thing: a window ends where the target is idle (untilQuiet), because one
// that ended on time ended inside a burst far more often than it began
// inside one, and kept the bursts' heads. It opens where the target is
// idle too (untilIdle). In retained mode, whose windows are longer and
// whose probes cost more, a window opens after a burst and the program
// ends it just before the next burst that starts like its first (the
// window mark: the same first event after the same last one), which keeps
// whole bursts even where the probes slow the target so much that it no
// longer idles while they are attached; a target that idles at no
// window's end opens its windows at a random point of its stream instead,
// and they end on time.
// A gate in the program (a one-entry
// map) makes the counted events and the counter's growth cover exactly
// the same span: attaching and detaching take milliseconds, during which
// the probes fire uncounted.
//
// The counter's address comes from DWARF (rb_vm_t.objspace, then
// rb_objspace_t.total_allocated_objects, or the sum over size_pools[] on
// 3.2+). Without DWARF (Debian's stripped libruby) it is found by
// calibration: among the words at the start of every block rb_vm_t points
// to, the one that never decreases and grows in every window by at least
// the number of heap objects the probes counted in it, by the least
// margin. The check goes on for every later window; a counter that fails
// it is dropped and the estimate falls back to scaling by time
// (Report.Scaling says which, Report.CounterSource where the counter came
// from). symbol__create is left out of the check: it also fires for
// static symbols, which are no heap objects.
//
// Exact mode (Options.Exact, `rbscope alloc --exact`) keeps the probes
// attached and counts every event.
//
// # The GC and exit probes
//
// The GC phase probes (gc__mark__begin, ...) fire a few times per GC, not
// per allocation: they stay attached from Attach to Stop in every mode,
// so that the GC counts and times are whole. So does the exit probe, a
// uprobe on the entry of ruby_vm_destruct, where Ruby's teardown frees
// the VM once the last Ruby code and finalizer have run: it copies Ruby's
// allocation counter (or, while that is still being found, the blocks
// holding its candidates) into a map, since a process that exits takes
// its memory with it, and the last counting window may be a whole duty
// window older than the exit. The program only reads the target's
// memory. A process that ends without Ruby's teardown (exit!, a fatal
// signal) keeps the counter's last read (Report.CounterEnd says which).
//
// # Stacks
//
// One in StackPeriod counted events copies, into a ring buffer, the
// running thread's execution context (vm->ractor.main_ractor->
// threads.running_ec: the allocating thread holds the GVL), its control
// frames and the top of its VM value stack. User space walks that copy
// with rbscope's walker (package ruby) through an overlay target that
// serves the copied ranges and reads everything else (iseqs, method
// entries, names) live. Each class's estimated count is split over its
// sampled stacks.
//
// # Retained objects
//
// Options.Retained (`rbscope alloc --retained`) tracks each counted
// object from its creation until a GC finds it dead, and reports those
// still alive at the end: see retained.go (how) and retsite.go (where the
// allocation a create probe precedes returns its object).
package alloc

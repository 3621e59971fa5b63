package ruby

import (
	"fmt"

	"github.com/rbscope/rbscope/internal/layout"
	"github.com/rbscope/rbscope/internal/stack"
	"github.com/rbscope/rbscope/internal/target"
)

// Where a thread's activity comes from.
//
// GVL ownership is read from the lock itself: the thread scheduler's
// running thread (rb_ractor_struct.threads.sched.running, 3.2+), the GVL's
// owner (rb_ractor_struct.threads.gvl.owner, 3.0-3.1; rb_vm_struct.gvl.owner,
// 2.6-2.7). The owner word lies in the ractor (or VM) struct the thread
// list reads anyway, so it costs no read of its own.
//
// A thread that does not own the GVL is told apart by Ruby's own status:
// every blocking region (IO, a C extension's rb_thread_call_without_gvl),
// sleep, Mutex, Queue and ConditionVariable sets it to stopped or
// stopped_forever before releasing the GVL, so a non-owner whose status is
// still "running" (runnable) is waiting for the GVL.
//
// GC state is rb_objspace's flags word: during_gc (set from gc_enter to
// gc_exit, so it covers incremental marking and lazy sweeping steps, as
// GC.stat(:time) does) and mode (marking, sweeping, compacting). It is one
// 4-byte read per snapshot.

// sizeofGVL is sizeof(rb_global_vm_lock_t) on x86_64 glibc in Ruby
// 2.6-3.1: owner, a pthread mutex (40), waitq (16), timer, timer_err and
// padding, two pthread conds (48 each), need_yield and wait_yield.
const sizeofGVL = 8 + 40 + 16 + 8 + 8 + 48 + 48 + 8

// activityOffsets are resolved once per process.
type activityOffsets struct {
	owner       fieldOff // rb_thread_t* that owns the GVL
	ownerInVM   bool     // owner is in rb_vm_struct (2.6-2.7), else in the ractor
	ownerSource string
	// waitq is the list of threads waiting for the GVL (3.0+: the
	// ractor's threads.gvl.waitq or threads.sched.readyq), whose nodes
	// live inside the waiting threads' rb_thread_t.
	waitq fieldOff

	objspace   uint64   // rb_objspace address, 0 when unknown
	flagsOff   uint64   // offset of the flags word in rb_objspace
	duringGC   fieldOff // bitfield within the flags word (offset 0)
	mode       fieldOff
	gcSource   string
	gcFlagsBuf [8]byte
}

// gcState is rb_objspace's state at one moment.
type gcState struct {
	known    bool
	duringGC bool
	mode     uint64 // 0 none, 1 marking, 2 sweeping, 3 compacting (3.3+)
}

// resolveActivity finds where the GVL owner and the GC flags are; what it
// cannot find is said in Info and leaves activity to Ruby's status and
// the kernel's view.
func (p *opener) resolveActivity() {
	a := &p.act
	l := p.rt.lay
	field := func(s, name string) fieldOff {
		fl, err := l.Field(s, name)
		if err != nil {
			return fieldOff{}
		}
		return fieldOff{off: fl.Offset, size: fl.Size, ok: true, bf: fl.Bitfield}
	}
	src := func(s, name string) string {
		fl, err := l.Field(s, name)
		if err == nil && fl.Source != "" {
			return fl.Source
		}
		return l.Source
	}
	ra, vm := "rb_ractor_struct", "rb_vm_struct"
	switch {
	case p.rt.gvlInSched:
		if a.owner = field(ra, "threads.sched.running"); a.owner.ok {
			a.ownerSource = fmt.Sprintf("%s.threads.sched.running (%s)", ra, src(ra, "threads.sched.running"))
			if a.waitq = field(ra, "threads.sched.readyq"); !a.waitq.ok {
				// rb_thread_sched: 3.2 has running, a pthread mutex, then
				// readyq; 3.3+ running, three bools, then readyq.
				off := a.owner.off + 8 + 40
				if p.rt.schedFlags {
					off = a.owner.off + 8 + 8
				}
				a.waitq = fieldOff{off: off, size: 16, ok: true}
			}
		}
	case p.rt.ractors:
		if a.owner = field(ra, "threads.gvl.owner"); a.owner.ok {
			a.ownerSource = fmt.Sprintf("%s.threads.gvl.owner (%s)", ra, src(ra, "threads.gvl.owner"))
			a.waitq = field(ra, "threads.gvl.waitq")
		} else if ec, bc := field(ra, "threads.running_ec"), field(ra, "threads.blocking_cnt"); ec.ok && bc.ok {
			// The tables lack the GVL: it sits between sleeper (after
			// blocking_cnt) and running_ec. Both ends must agree.
			fromStart := (bc.off + 4 + 4 + 7) &^ 7
			if fromEnd := ec.off - sizeofGVL; fromStart == fromEnd {
				a.owner = fieldOff{off: fromStart, size: 8, ok: true}
				a.waitq = fieldOff{off: fromStart + 8 + 40, size: 16, ok: true}
				a.ownerSource = fmt.Sprintf("%s.threads.gvl.owner at +%d, between threads.sleeper and threads.running_ec (%s)", ra, fromStart, l.Source)
			}
		}
	case p.rt.gvlOwnerInVM:
		a.ownerInVM = true
		if a.owner = field(vm, "gvl.owner"); a.owner.ok {
			a.ownerSource = fmt.Sprintf("%s.gvl.owner (%s)", vm, src(vm, "gvl.owner"))
		} else if mt := field(vm, "main_thread"); mt.ok && mt.off == 8+sizeofGVL {
			a.owner = fieldOff{off: 8, size: 8, ok: true}
			a.ownerSource = fmt.Sprintf("%s.gvl.owner at +8, between self and main_thread (%s)", vm, l.Source)
		}
	}
	if !a.owner.ok {
		a.ownerSource = "none: the layout does not locate the GVL owner; the running execution context and the kernel's task state stand in"
	} else if a.waitq.ok {
		a.ownerSource += fmt.Sprintf("; waiting threads from the list at +%d", a.waitq.off)
	}
	p.info.GVLSource = a.ownerSource
	if err := p.resolveGC(field); err != nil {
		a.objspace = 0
		a.gcSource = "none: " + err.Error()
	}
	p.info.GCSource = a.gcSource
}

// resolveGC finds rb_objspace and its flags: from DWARF when the layout
// has the struct, else (3.0-3.3 built-in tables) by finding the objspace
// pointer in the VM struct by its shape, with the flags at the offset
// Ruby's gc.c gives them in those versions.
func (p *opener) resolveGC(field func(s, name string) fieldOff) error {
	a := &p.act
	vm, err := p.w.currentVM()
	if err != nil {
		return fmt.Errorf("find the VM: %w", err)
	}
	var ptrOff fieldOff
	for _, name := range []string{"objspace", "gc.objspace"} {
		if ptrOff = field("rb_vm_struct", name); ptrOff.ok {
			break
		}
	}
	during := field("rb_objspace", "flags.during_gc")
	mode := field("rb_objspace", "flags.mode")
	if ptrOff.ok && during.ok && mode.ok {
		os, err := p.r.u64(vm + ptrOff.off)
		if err != nil {
			return fmt.Errorf("read rb_vm_struct.objspace: %w", err)
		}
		if !isHeapPtr(os) {
			return invalidf("rb_vm_struct.objspace is 0x%x", os)
		}
		a.objspace = os
		a.flagsOff = during.off
		if mode.off != during.off {
			return fmt.Errorf("rb_objspace flags.mode and flags.during_gc are in different words")
		}
		a.duringGC = fieldOff{off: 0, size: during.size, ok: true, bf: during.bf}
		a.mode = fieldOff{off: 0, size: mode.size, ok: true, bf: mode.bf}
		a.gcSource = fmt.Sprintf("dwarf: rb_vm_struct.objspace at +%d, rb_objspace.flags at +%d (%s)", ptrOff.off, during.off, p.rt.lay.Source)
		return nil
	}
	if !p.rt.ractors {
		return fmt.Errorf("no DWARF for rb_objspace and no built-in GC layout for Ruby %s", p.rt.version)
	}
	shape := objspaceShapeOf(p.rt.ver)
	off, os, err := p.scanObjspace(vm, shape)
	if err != nil {
		return err
	}
	a.objspace = os
	// The flags bitfield: mode:2, immediate_sweep, dont_gc,
	// dont_incremental, during_gc, ... (gc.c 3.0-3.3, gc/default/default.c
	// 3.4+).
	a.flagsOff = shape.flagsOff
	a.mode = fieldOff{off: 0, size: 4, ok: true, bf: &layout.Bitfield{BitOffset: 0, BitWidth: 2}}
	a.duringGC = fieldOff{off: 0, size: 4, ok: true, bf: &layout.Bitfield{BitOffset: 5, BitWidth: 1}}
	a.gcSource = fmt.Sprintf("scan: rb_vm_struct.objspace found at +%d by its shape, rb_objspace.flags at +%d (%s)", off, shape.flagsOff, shape.source)
	return nil
}

// objspaceShape is what an rb_objspace header looks like in a range of
// Ruby versions, for finding the objspace pointer without DWARF.
//
// 3.0-3.3 (gc.c): malloc_params {limit, increase}, the flags bitfield at
// +16, hook_events at +20, then (3.1+) next_object_id and, in 3.1,
// total_allocated_objects before the first size pool, whose slot_size is
// sizeof(RVALUE) = 40.
//
// 3.4+ (gc/default/default.c, the modular GC): malloc_params {limit,
// increase}, gc_config {bool full_mark} at +16 (the three bytes after it
// are padding: zero, the objspace is calloc'd), the flags at +20,
// hook_events at +24, next_object_id at +32, then heaps[0], whose short
// slot_size is BASE_SLOT_SIZE = 40, at +40.
type objspaceShape struct {
	flagsOff uint64
	source   string
	// match reports whether a header (hdrLen bytes) has this shape,
	// besides the malloc limit and the flag bits checked for every shape.
	match func(hdr []byte) bool
}

func objspaceShapeOf(ver int) objspaceShape {
	switch {
	case ver >= v(3, 4, 0):
		return objspaceShape{flagsOff: 20, source: "gc/default/default.c 3.4+", match: func(hdr []byte) bool {
			return hdr[16] <= 1 && hdr[17] == 0 && hdr[18] == 0 && hdr[19] == 0 &&
				le32(hdr, 24)&0xffff == 0 && le16(hdr, 40) == rvalueSize
		}}
	case ver >= v(3, 1, 0):
		return objspaceShape{flagsOff: 16, source: "gc.c 3.1-3.3", match: func(hdr []byte) bool {
			return le32(hdr, 20)&0xffff == 0 && (le64(hdr, 32) == rvalueSize || le64(hdr, 40) == rvalueSize)
		}}
	}
	return objspaceShape{flagsOff: 16, source: "gc.c 3.0", match: func(hdr []byte) bool {
		return le32(hdr, 20)&0xffff == 0
	}}
}

// Bounds every objspace header shares: malloc_params.limit lies between
// GC_MALLOC_LIMIT_MIN and GC_MALLOC_LIMIT_MAX (16 and 32 MiB unless
// RUBY_GC_MALLOC_LIMIT* say otherwise, hence the wide margins), and the
// flags word has no bit set past its dozen bitfields; hook_events holds
// only internal event bits (0xffff0000).
const (
	objspaceMinLimit = 1 << 20
	objspaceMaxLimit = 1 << 36
	objspaceFlagBits = 14
	rvalueSize       = 40
	objspaceHdrLen   = 48
)

// scanObjspace finds the rb_objspace pointer among the words of the VM
// struct: the one word that points at a header of the given shape. More
// than one candidate is an error, never a guess.
func (p *opener) scanObjspace(vm uint64, shape objspaceShape) (uint64, uint64, error) {
	size := p.rt.o.vmSize
	if size == 0 || size > 1<<20 {
		return 0, 0, fmt.Errorf("no rb_vm_struct size in layout %s", p.rt.lay.Source)
	}
	b, err := p.r.readOwned(vm, int(size))
	if err != nil {
		return 0, 0, fmt.Errorf("read the VM: %w", err)
	}
	var found []uint64
	var objspace uint64
	hdr := make([]byte, objspaceHdrLen)
	for off := uint64(0); off+8 <= size; off += 8 {
		ptr := le64(b, off)
		if !isHeapPtr(ptr) {
			continue
		}
		if err := p.t.ReadAt(hdr, ptr); err != nil {
			continue
		}
		limit, increase, flags := le64(hdr, 0), le64(hdr, 8), uint64(le32(hdr, shape.flagsOff))
		if limit < objspaceMinLimit || limit > objspaceMaxLimit || increase > objspaceMaxLimit ||
			flags>>objspaceFlagBits != 0 || !shape.match(hdr) {
			continue
		}
		found = append(found, off)
		objspace = ptr
	}
	switch len(found) {
	case 0:
		return 0, 0, fmt.Errorf("no word of rb_vm_struct points at an rb_objspace shaped as in %s", shape.source)
	case 1:
		return found[0], objspace, nil
	}
	return 0, 0, fmt.Errorf("%d words of rb_vm_struct look like the rb_objspace pointer (at %v)", len(found), found)
}

// gcRead is the read of the GC flags word, for a batch (ok is false when
// the flags are unknown); decodeGC decodes it once done.
func (p *walker) gcRead() (target.Read, bool) {
	a := &p.act
	if a.objspace == 0 {
		return target.Read{}, false
	}
	return target.Read{Addr: a.objspace + a.flagsOff, Buf: a.gcFlagsBuf[:a.duringGC.size]}, true
}

func (p *walker) decodeGC() gcState {
	a := &p.act
	buf := a.gcFlagsBuf[:a.duringGC.size]
	return gcState{known: true, duringGC: a.duringGC.u64(buf) != 0, mode: a.mode.u64(buf)}
}

// readGC reads the GC flags (one 4-byte read per snapshot; gcRead lets a
// batched reader fold it into its own request list).
func (p *walker) readGC() gcState {
	rq, ok := p.gcRead()
	if !ok {
		return gcState{}
	}
	if err := p.t.ReadAt(rq.Buf, rq.Addr); err != nil {
		return gcState{}
	}
	return p.decodeGC()
}

// ownerFrom decodes the GVL owner from the ractor (or VM) struct bytes.
func (p *walker) ownerFrom(b []byte, vmStruct bool) (uint64, bool) {
	a := &p.act
	if !a.owner.ok || a.ownerInVM != vmStruct || a.owner.off+8 > uint64(len(b)) {
		return 0, false
	}
	return a.owner.u64(b), true
}

// Pseudo-frames put on top of a thread's Ruby stack by its activity
// (walk copies them into each stack: these are never handed out).
var (
	gcFrames = [...][]stack.Frame{
		{{Name: stack.FrameGC, Kind: stack.KindGC}},
		{{Name: stack.FrameMarking, Kind: stack.KindGC}, {Name: stack.FrameGC, Kind: stack.KindGC}},
		{{Name: stack.FrameSweeping, Kind: stack.KindGC}, {Name: stack.FrameGC, Kind: stack.KindGC}},
		{{Name: stack.FrameCompacting, Kind: stack.KindGC}, {Name: stack.FrameGC, Kind: stack.KindGC}},
	}
	gvlWaitFrames = []stack.Frame{{Name: stack.FrameGVLWait, Kind: stack.KindGVL}}
)

// activity returns th's activity from GVL ownership, Ruby's status and
// the GC state, and the pseudo-frames that go on top of its Ruby stack (a
// thread without Ruby frames, one just starting, gets none: walk leaves
// them out, and it stays a sample that the outputs skip).
func activity(th *stack.Thread, ownerKnown, waiting bool, gc gcState) (stack.Activity, []stack.Frame) {
	switch {
	case th.GVL && gc.known && gc.duringGC:
		mode := 0
		if gc.mode >= 1 && gc.mode <= 3 {
			mode = int(gc.mode)
		}
		return stack.ActivityGC, gcFrames[mode]
	case th.GVL:
		return stack.ActivityRunning, nil
	case waiting || (ownerKnown && th.State == "running"):
		// In the GVL's wait list (also after a blocking region or a
		// sleep, whose status stays stopped until the GVL is back), or
		// runnable without it.
		return stack.ActivityGVLWait, gvlWaitFrames
	case th.State == "stopped" || th.State == "stopped_forever" || th.State == "killed" || th.State == "to_kill":
		return stack.ActivityBlocked, nil
	}
	// Runnable but the lock cannot be read: the kernel's view decides
	// (see KernelActivity).
	return stack.ActivityUnknown, nil
}

// KernelActivity completes a thread whose activity Ruby's state could not
// tell (ActivityUnknown) from the kernel's task state: a thread on a CPU
// ('R') is running, one asleep is blocked. Threads with a known activity
// are returned unchanged.
func KernelActivity(th *stack.Thread, kernelState byte) {
	if th.Activity != stack.ActivityUnknown || kernelState == 0 {
		return
	}
	if kernelState == 'R' {
		th.Activity = stack.ActivityRunning
	} else {
		th.Activity = stack.ActivityBlocked
	}
}

// markWaiters follows the GVL's wait list of the ractor at ra (whose
// struct is rb) through the thread structs already read, marking the
// threads in it. Each node lies inside a waiting thread's rb_thread_t, so
// the list costs no read; a node outside every listed thread (a list that
// changed under a nonblocking read) ends the walk.
func (p *walker) markWaiters(ra uint64, rb []byte, refs []threadRef) {
	a := &p.act
	if !a.waitq.ok || a.waitq.off+8 > uint64(len(rb)) {
		return
	}
	head := ra + a.waitq.off
	node := le64(rb, a.waitq.off)
	for i := 0; node != head && i <= len(refs); i++ {
		var ref *threadRef
		for j := range refs {
			if r := &refs[j]; node >= r.addr && node+8 <= r.addr+uint64(len(r.tb)) {
				ref = r
				break
			}
		}
		if ref == nil {
			return
		}
		ref.waiting = true
		node = le64(ref.tb, node-ref.addr)
	}
}

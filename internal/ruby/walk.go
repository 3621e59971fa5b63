package ruby

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/rbscope/rbscope/internal/stack"
	"github.com/rbscope/rbscope/internal/target"
)

// maxFrameBytes bounds the control-frame region read per thread (16k
// frames of 64 bytes).
const maxFrameBytes = 1 << 20

// Frame magic values in ep[0] (2.3+) and in cfp->flag (before 2.3).
const (
	magicMask = 0x7fff0001
	magicMeth = 0x11110001
	magicBlk  = 0x22220001
	magicCls  = 0x33330001
	magicTop  = 0x44440001
	magicCFn  = 0x55550001
	magicIFn  = 0x66660001
	magicEval = 0x77770001
	magicResc = 0x78880001
	magicDumy = 0x79990001

	oldMagicMask = 0xff
	oldMagicCFn  = 0x61
	oldMagicIFn  = 0x81

	envFlagLocal = 0x0002
)

// Ruby's internal thread statuses (enum rb_thread_status, 2.3+; before
// 2.3 THREAD_TO_KILL came first), by value. activity reads these.
var statusNames = []string{"running", "stopped", "stopped_forever", "killed"}

// Thread statuses in Thread#status's words, what stack.Thread.State holds.
const (
	StatusRun      = "run"      // runnable (whether or not it holds the GVL)
	StatusSleep    = "sleep"    // sleeping, waiting on IO, a lock, a join, a queue
	StatusAborting = "aborting" // being killed, still running (ensure clauses)
	StatusDead     = "dead"     // finished (Thread#status gives false or nil)
	StatusUnknown  = "unknown"  // the status could not be decoded
)

// rubyStatus returns Thread#status's word for the internal status name
// (statusNames, or "to_kill" before 2.3), and whether the thread is being
// killed (the to_kill flag: a runnable thread then says aborting, as
// thread.c's thread_status_name does).
func rubyStatus(internal string, toKill bool) string {
	switch internal {
	case "running":
		if toKill {
			return StatusAborting
		}
		return StatusRun
	case "stopped", "stopped_forever":
		return StatusSleep
	case "killed":
		return StatusDead
	case "to_kill":
		return StatusAborting
	}
	return StatusUnknown
}

// Snapshot returns every Ruby thread's stack, innermost frame first,
// read as the process was opened (Spec.Consistency).
func (p *Process) Snapshot() ([]stack.Thread, error) { return p.SnapshotWith(Req{}) }

// Req is how one snapshot may read the target: what holds still while it
// reads (Consistency; zero: as the process was opened) and, for
// HolderStopped, the thread the caller keeps stopped.
type Req struct {
	Consistency Consistency
	Holder      int
}

// SnapshotWith is Snapshot read as r says. With HolderStopped the caller
// keeps thread r.Holder stopped, and only it. When that thread holds the
// GVL the snapshot is as exact as one of a stopped process: only the
// GVL's holder runs Ruby code, so no other thread can change its frames
// (or any object the walker reads) until the holder lets the lock go,
// which a stopped thread does not. It returns a *HolderError, having read
// no frame, when r.Holder does not hold the GVL or that cannot be told
// (the layout does not locate the GVL's owner, or the process runs
// several ractors, each with a lock of its own).
func (p *Process) SnapshotWith(r Req) ([]stack.Thread, error) {
	stopped, holder, err := p.readsStopped(r)
	if err != nil {
		return nil, err
	}
	return p.w.snapshot(stopped, holder, 0)
}

// readsStopped checks r and says whether it has every Ruby thread
// stopped, and which thread alone is (HolderStopped; 0 otherwise: a
// Holder named with another consistency is not one).
func (p *Process) readsStopped(r Req) (stopped bool, holder int, err error) {
	switch r.Consistency {
	case 0:
		return p.stoppedAll, 0, nil
	case Running:
		return false, 0, nil
	case Stopped:
		return true, 0, nil
	case HolderStopped:
		if r.Holder <= 0 {
			return false, 0, fmt.Errorf("snapshot of process %d with a stopped GVL holder: no thread named (Req.Holder)", p.t.Pid())
		}
		return false, r.Holder, nil
	}
	return false, 0, fmt.Errorf("snapshot of process %d: unknown consistency %d", p.t.Pid(), r.Consistency)
}

// SnapshotThread is SnapshotWith for the one Ruby thread whose native
// thread is tid: the others' stacks are not read (alloc names the stack
// of the thread that allocated, copied by its probe, at each event).
func (p *Process) SnapshotThread(r Req, tid int) (stack.Thread, error) {
	stopped, holder, err := p.readsStopped(r)
	if err != nil {
		return stack.Thread{}, err
	}
	if tid <= 0 {
		return stack.Thread{}, fmt.Errorf("snapshot of a thread of process %d: no thread named", p.t.Pid())
	}
	ths, err := p.w.snapshot(stopped, holder, tid)
	if err != nil {
		return stack.Thread{}, err
	}
	if len(ths) != 1 {
		return stack.Thread{}, fmt.Errorf("thread %d of process %d: %w", tid, p.t.Pid(), ErrNoThread)
	}
	return ths[0], nil
}

// HolderError is a HolderStopped snapshot's error when the stopped thread did
// not hold the GVL.
type HolderError struct {
	Stopped int // the thread stopped
	// Holder is the thread that held the GVL instead (0: none, or not
	// known).
	Holder int
	// Why says why the snapshot could not be taken.
	Why string
}

func (e *HolderError) Error() string {
	return fmt.Sprintf("thread %d stopped, but %s", e.Stopped, e.Why)
}

// HolderKnown reports whether a snapshot can tell which thread holds the
// GVL (a HolderStopped snapshot can then succeed).
func (p *Process) HolderKnown() bool { return p.act.owner.ok }

// snapshot reads every thread's stack (only thread only, when not 0, or
// none when it is not a Ruby thread): stopped says every Ruby thread
// holds still; a holder (not 0) is the one thread the caller stopped,
// and the others hold still once it is seen to hold the GVL.
func (p *walker) snapshot(stopped bool, holder, only int) ([]stack.Thread, error) {
	p.scratch.reset()
	p.gcFresh = false
	p.regionsAt = 0
	// Until the holder is seen to hold the GVL, the other threads may run.
	p.stopped = stopped && holder == 0
	defer func() { p.stopped = p.stoppedAll }()
	p.guessing, p.guesses = !stopped && holder == 0 && only == 0, p.guesses[:0]
	refs, err := p.tickThreads()
	if err != nil {
		return nil, err
	}
	p.prefetchHeads(refs)
	if holder != 0 {
		if err := p.checkHolder(refs, holder); err != nil {
			return nil, err
		}
		p.stopped = true
	}
	if only != 0 {
		refs = p.onlyThread(refs, only)
	}
	p.prefetchRegions(refs)
	out := make([]stack.Thread, 0, len(refs))
	refreshed := false
	var gc gcState
	if p.gcFresh {
		gc = p.decodeGC()
	} else {
		gc = p.readGC()
	}
	if !gc.known || gc.duringGC || p.ractors > 1 {
		// A GC may be moving what the frames point to: the regions of
		// this tick are not kept for stillStack.
		p.regionsAt = 0
	}
	ownerKnown := p.act.owner.ok
	for _, ref := range refs {
		th, err := p.thread(ref, ownerKnown, gc)
		if err != nil {
			if target.IsExited(err) {
				return nil, err
			}
			if len(refs) == 1 {
				return nil, &StackError{Pid: p.t.Pid(), Addr: ref.addr, TID: th.TID, Name: th.Name, Activity: string(th.Activity), Err: err}
			}
			// One thread changing under us (created or ending) must not
			// cost the other threads' stacks.
			th.Error = fmt.Sprintf("read thread 0x%x: %v", ref.addr, err)
			th.Frames, th.Stack = nil, 0
		}
		if th.Name != "" {
			th.NameSource = stack.NameRuby
		} else if th.TID != 0 {
			// A thread without a Ruby name takes its native name; the
			// /proc listing is read only when a new thread needs it.
			if _, ok := p.osNames[th.TID]; !ok && !refreshed {
				refreshed = true
				p.refreshOSNames()
			}
			p.nameThread(&th, ref.addr, p.osNames[th.TID])
		}
		out = append(out, th)
	}
	return out, nil
}

// onlyThread returns the ref of refs whose native thread is tid (none
// when no Ruby thread runs on it), in scratch of its own.
func (p *walker) onlyThread(refs []threadRef, tid int) []threadRef {
	p.onlyRefs = p.onlyRefs[:0]
	for i := range refs {
		if p.refTID(&refs[i], refs[i].tb) == tid {
			p.onlyRefs = append(p.onlyRefs, refs[i])
			break
		}
	}
	return p.onlyRefs
}

// StackError is the error of a snapshot whose only thread could not be
// read, with what was read of the thread before its stack (the activity
// comes from the GVL and GC state: known even when the stack is not).
type StackError struct {
	Pid      int
	Addr     uint64 // the rb_thread_t
	TID      int    // 0 when not read
	Name     string
	Activity string // "" when not read
	Err      error
}

func (e *StackError) Error() string { return fmt.Sprintf("read thread 0x%x: %v", e.Addr, e.Err) }

// Unwrap returns the read's error.
func (e *StackError) Unwrap() error { return e.Err }

func (p *walker) refreshOSNames() {
	ths, err := p.t.Threads()
	if err != nil {
		return
	}
	names := make(map[int]string, len(ths))
	for _, t := range ths {
		names[t.TID] = t.Name
	}
	p.osNames = names
}

// thread reads one thread: its state, activity and stack (under the
// activity's pseudo-frames, see activity).
func (p *walker) thread(ref threadRef, ownerKnown bool, gc gcState) (stack.Thread, error) {
	o := &p.rt.o
	tb := ref.tb
	if tb == nil {
		var err error
		if tb, err = p.r.readOwned(ref.addr, int(o.thSize)); err != nil {
			return stack.Thread{}, fmt.Errorf("read rb_thread_t: %w", err)
		}
	}
	th, internal, prefix := p.threadState(ref, tb, ownerKnown, gc)
	stackStart, stackSize, cfp, ec, err := p.stackBounds(ref, tb)
	if err != nil {
		return th, err
	}
	if cfp == 0 && (stackStart == 0 || internal == "killed") {
		// A thread being created (no VM stack yet) or already dead.
		return th, nil
	}
	cfpAddr := uint64(0)
	if ec != 0 {
		cfpAddr = ec + o.ecCFP.off
	} else if o.thCFP.ok {
		cfpAddr = ref.addr + o.thCFP.off
	}
	var pre []byte
	if ref.region != nil {
		// Read by prefetchRegions; a running thread's cfp may have moved since
		// its execution context was read.
		pre, cfp = ref.region, ref.regionCFP
	} else if ref.regionTorn {
		// The batched read found the stack changing: read it again from
		// its latest cfp.
		p.tornReads++
		cfp = ref.regionCFP
	}
	if pre != nil {
		if k, ok := p.sameStack(ref.addr, cfp, pre, prefix); ok {
			if !ref.still {
				// The same bytes, read again by this tick's batch: the
				// kept copy stands from this batch on (see stillStack).
				k.readAt, k.tid = p.regionsAt, th.TID
			}
			th.Frames, th.Stack = k.frames, k.id
			return th, nil
		}
	}
	misses := p.incomplete
	frames, err := p.walk(stackStart, stackSize, cfp, cfpAddr, pre, prefix)
	walked := pre // the region the frames were named from, if read by prefetchRegions
	for retry := 0; retry < maxTornWalks && errors.Is(err, ErrTorn) && cfpAddr != 0; retry++ {
		// The stack changed while its environments or method entries
		// were read: read it again from its current cfp.
		walked = nil
		if cfp, err = p.r.u64(cfpAddr); err == nil {
			frames, err = p.walk(stackStart, stackSize, cfp, cfpAddr, nil, prefix)
		}
	}
	if errors.Is(err, ErrTorn) {
		// Still changing after every read: keep the sample, with what held
		// still under a marker frame (tornFrames). Dropping it would lean
		// the profile away from Ruby code, whose frames change all the
		// time, towards C functions that push none.
		frames, err = p.tornFrames(stackStart, stackSize, cfpAddr, err, prefix), nil
		walked = nil
	}
	if cap(frames) > cap(p.frameBuf) {
		p.frameBuf = frames[:0]
	}
	if err != nil || p.incomplete != misses || ref.still {
		// (A kept region walked again, its stack not trusted: it is not
		// kept again, as if read by this tick's batch, which began after
		// stillStack looked.)
		walked = nil
	}
	if k := p.keepFrames(ref.addr, frames, walked, cfp, len(prefix), th.TID); k != nil {
		th.Frames, th.Stack = k.frames, k.id
	}
	if err != nil {
		if len(frames) == 0 || target.IsExited(err) {
			return th, err
		}
		// Keep the frames read so far and say why the stack stops.
		th.Error = err.Error()
	}
	return th, nil
}

// threadState reads thread ref's state from its rb_thread_t tb: status,
// activity (and the pseudo-frames it puts on top of the stack), native
// thread and name; and Ruby's internal status name.
func (p *walker) threadState(ref threadRef, tb []byte, ownerKnown bool, gc gcState) (th stack.Thread, internal string, prefix []stack.Frame) {
	o := &p.rt.o
	th = stack.Thread{Main: ref.main, GVL: ref.gvl}
	internal = "unknown"
	if st := o.thStatus.u64(tb); !p.rt.epFrames {
		// Older Rubies have THREAD_TO_KILL first.
		if st == 0 {
			internal = "to_kill"
		} else if int(st-1) < len(statusNames) {
			internal = statusNames[st-1]
		}
	} else if int(st) < len(statusNames) {
		internal = statusNames[st]
	}
	// activity reads Ruby's internal status; the thread reports
	// Thread#status's.
	th.State = internal
	th.Activity, prefix = activity(&th, ownerKnown, ref.waiting, gc)
	th.State = rubyStatus(internal, o.thToKill.u64(tb) != 0)
	th.TID = p.refTID(&ref, tb)
	th.ThreadID = ref.addr
	if o.thName.ok {
		if nv := o.thName.u64(tb); isHeapPtr(nv) {
			th.Name = p.threadName(nv)
		}
	}
	return th, internal, prefix
}

// stackBounds returns thread ref's VM stack (start and size), its current
// control frame, and its execution context (0 before 2.5), from its
// rb_thread_t tb and execution context.
func (p *walker) stackBounds(ref threadRef, tb []byte) (stackStart, stackSize, cfp, ec uint64, err error) {
	o := &p.rt.o
	if o.thEC.ok {
		ec = o.thEC.u64(tb)
		if !isHeapPtr(ec) {
			return 0, 0, 0, 0, invalidf("thread has execution context 0x%x", ec)
		}
		eb := ref.eb
		if eb == nil {
			if eb, err = p.r.read(ec, p.ecHeadSize()); err != nil {
				return 0, 0, 0, 0, fmt.Errorf("read execution context: %w", err)
			}
		}
		stackStart, stackSize, cfp = o.ecVMStack.u64(eb), o.ecVMStackSize.u64(eb), o.ecCFP.u64(eb)
	} else {
		stackStart, stackSize, cfp = o.thStack.u64(tb), o.thStackSize.u64(tb), o.thCFP.u64(tb)
	}
	return stackStart, stackSize, cfp, ec, nil
}

// tornFrame is the frame on top of a stack that kept changing while it was
// read: the frames that did not hold still are unknown.
var tornFrame = stack.Frame{Name: stack.FrameTorn, Kind: stack.KindTorn}

// tornFrames returns the stack of a thread that could not be read
// consistently (err, an ErrTorn): prefix, the marker frame tornFrame, then
// the outer frames that held still while it was read (see stableOuter), or
// none when they cannot be named without tearing too.
func (p *walker) tornFrames(stackStart, stackSize, cfpAddr uint64, err error, prefix []stack.Frame) []stack.Frame {
	var te *tornError
	var outer []stack.Frame
	if errors.As(err, &te) && te.region != nil {
		if fr, err := p.walk(stackStart, stackSize, te.cfp, cfpAddr, te.region, nil); err == nil {
			outer = fr
		}
	}
	// outer is the walker's scratch (p.frameBuf): copied.
	frames := make([]stack.Frame, 0, len(prefix)+1+len(outer))
	frames = append(append(frames, prefix...), tornFrame)
	return append(frames, outer...)
}

// glibcPthreadTID is the offset of the kernel tid in glibc's struct
// pthread on x86_64 (stable since glibc 2.x); pthread_t is its address.
const glibcPthreadTID = 0x2d0

// refTID is the native thread id of the thread ref (whose struct is tb),
// as this host knows it, 0 when it cannot be read. Ruby keeps the id its
// own PID namespace gives the thread: in a container, another id than
// this host's, and one that may name another process here.
func (p *walker) refTID(ref *threadRef, tb []byte) int {
	tid := 0
	if ref.haveTID {
		tid = int(int32(le32(ref.tid[:], 0)))
	} else if tb != nil {
		tid = p.threadTID(tb)
	}
	if tid != 0 {
		tid = p.t.HostTID(tid)
	}
	if tid == 0 && ref.main {
		tid = p.t.Pid()
	}
	return tid
}

func (p *walker) threadTID(tb []byte) int {
	o := &p.rt.o
	switch {
	case o.thTID.ok:
		if tid := o.thTID.u64(tb); tid != 0 {
			return int(int32(tid))
		}
	case o.thNT.ok && p.rt.o.ntTID.ok:
		if nt := o.thNT.u64(tb); isHeapPtr(nt) {
			if v, err := p.r.u32(nt + p.rt.o.ntTID.off); err == nil && v != 0 {
				return int(int32(v))
			}
		}
	}
	if o.thThreadID.ok {
		if pt := o.thThreadID.u64(tb); isHeapPtr(pt) {
			if v, err := p.r.u32(pt + glibcPthreadTID); err == nil && v != 0 && v < 1<<22 {
				return int(v)
			}
		}
	}
	return 0
}

// frameData is what the walker reads about one control frame, batched
// across the whole stack.
type frameData struct {
	cf      []byte
	ep      uint64
	epData  [24]byte // ep[-2] (method entry or cref), ep[-1] (prev ep), ep[0] (flags)
	iseqHdr [24]byte // flags, wrapper, body of the iseq
	meHdr   [24]byte // flags and the next two words of ep[-2]
}

// walk reads the control frames from cfp (innermost) to the end of the VM
// stack (unless pre holds them, read by prefetchRegions) and names them. Reads
// are batched: the frames in one call, then every frame's environment and
// iseq header that changed in one process_vm_readv, then the method
// entries they point to in another. The frames returned start with prefix
// (the activity's pseudo-frames) when the stack has any frame, so that
// they are not copied again to be prepended.
func (p *walker) walk(stackStart, stackSize, cfp, cfpAddr uint64, pre []byte, prefix []stack.Frame) ([]stack.Frame, error) {
	o := &p.rt.o
	p.walks++
	buf := pre
	if buf == nil {
		var err error
		if buf, cfp, err = p.readFrames(stackStart, stackSize, cfp, cfpAddr); err != nil {
			return nil, err
		}
	}
	fds, cached, slots, top, err := p.frameHeaders(buf, stackStart, stackSize, cfp)
	if err != nil {
		return nil, err
	}
	// Environments of this stack by address, for block frames whose
	// method entry is in an outer frame's environment: indexed when first
	// needed (see env).
	p.walkFds, p.envsIndexed, p.envSuspect = fds, false, false
	frames := append(p.frameBuf[:0], prefix...) // copied by keepFrames
	pending := p.pendingBuf[:0]                 // C frames waiting for their Ruby caller's path/line
	for i := range fds {
		// A slot whose frame is unchanged (cached) with the same pc names
		// the same frame: the name from last time stands.
		e := &slots[top-i]
		pc := o.cfpPC.u64(fds[i].cf)
		var fr stack.Frame
		var ok bool
		var err error
		if cached[i] && e.named && e.namedPC == pc {
			fr, ok, p.frameDone = e.fr, e.frOK, e.frDone
		} else {
			misses := p.incomplete
			if fr, ok, err = p.frame(&fds[i]); err == nil {
				// A name decoded without all it needs is not kept (see
				// caches.incomplete).
				e.named, e.namedPC, e.fr, e.frOK, e.frDone = p.incomplete == misses, pc, fr, ok, p.frameDone
			}
		}
		if errors.Is(err, ErrTorn) {
			dropSlots(slots, top, len(fds))
			return nil, err
		}
		if err != nil {
			return frames, fmt.Errorf("frame %d: %w", len(frames), err)
		}
		if !ok {
			continue
		}
		if i > 0 && p.frameDone && !p.stopped {
			// A frame past its last instruction (leave) is being popped:
			// it cannot have a callee. A running thread returned while
			// its stack was copied.
			p.tornReads++
			dropSlots(slots, top, len(fds))
			return nil, ErrTorn
		}
		if fr.Kind == stack.KindRuby && strings.HasPrefix(fr.Path, stack.InternalPrefix) {
			// A method defined inside Ruby (Kernel#loop, Integer#times
			// on 3.3) is named as Ruby 3.4 names it, as a C function:
			// at its Ruby caller's path and line.
			fr.InternalPath, fr.InternalLine = fr.Path, fr.Line
			fr.Path, fr.Line = "", 0
		}
		if fr.AtCaller() {
			pending = append(pending, len(frames))
		} else if fr.Kind == stack.KindRuby {
			for _, i := range pending {
				frames[i].Path, frames[i].Line = fr.Path, fr.Line
			}
			pending = pending[:0]
		}
		frames = append(frames, fr)
	}
	for _, i := range pending {
		// No Ruby caller outside Ruby itself: an internal frame keeps
		// its own place.
		if f := &frames[i]; f.InternalPath != "" {
			f.Path, f.Line = f.InternalPath, f.InternalLine
		}
	}
	p.pendingBuf = pending[:0]
	if p.envSuspect {
		dropSlots(slots, top, len(fds))
	}
	if len(frames) == len(prefix) {
		// No frame: a thread just starting gets no pseudo-frames either.
		return frames[:0], nil
	}
	return frames, nil
}

// frameHeaders reads what naming the frames in buf (the control frames
// from cfp to the end of the VM stack at stackStart) needs beyond them:
// each frame's environment, iseq header and method entry, from the
// stack's slot cache when the frame is the one seen in its slot before
// (cached), else in two batched reads; and checks the cached names of
// the frames read anew (checkNames). slots is the stack's slot cache,
// slot top-i holding frame i.
func (p *walker) frameHeaders(buf []byte, stackStart, stackSize, cfp uint64) (fds []frameData, cached []bool, slots []slotEntry, top int, err error) {
	o := &p.rt.o
	n := uint64(len(buf))
	count := int(n / o.cfpSize)
	// Scratch reused across snapshots (a Process is not for concurrent use).
	if cap(p.fdsBuf) < count {
		p.fdsBuf = make([]frameData, count)
		p.cachedBuf = make([]bool, count)
	}
	fds, cached = p.fdsBuf[:count], p.cachedBuf[:count]
	for i := range fds {
		fds[i] = frameData{}
		cached[i] = false
	}
	modern := p.rt.epFrames
	reqs := p.reqBuf[:0]
	// The slot cache of this VM stack, indexed by slot from the stack's
	// end: slot top-i is frame i.
	end := stackStart + stackSize*8
	top = int((end - cfp) / o.cfpSize)
	slots = p.stackSlots(end, top+1)
	for i := range fds {
		fd := &fds[i]
		fd.cf = buf[uint64(i)*o.cfpSize : uint64(i+1)*o.cfpSize]
		fd.ep = o.cfpEP.u64(fd.cf)
		if modern && !isHeapPtr(fd.ep) {
			return nil, nil, nil, 0, fmt.Errorf("frame %d: %w", i, invalidf("control frame has ep 0x%x", fd.ep))
		}
		// A frame whose iseq, self, environment and block are those seen
		// in this slot before is the same frame (only its pc moves): its
		// environment, iseq header and method entry are not read again.
		if e := &slots[top-i]; e.gen == p.epoch && e.key == slotKeyOf(o, fd.cf) {
			fd.epData, fd.iseqHdr, fd.meHdr = e.epData, e.iseqHdr, e.meHdr
			cached[i] = true
			continue
		}
		if modern {
			reqs = append(reqs, target.Read{Addr: fd.ep - 16, Buf: fd.epData[:]})
		}
		if iseq := o.cfpIseq.u64(fd.cf); o.iseqBody.ok && isHeapPtr(iseq) {
			reqs = append(reqs, target.Read{Addr: iseq, Buf: fd.iseqHdr[:]})
		}
	}
	if err := p.batch(reqs); err != nil {
		return nil, nil, nil, 0, fmt.Errorf("read frame environments: %w", err)
	}
	if modern {
		reqs = reqs[:0]
		for i := range fds {
			if me := le64(fds[i].epData[:], 0); !cached[i] && isHeapPtr(me) {
				reqs = append(reqs, target.Read{Addr: me, Buf: fds[i].meHdr[:]})
			}
		}
		if err := p.batch(reqs); err != nil {
			return nil, nil, nil, 0, fmt.Errorf("read method entries: %w", err)
		}
	}
	p.reqBuf = reqs[:0]
	if modern {
		p.checkNames(fds, cached)
	}

	for i := range fds {
		if !cached[i] {
			fd := &fds[i]
			slots[top-i] = slotEntry{key: slotKeyOf(o, fd.cf), gen: p.epoch, epData: fd.epData, iseqHdr: fd.iseqHdr, meHdr: fd.meHdr}
		}
	}
	return fds, cached, slots, top, nil
}

// checkNames checks, in one batched read, the witnesses of the cached
// names (iseqs, method owners, C functions) of the frames read anew that
// were cached before the last GC (see witness.go): after a GC, naming a
// stack then costs one read instead of one per name.
func (p *walker) checkNames(fds []frameData, cached []bool) {
	ws := p.checkWits[:0]
	todo := p.checkTodo[:0] // what ws[k] is the witness of
	seen := func(kind byte, key uint64) bool {
		for _, t := range todo {
			if t.kind == kind && t.key == key {
				return true
			}
		}
		return false
	}
	for i := range fds {
		if cached[i] {
			continue
		}
		fd := &fds[i]
		if hdr := fd.iseqHdr[:]; p.rt.o.iseqBody.ok {
			flags := le64(hdr, 0)
			if flags&tMask == tImemo && (flags>>flUShift)&0x0f == imemoIseq {
				iseq := p.rt.o.cfpIseq.u64(fd.cf)
				if c := p.iseqCache[iseq]; c != nil && c.gen != p.epoch && c.body == p.rt.o.iseqBody.u64(hdr) &&
					!c.wit.empty() && !seen(checkIseq, iseq) {
					todo = append(todo, nameCheck{checkIseq, iseq})
					ws = append(ws, c.wit)
				}
			}
		}
		me := le64(fd.epData[:], 0)
		if !isHeapPtr(me) {
			continue
		}
		if c, ok := p.ownerCache[me]; ok && c.gen != p.epoch && !c.wit.empty() && !seen(checkOwner, me) {
			todo = append(todo, nameCheck{checkOwner, me})
			ws = append(ws, c.wit)
		}
		if c, ok := p.cfuncCache[me]; ok && c.gen != p.epoch && !c.wit.empty() && !seen(checkCFunc, me) {
			todo = append(todo, nameCheck{checkCFunc, me})
			ws = append(ws, c.wit)
		}
	}
	p.checkWits, p.checkTodo = ws[:0], todo[:0]
	if len(ws) == 0 {
		return
	}
	ok := p.n.unchangedAll(ws, p.checkOK[:0])
	p.checkOK = ok[:0]
	for k, t := range todo {
		if !ok[k] {
			continue
		}
		switch t.kind {
		case checkIseq:
			p.iseqCache[t.key].gen = p.epoch
		case checkOwner:
			c := p.ownerCache[t.key]
			c.gen = p.epoch
			p.ownerCache[t.key] = c
		case checkCFunc:
			c := p.cfuncCache[t.key]
			c.gen = p.epoch
			p.cfuncCache[t.key] = c
		}
	}
}

// nameCheck is a cached name whose witness checkNames reads: its cache
// (one of checkIseq, checkOwner, checkCFunc) and key.
type nameCheck struct {
	kind byte
	key  uint64
}

const (
	checkIseq byte = iota
	checkOwner
	checkCFunc
)

// maxLastFrames bounds the stacks kept by keepFrames.
const maxLastFrames = 1 << 14

// maxKeptBytes bounds the bytes of the control-frame regions kept by
// keepFrames (all threads together).
const maxKeptBytes = 4 << 20

// keptStack is a thread's stack of the last snapshot and, when it was
// named from a region read by prefetchRegions, that region (a copy), where it
// started and in which GC epoch, and how many pseudo-frames lead it.
// trusted says that the last two walks named the same region alike.
type keptStack struct {
	frames    []stack.Frame
	id        stack.ID // frames' identity
	region    []byte
	regionOK  bool
	trusted   bool
	cfp       uint64
	epoch     uint64
	prefixLen int
	// readAt is when the batch that read region began, on the OffCPUWatch's
	// clock, and tid the thread it was read for (0: not read by a batch
	// in a GC-free moment; see stillStack).
	readAt int64
	tid    int
}

// keepFrames returns the thread's kept stack, holding frames (which are
// scratch) in a stack of its own: the thread's stack of the last snapshot,
// with its ID, when it is the same (threads that wait, and most that run,
// show the same stack tick after tick, and sharing it costs no allocation;
// nothing modifies a stack once returned), else a copy with a new ID,
// remembered for the next snapshot with the region it was named from (nil:
// none to compare with next time; see sameStack). It returns nil for no
// frames.
func (p *walker) keepFrames(thread uint64, frames []stack.Frame, region []byte, cfp uint64, prefixLen, tid int) *keptStack {
	if len(frames) == 0 {
		return nil
	}
	k := p.lastFrames[thread]
	if k == nil {
		if p.lastFrames == nil || len(p.lastFrames) >= maxLastFrames {
			p.lastFrames = map[uint64]*keptStack{}
			p.keptBytes = 0
		}
		k = &keptStack{}
		p.lastFrames[thread] = k
	}
	same := slices.Equal(k.frames, frames) // a new k has no frames: never the same
	if !same {
		k.frames, k.id = slices.Clone(frames), stack.NewID()
	}
	k.trusted = region != nil && same && k.holds(region, cfp, p.epoch, prefixLen)
	k.regionOK = false
	if region != nil && (len(region) <= cap(k.region) || p.keptBytes+len(region) <= maxKeptBytes) {
		if len(region) > cap(k.region) {
			p.keptBytes += len(region) - cap(k.region)
		}
		k.region = append(k.region[:0], region...)
		k.regionOK, k.cfp, k.epoch, k.prefixLen = true, cfp, p.epoch, prefixLen
		k.readAt, k.tid = p.regionsAt, tid
	} else {
		k.trusted = false
	}
	if !k.regionOK {
		k.readAt, k.tid = 0, 0
	}
	return k
}

// sameStack returns the thread's kept stack of the last snapshot when it
// stands as it is: its control frames are the same bytes from the same
// cfp, no GC ran since (the names read through them are those of the same
// objects), its pseudo-frames are prefix, and the last two walks of those
// bytes named them alike. A thread that waits (most of them, in most
// processes) is then named without a walk. (One walk is not trusted: the
// environments and method entries it reads after the frames can be a
// running thread's next frames', and a thread that then waits would show
// such a name tick after tick.)
func (p *walker) sameStack(thread, cfp uint64, region []byte, prefix []stack.Frame) (*keptStack, bool) {
	k := p.lastFrames[thread]
	if k == nil || !k.trusted || !k.holds(region, cfp, p.epoch, len(prefix)) || !slices.Equal(k.frames[:k.prefixLen], prefix) {
		return nil, false
	}
	return k, true
}

// holds reports whether the region kept is region, read from cfp in GC
// epoch epoch, under prefixLen pseudo-frames.
func (k *keptStack) holds(region []byte, cfp, epoch uint64, prefixLen int) bool {
	return k.regionOK && k.cfp == cfp && k.epoch == epoch && k.prefixLen == prefixLen && string(k.region) == string(region)
}

// ErrTorn reports a stack that kept changing while it was read (a running
// thread read without pausing it): no consistent copy was obtained.
var ErrTorn = fmt.Errorf("%w: the stack changed while it was read", ErrInconsistent)

// maxTornWalks bounds the walks of a thread whose stack changed during one.
// On the Rails fixture under load (scripts/rails-app.sh) 6.5 % of samples
// were still torn after 2 walks, 1.5 % after 6, 0.7 % after 12.
const maxTornWalks = 12

// maxStackReads bounds the reads of a stack that changes under the walker
// (re-reads copy only the frames inner to those that held still, a few
// slots): on the Rails fixture 12.5 % of samples were still torn after 6,
// 0.2 to 0.7 % after 24.
const maxStackReads = 24

// Torn returns how many stack reads found the stack changing (and read it
// again) since the process was opened.
func (p *Process) Torn() uint64 { return p.tornReads }

// readFrames reads the control frames from cfp (innermost) to the end of
// the VM stack. A running thread pushes and pops frames while they are
// copied, and the kernel copies them in order, so one copy can hold a
// frame that was already gone with callers that had moved on. Unless the
// target is stopped, one system call reads the thread's cfp (at cfpAddr),
// the frames, the cfp, the frames again and the cfp again (see settle);
// the frames are read from a few slots below cfp (frameSpan), so that a
// thread that pushed or popped a frame or two since its cfp was read is
// still caught whole. Otherwise they are read again from the latest cfp, up to
// maxStackReads times: after a torn read only the frames inner to those
// that held still (stableOuter) and the innermost of these, joined to
// them when it is unchanged. Then a *tornError (an ErrTorn) carries the
// frames that held still, which thread keeps under tornFrame. Two
// checks in walk and frame catch what slips through (a copy taken twice in
// the same torn state): a frame that has a callee cannot be past its last
// instruction, and a method's frame always has a method entry in its
// environment chain.
func (p *walker) readFrames(stackStart, stackSize, cfp, cfpAddr uint64) ([]byte, uint64, error) {
	end := stackStart + stackSize*8
	check := !p.stopped && cfpAddr != 0
	sz := p.rt.o.cfpSize
	// The outer frames found holding still by a torn read, from stableAt
	// (see stableOuter): the reads that follow copy only the frames inner
	// to them and their innermost one, which must not have changed.
	var stable []byte
	var stableAt uint64
	for reads := 0; ; reads++ {
		if cfp == 0 || stackStart == 0 || cfp < stackStart || cfp > end {
			return nil, 0, invalidf("control frame 0x%x outside VM stack 0x%x+%d", cfp, stackStart, stackSize)
		}
		lo, n := p.frameSpan(stackStart, end, cfp, check)
		if stable != nil {
			if lo < stableAt {
				n = stableAt + sz - lo
			} else {
				stable = nil
			}
		}
		buf := p.scratch.take(int(n))
		if !check || n == 0 {
			if err := p.t.ReadAt(buf, cfp); err != nil {
				return nil, 0, fmt.Errorf("read control frames: %w", err)
			}
			return buf, cfp, nil
		}
		if cap(p.copy2) < int(n) {
			p.copy2 = make([]byte, n)
		}
		first := p.copy2[:n]
		cfps := &p.frameCFPs
		reqs := framedReads(p.frameReqs[:0], cfpAddr, lo, first, buf, cfps, true)
		p.frameReqs = reqs[:0]
		if err := p.t.ReadBatch(reqs); err != nil {
			return nil, 0, fmt.Errorf("read control frames: %w", err)
		}
		region, at, ok := p.settle(lo, end, *cfps, true, first, buf)
		if ok && stable != nil {
			// The copies end with the innermost stable frame: still the
			// same, the frames read are joined to the stable ones.
			ok = at <= stableAt && string(region[len(region)-int(sz):]) == string(stable[:sz])
			if ok {
				whole := p.scratch.take(min(len(region)-int(sz)+len(stable), maxFrameBytes))
				copy(whole[copy(whole, region[:len(region)-int(sz)]):], stable)
				region = whole[:len(whole)-len(whole)%int(sz)]
			}
		}
		if ok {
			return region, at, nil
		}
		p.tornReads++
		outer, outerAt := p.stableOuter(lo, end, *cfps, first, buf)
		switch {
		case outer == nil:
			stable = nil
		case stable == nil:
			stable, stableAt = outer, outerAt
		case string(outer[len(outer)-int(sz):]) != string(stable[:sz]):
			// The innermost stable frame changed: read it all again.
			stable = nil
		default:
			joined := p.scratch.take(len(outer) - int(sz) + len(stable))
			copy(joined[copy(joined, outer[:len(outer)-int(sz)]):], stable)
			stable, stableAt = joined, outerAt
		}
		if reads+1 >= maxStackReads {
			if stable != nil && len(stable) > maxFrameBytes {
				stable = stable[:maxFrameBytes-maxFrameBytes%int(sz)]
			}
			return nil, 0, &tornError{region: stable, cfp: stableAt}
		}
		cfp = le64(cfps[2][:], 0)
	}
}

// tornError is the ErrTorn of a stack whose copies never agreed, with the
// part of it known to have held still (see stableOuter): the frames from
// cfp outwards, region (nil when no frame held still).
type tornError struct {
	region []byte
	cfp    uint64
}

func (e *tornError) Error() string { return ErrTorn.Error() }

// Unwrap makes a tornError an ErrTorn.
func (e *tornError) Unwrap() error { return ErrTorn }

// stableOuter returns the outer part of a stack whose two copies (first,
// then second, read from lo, framed by the cfp reads cfps) did not settle:
// the frames outer to every cfp read (callers throughout the copies) that
// are the same bytes in both copies, from the innermost of them out to the
// end of the copies, and where that part starts. A running thread changes
// its innermost frames; the frames under the lowest one it returned to
// while it was read are its callers all along and hold still. (A thread
// that returned below them and called back in the same frames between two
// cfp reads would pass, as it would settle's check.) nil when no frame
// held still.
func (p *walker) stableOuter(lo, end uint64, cfps [3][8]byte, first, second []byte) ([]byte, uint64) {
	sz := p.rt.o.cfpSize
	outer := lo
	for _, c := range cfps {
		at := le64(c[:], 0)
		if at < lo || at >= end || (at-lo)%sz != 0 {
			return nil, 0
		}
		outer = max(outer, at)
	}
	// Strictly outer to every cfp read: the frame a cfp pointed at was
	// running and its pc moving.
	off := outer - lo + sz
	n := uint64(min(len(first), len(second)))
	if off >= n {
		return nil, 0
	}
	n -= (n - off) % sz
	// The innermost slot from which both copies are equal to their end.
	start := n
	for start > off && string(first[start-sz:start]) == string(second[start-sz:start]) {
		start -= sz
	}
	if start == n {
		return nil, 0
	}
	return second[start:n], lo + start
}

// frameHeadroom is how many control-frame slots below (inner to) a running
// thread's last known cfp are read with its frames: a thread that runs
// pushes and pops a frame or two all the time (a block called in a loop,
// a method called in a loop), and its cfp seldom stays where it was read
// from one system call to the next.
const frameHeadroom = 4

// frameSpan returns where to read the control frames of a VM stack ending
// at end whose cfp was last seen at cfp, and how many bytes: from cfp, or
// with headroom from up to frameHeadroom slots below it (still in the VM
// stack), to the end, at most maxFrameBytes past cfp, whole frames.
func (p *walker) frameSpan(stackStart, end, cfp uint64, headroom bool) (lo, n uint64) {
	sz := p.rt.o.cfpSize
	lo = cfp
	if headroom {
		lo -= min(frameHeadroom, (cfp-stackStart)/sz) * sz
	}
	n = min(end-lo, maxFrameBytes+(cfp-lo))
	return lo, n - n%sz
}

// settle returns the consistent control frames of a thread, from two
// copies of its frames read from lo (first, then second), with its cfp
// read before and after them and, if mid, between them (cfps): the frames
// from a cfp (at most maxFrameBytes of them) that was the same at two
// reads in a row (with mid; else before and after), lies in the copies,
// and from which both copies are equal but for the innermost frame's pc
// and sp (which a running frame moves on its own). The cfp read between
// the copies gives a thread that keeps pushing and popping one frame (a
// block called in a loop) two chances instead of one to be seen at rest
// around a copy; and a cfp that was the same before and after but not
// between them is refused: the thread moved during the copies and came
// back, as a thread does whose copies mix two passes of a loop.
//
// This is a check, not a proof: a thread that goes round a loop of calls
// in about the time of one copy can be back in the same frames, at the
// same depth, when each slot is copied the second time, so that both
// copies hold the same mix of two passes. Nothing in the frames tells such
// a copy apart (the slot holds the same bytes at both copies); on a loop
// made for it (sampler/testdata/torn.rb) 0 to 0.21 % of the looping
// threads' samples pass (1.3 to 2.9 % without this check), and blocking
// mode has none.
func (p *walker) settle(lo, end uint64, cfps [3][8]byte, mid bool, first, second []byte) ([]byte, uint64, bool) {
	c0, c1, c2 := le64(cfps[0][:], 0), le64(cfps[1][:], 0), le64(cfps[2][:], 0)
	at := c1
	if !mid {
		if c0 != c2 {
			return nil, 0, false
		}
		at = c0
	} else if c1 != c0 && c1 != c2 {
		return nil, 0, false
	}
	sz := p.rt.o.cfpSize
	if at < lo || at > end || (end-at)%sz != 0 {
		return nil, 0, false
	}
	off := at - lo
	if off > uint64(len(second)) {
		return nil, 0, false
	}
	n := min(uint64(len(second))-off, maxFrameBytes)
	n -= n % sz
	if n == 0 && at != end {
		return nil, 0, false
	}
	if !sameFrames(&p.rt.o, first[off:off+n], second[off:off+n]) {
		return nil, 0, false
	}
	return second[off : off+n], at, true
}

// sameFrames compares two copies of a control-frame region, ignoring the
// innermost frame's pc and sp.
func sameFrames(o *offsets, a, b []byte) bool {
	if len(a) != len(b) {
		return false
	}
	first := int(o.cfpSize)
	if first > len(a) {
		first = len(a)
	}
	for i := 0; i < first; i++ {
		if (o.cfpPC.ok && uint64(i) >= o.cfpPC.off && uint64(i) < o.cfpPC.off+8) ||
			(o.cfpSP.ok && uint64(i) >= o.cfpSP.off && uint64(i) < o.cfpSP.off+8) {
			continue
		}
		if a[i] != b[i] {
			return false
		}
	}
	return string(a[first:]) == string(b[first:])
}

// maxSlotCache bounds the per-slot frame cache (control-frame slots of
// every VM stack).
const maxSlotCache = 1 << 15

// stackSlots returns the slot cache of the VM stack that ends at end, with
// at least n slots (one map lookup per stack and snapshot, not per frame).
// An entry of generation 0 is empty: epochs start at 1.
func (p *walker) stackSlots(end uint64, n int) []slotEntry {
	s := p.slotCache[end]
	if len(s) >= n {
		return s
	}
	if p.slotTotal+n > maxSlotCache {
		clear(p.slotCache)
		p.slotTotal = 0
		s = nil
	}
	ns := make([]slotEntry, max(n, 2*len(s), 64))
	copy(ns, s)
	p.slotTotal += len(ns) - len(s)
	p.slotCache[end] = ns
	return ns
}

// dropSlots forgets what the slot cache holds for the n frames of a stack
// from slot top down: what a walk read for them did not hold together (a
// running thread moved between the reads of its frames and of their
// environments, which are then cached under the frames' keys), so the
// next walk reads it again instead of failing the same way until the
// next GC.
func dropSlots(slots []slotEntry, top, n int) {
	for i := 0; i < n && top-i >= 0; i++ {
		slots[top-i].gen = 0
	}
}

// slotKey identifies the frame in a control-frame slot.
type slotKey struct{ iseq, self, ep, block uint64 }

func slotKeyOf(o *offsets, cf []byte) slotKey {
	return slotKey{o.cfpIseq.u64(cf), o.cfpSelf.u64(cf), o.cfpEP.u64(cf), o.cfpBlock.u64(cf)}
}

// slotEntry is what was read for the frame last seen in a slot.
type slotEntry struct {
	key                    slotKey
	gen                    uint64 // GC epoch of the reads
	epData, iseqHdr, meHdr [24]byte
	// The frame named from them at pc namedPC (when named).
	named        bool
	namedPC      uint64
	fr           stack.Frame
	frOK, frDone bool
}

// batch reads reqs in one system call where the target allows it, merged
// by page (environments on the VM stack, headers of objects allocated
// together: a remote iovec per page rather than per request); a request
// that fails (a race with the target) fails the batch.
func (p *walker) batch(reqs []target.Read) error {
	if len(reqs) == 0 {
		return nil
	}
	return p.merged.ReadBatch(p.t, reqs)
}

// frame names one control frame; ok is false for frames Ruby's own
// backtraces skip (dummy and finish frames).
func (p *walker) frame(fd *frameData) (stack.Frame, bool, error) {
	o := &p.rt.o
	cf := fd.cf
	p.frameDone = false
	iseq := o.cfpIseq.u64(cf)
	pc := o.cfpPC.u64(cf)
	modern := p.rt.epFrames

	var magic uint64
	if modern {
		magic = le64(fd.epData[:], 16) & magicMask
	} else {
		magic = o.cfpFlag.u64(cf) & oldMagicMask
	}

	if (modern && magic == magicCFn) || (!modern && magic == oldMagicCFn) {
		var me uint64
		if modern {
			me = le64(fd.epData[:], 0)
		} else {
			me = o.cfpMe.u64(cf)
		}
		name := p.n.cfuncName(me)
		if name == unnamedCFunc && modern && !p.stopped && !p.isMethodEntry(me) {
			// Read while a running thread was pushing the frame.
			p.tornReads++
			return stack.Frame{}, false, ErrTorn
		}
		return stack.Frame{Name: name, Kind: stack.KindCFunc}, true, nil
	}
	if iseq == 0 || (pc == 0 && !(modern && rubyMagic(magic))) {
		return stack.Frame{}, false, nil
	}
	if modern && (magic == magicIFn || magic == magicDumy) {
		return stack.Frame{}, false, nil
	}
	if !modern && magic == oldMagicIFn {
		return stack.Frame{}, false, nil
	}
	var hdr []byte
	if o.iseqBody.ok {
		hdr = fd.iseqHdr[:]
	}
	info, err := p.n.iseqInfo(iseq, hdr)
	if err != nil {
		return stack.Frame{}, false, err
	}
	if info == nil || info.tableSize == 0 {
		// Not an iseq, or the VM's dummy top-level iseq (no code, no
		// lines), which Ruby's own backtraces skip.
		return stack.Frame{}, false, nil
	}
	p.frameDone = info.size != 0 && pc >= info.encoded+info.size*8
	var line int
	if info.size != 0 && (pc < info.encoded || pc > info.encoded+info.size*8) {
		// Not a pc of this iseq: YJIT does not store the pc of the frames
		// it pushes until their code calls out (the slot keeps an older
		// frame's pc). The frame's own first line is the best known.
		line = info.firstLine
	} else if line, err = p.n.lineFor(info, pc); err != nil {
		line = info.firstLine
	}
	name := info.label
	if modern && info.qualifiable {
		if owner, ok := p.methodOwner(fd); ok {
			name = info.qualify(owner)
		} else if !p.stopped {
			// Every method and block of a method has a method entry in
			// its environment chain; a running thread that lacks one
			// changed its stack while the environments were read.
			p.tornReads++
			return stack.Frame{}, false, ErrTorn
		} else {
			// A stopped thread caught pushing the frame, or
			// environments cached from a read that raced a running
			// thread: the bare label, neither kept nor its stack's
			// environments (see dropSlots).
			p.incomplete++
			p.envSuspect = true
		}
	}
	return stack.Frame{Name: name, Path: info.path, Line: line, Kind: stack.KindRuby}, true, nil
}

// rubyMagic reports whether a frame's magic is that of Ruby code (a
// method, block, class body, top level, eval or rescue/ensure clause).
// Such a frame with an iseq and a pc of 0 is one that YJIT pushed and
// whose pc it never stored, in a slot whose earlier frame left 0 there
// (a C function's frame that the interpreter pushed): Ruby's own
// backtraces never see it (YJIT stores the pc before anything can take
// one), a sampler does. Skipping it (as the frames Ruby's backtraces skip,
// which have no iseq) put YJIT's samples of a method under its caller:
// 114 of 245 cpu samples of TestAgentPyroscope's script on 3.4.5 --yjit.
func rubyMagic(magic uint64) bool {
	switch magic {
	case magicMeth, magicBlk, magicCls, magicTop, magicEval, magicResc:
		return true
	}
	return false
}

// methodOwner finds the method entry of a frame through its environment
// chain (rb_vm_frame_method_entry) and returns the qualified owner prefix
// ("Foo#", "Foo.") or "" for anonymous owners.
func (p *walker) methodOwner(fd *frameData) (string, bool) {
	epData := fd.epData[:]
	meHdr := fd.meHdr[:]
	tmp := &p.ownerTmp
	for i := 0; i < 64; i++ {
		flags := le64(epData, 16)
		local := flags&envFlagLocal != 0
		if me, ok := p.checkMethodEntry(le64(epData, 0), meHdr, local); ok {
			prefix, err := p.ownerPrefix(me)
			if err != nil {
				return "", false
			}
			return prefix, true
		}
		if local {
			return "", false
		}
		prev := le64(epData, 8) &^ 3
		if !isHeapPtr(prev) {
			return "", false
		}
		if e := p.env(prev); e != nil {
			epData, meHdr = e.epData[:], e.meHdr[:]
			continue
		}
		// An environment moved to the heap (a captured block's): read it.
		if err := p.t.ReadAt(tmp.epData[:], prev-16); err != nil {
			return "", false
		}
		meHdr = nil
		if me := le64(tmp.epData[:], 0); isHeapPtr(me) {
			if err := p.t.ReadAt(tmp.meHdr[:], me); err == nil {
				meHdr = tmp.meHdr[:]
			}
		}
		epData = tmp.epData[:]
	}
	return "", false
}

// env returns the frame of the stack being walked whose environment is at
// ep, or nil. The index is built on the first call of a walk.
func (p *walker) env(ep uint64) *frameData {
	if !p.envsIndexed {
		if p.envs == nil {
			p.envs = map[uint64]*frameData{}
		}
		clear(p.envs)
		for i := range p.walkFds {
			p.envs[p.walkFds[i].ep] = &p.walkFds[i]
		}
		p.envsIndexed = true
	}
	return p.envs[ep]
}

// checkMethodEntry returns obj when it is a method entry imemo (or an svar
// holding one, at a local ep); hdr holds obj's first 24 bytes when known.
func (p *walker) checkMethodEntry(obj uint64, hdr []byte, canBeSvar bool) (uint64, bool) {
	if !isHeapPtr(obj) {
		return 0, false
	}
	if hdr == nil {
		b, err := p.r.read(obj, 24)
		if err != nil {
			return 0, false
		}
		hdr = b
	}
	flags := le64(hdr, 0)
	if flags&tMask != tImemo {
		return 0, false
	}
	switch (flags >> flUShift) & 0x0f {
	case imemoMent:
		return obj, true
	case imemoSvar:
		if canBeSvar {
			// struct vm_svar { flags; cref_or_me; ... }
			return p.checkMethodEntry(le64(hdr, 8), nil, false)
		}
	}
	return 0, false
}

// ownerPrefix returns "Owner#" or "Owner." for method entry me.
func (p *walker) ownerPrefix(me uint64) (string, error) {
	if s, ok := p.n.cachedString(p.ownerCache, me); ok {
		return s, nil
	}
	wit := p.n.startWitness()
	defer p.n.endWitness(wit)
	owner, err := p.n.sawU64(me + p.rt.o.meOwner.off)
	if err != nil {
		return "", err
	}
	misses := p.incomplete
	prefix := ""
	name, singleton, err := p.n.classNameOf(owner)
	if err == nil && name != "" {
		if singleton {
			prefix = name + "."
		} else {
			prefix = name + "#"
		}
	}
	if err != nil {
		p.incomplete++
	}
	if p.incomplete != misses {
		return prefix, nil // not cached (see caches.incomplete)
	}
	if len(p.ownerCache) > 100000 {
		p.ownerCache = map[uint64]genString{}
	}
	p.ownerCache[me] = genString{prefix, p.epoch, wit.clip()}
	return prefix, nil
}

// unnamedCFunc names a C function frame whose method is unknown.
const unnamedCFunc = "<cfunc>"

// isMethodEntry reports whether obj is a method entry imemo now.
func (p *walker) isMethodEntry(obj uint64) bool {
	if !isHeapPtr(obj) {
		return false
	}
	flags, err := p.r.u64(obj)
	return err == nil && flags&tMask == tImemo && (flags>>flUShift)&0x0f == imemoMent
}

// cfuncName names a C function frame from its method entry.
func (p *namer) cfuncName(me uint64) string {
	if !isHeapPtr(me) {
		return unnamedCFunc
	}
	if s, ok := p.cachedString(p.cfuncCache, me); ok {
		return s
	}
	wit := p.startWitness()
	defer p.endWitness(wit)
	misses := p.incomplete
	name := unnamedCFunc
	def, err := p.sawU64(me + p.rt.o.meDef.off)
	var id uint64
	if err == nil && isHeapPtr(def) && p.rt.o.defOriginalID.ok {
		id, err = p.sawU64(def + p.rt.o.defOriginalID.off)
	}
	if (err != nil || id == 0) && p.rt.o.meCalledID.ok {
		id, err = p.sawU64(me + p.rt.o.meCalledID.off)
	}
	if err == nil && id != 0 {
		// Symbol names are cached for the life of the process: not
		// part of the witness.
		resume := p.notRecording()
		s, err := p.id2str(id)
		resume()
		if err == nil && s != "" {
			name = s
			if p.rt.epFrames {
				if prefix, err := p.w.ownerPrefix(me); err == nil {
					name = prefix + s
				} else {
					p.incomplete++
				}
			}
		}
	}
	if name == unnamedCFunc || p.incomplete != misses {
		// Not kept: a read that raced with the target, or a name decoded
		// without all it needs (see caches.incomplete).
		return name
	}
	if len(p.cfuncCache) > 100000 {
		p.cfuncCache = map[uint64]genString{}
	}
	p.cfuncCache[me] = genString{name, p.epoch, wit.clip()}
	return name
}

// iseqInfo holds the per-iseq facts a frame needs, cached by address.
type iseqInfo struct {
	addr, body  uint64
	gen         uint64 // GC epoch in which it was last read
	wit         witness
	label       string
	path        string
	encoded     uint64
	size        uint64 // of the code, in words (0 when unknown)
	firstLine   int    // of the iseq's source
	typ         uint64
	qualifiable bool
	prefix      string // "block in ", "block (2 levels) in ", ... for blocks
	method      string // the method name to qualify
	lastOwner   string // the owner of the last qualified name
	lastName    string
	// line table
	tableAddr, tableSize, succTable, positions uint64
	lines                                      map[uint64]int
}

func (i *iseqInfo) qualify(owner string) string {
	if owner == "" {
		return i.label
	}
	// An iseq nearly always runs for one owner: keep the last name built.
	if owner != i.lastOwner || i.lastName == "" {
		i.lastOwner, i.lastName = owner, i.prefix+owner+i.method
	}
	return i.lastName
}

// ISEQ_TYPE values (enum rb_iseq_type, 2.3+).
const (
	iseqTop    = 0
	iseqMethod = 1
	iseqBlock  = 2
	iseqClass  = 3
	iseqRescue = 4
	iseqEnsure = 5
	iseqEval   = 6
	iseqMain   = 7
)

func (p *namer) iseqInfo(iseq uint64, hdr []byte) (*iseqInfo, error) {
	o := &p.rt.o
	body := iseq
	if o.iseqBody.ok {
		b := hdr
		if b == nil {
			var err error
			if b, err = p.r.read(iseq, 24); err != nil {
				return nil, fmt.Errorf("read iseq at 0x%x: %w", iseq, err)
			}
		}
		flags := le64(b, 0)
		if flags&tMask != tImemo || (flags>>flUShift)&0x0f != imemoIseq {
			// Not an iseq (an ifunc, say): not a Ruby-level frame.
			return nil, nil
		}
		body = o.iseqBody.u64(b)
	}
	c, cached := p.iseqCache[iseq]
	if cached && c.body == body && p.current(&c.gen, c.wit) {
		p.reuse(c.wit)
		return c, nil
	}
	wit := p.startWitness()
	info, err := p.readIseqInfo(iseq, body)
	if err == nil {
		info.wit = wit.clip()
	}
	p.endWitness(wit)
	if err != nil {
		return nil, err
	}
	if cached && c.sameIseq(info) {
		// Read again after a GC and unchanged: keep the entry (its line
		// and name memos hold).
		c.gen, c.wit = p.epoch, info.wit
		return c, nil
	}
	if len(p.iseqCache) > 50000 {
		p.iseqCache = map[uint64]*iseqInfo{}
	}
	p.iseqCache[iseq] = info
	return info, nil
}

// sameIseq reports whether n was read from the same iseq as i: every fact
// the walker uses is equal.
func (i *iseqInfo) sameIseq(n *iseqInfo) bool {
	return i.addr == n.addr && i.body == n.body && i.label == n.label && i.path == n.path &&
		i.encoded == n.encoded && i.size == n.size && i.firstLine == n.firstLine && i.typ == n.typ && i.tableAddr == n.tableAddr &&
		i.tableSize == n.tableSize && i.succTable == n.succTable && i.positions == n.positions
}

// readIseqInfo reads the facts of the iseq at iseq whose body is at body.
func (p *namer) readIseqInfo(iseq, body uint64) (*iseqInfo, error) {
	o := &p.rt.o
	if !isHeapPtr(body) {
		return nil, invalidf("iseq 0x%x has body 0x%x", iseq, body)
	}
	bb, err := p.r.readOwned(body, int(o.bodySize))
	if err != nil {
		return nil, fmt.Errorf("read iseq body at 0x%x: %w", body, err)
	}
	info := &iseqInfo{addr: iseq, body: body, gen: p.epoch, lines: map[uint64]int{}}
	p.sawBody(body, bb)
	info.encoded = o.bEncoded.u64(bb)
	info.size = o.bIseqSize.u64(bb) & 0xffffffff
	if fl := o.bFirstLineno; fl.ok {
		if n := fl.u64(bb); fl.size == 8 && n&1 == 1 {
			info.firstLine = int(int64(n) >> 1) // a Fixnum before 3.3
		} else if fl.size == 4 {
			info.firstLine = int(int32(n))
		}
	}
	info.typ = o.bType.u64(bb)
	if !p.rt.iseqBody {
		// 1.9: name and filename are in the iseq itself.
		if info.label, err = p.rstring(o.iseqName.u64(bb)); err != nil {
			return nil, fmt.Errorf("read iseq name: %w", err)
		}
		if fp := o.iseqFilepath.u64(bb); isHeapPtr(fp) {
			info.path, _ = p.rstring(fp)
		}
		if info.path == "" {
			info.path, _ = p.rstring(o.iseqFilename.u64(bb))
		}
	} else {
		if info.label, err = p.rstring(o.bLabel.u64(bb)); err != nil {
			// Static labels live in libruby's .rodata, which a core file
			// may lack; the iseq type names the two that matter.
			switch {
			case p.rt.epFrames && info.typ == iseqMain:
				info.label = "<main>"
			case p.rt.epFrames && info.typ == iseqTop:
				info.label = "<top (required)>"
			default:
				return nil, fmt.Errorf("read iseq label: %w", err)
			}
		}
		if o.bPathobj.ok {
			info.path, err = p.pathobj(o.bPathobj.u64(bb))
			if err != nil {
				return nil, fmt.Errorf("read iseq path: %w", err)
			}
		} else {
			if ap := o.bAbsPath.u64(bb); isHeapPtr(ap) {
				info.path, _ = p.rstring(ap)
			}
			if info.path == "" {
				info.path, _ = p.rstring(o.bPath.u64(bb))
			}
		}
	}
	switch {
	case o.bSuccTable.ok:
		info.tableAddr = o.bInsnsInfo.u64(bb)
		info.tableSize = o.bInsnsInfoSize.u64(bb) & 0xffffffff
		info.succTable = o.bSuccTable.u64(bb)
		info.positions = o.bInsnsPositions.u64(bb)
	case o.bInsnsInfo.ok:
		info.tableAddr = o.bInsnsInfo.u64(bb)
		info.tableSize = o.bInsnsInfoSize.u64(bb) & 0xffffffff
	case o.bLineInfoTable.ok:
		info.tableAddr = o.bLineInfoTable.u64(bb)
		info.tableSize = o.bLineInfoSize.u64(bb) & 0xffffffff
	case o.bInsnInfoTable.ok:
		info.tableAddr = o.bInsnInfoTable.u64(bb)
		info.tableSize = o.bInsnInfoSize.u64(bb) & 0xffffffff
	}
	if p.rt.epFrames {
		p.setQualification(info)
	}
	return info, nil
}

// setQualification decides how a label is qualified with its owner, as
// Ruby 3.4's backtraces do: methods become "Owner#name", blocks (and
// rescue/ensure) "block in Owner#name".
func (p *namer) setQualification(info *iseqInfo) {
	switch info.typ {
	case iseqMethod:
		info.qualifiable = true
		info.method = info.label
	case iseqBlock, iseqRescue, iseqEnsure:
		// "block in foo", "block (2 levels) in foo", and a clause of
		// one: "ensure in block in foo", "rescue in block (2 levels) in
		// <main>".
		rest := info.label
		for {
			i := strings.Index(rest, " in ")
			if i < 0 || !innerLabel(rest[:i]) {
				break
			}
			rest = rest[i+4:]
		}
		if rest == info.label || strings.HasPrefix(rest, "<") || strings.ContainsAny(rest, "#.") {
			return // "block in <main>", "block in <class:Foo>", already qualified
		}
		info.qualifiable = true
		info.prefix = info.label[:len(info.label)-len(rest)]
		info.method = rest
	}
}

// innerLabel reports whether s, before " in " in an iseq's label, names
// a block or clause inside what follows: "block", "block (2 levels)",
// "rescue", "ensure".
func innerLabel(s string) bool {
	switch s {
	case "block", "rescue", "ensure":
		return true
	}
	return strings.HasPrefix(s, "block (") && strings.HasSuffix(s, " levels)")
}

// pathobj returns the path of an iseq: its realpath (absolute) when Ruby
// has one, else the path.
func (p *namer) pathobj(v uint64) (string, error) {
	if !isHeapPtr(v) {
		return "", invalidf("iseq pathobj 0x%x", v)
	}
	if s, ok := p.cachedString(p.pathCache, v); ok {
		return s, nil
	}
	wit := p.startWitness()
	defer p.endWitness(wit)
	flagsB, err := p.r.read(v, 8)
	if err != nil {
		return "", err
	}
	p.sawWord(v, le64(flagsB, 0), tMask)
	var s string
	switch le64(flagsB, 0) & tMask {
	case tString:
		s, err = p.rstring(v)
	case tArray:
		// [path, realpath]
		var real uint64
		if real, err = p.aryEntry(v, 1); err == nil && isHeapPtr(real) {
			s, err = p.rstring(real)
		}
		if s == "" {
			var path uint64
			if path, err = p.aryEntry(v, 0); err == nil {
				s, err = p.rstring(path)
			}
		}
	default:
		err = invalidf("iseq pathobj 0x%x is neither String nor Array", v)
	}
	if err != nil {
		return "", err
	}
	if len(p.pathCache) > 50000 {
		p.pathCache = map[uint64]genString{}
	}
	p.pathCache[v] = genString{s, p.epoch, wit.clip()}
	return s, nil
}

package ruby

// A thread that has not been on a CPU since its control frames were last
// copied cannot have changed them: only the thread itself pushes, pops or
// moves its frames, and the one other writer, GC compaction (which moves
// the objects the frames point to), runs inside a GC, which changes the
// GC epoch the kept copy is tied to. Such a thread's frames need no read
// at all: the copy kept from the tick that read them stands, and its
// stack, named alike by the last two walks (keptStack.trusted), is reused
// by sameStack. Threads that wait (for I/O, a lock, a sleep, or for the
// GVL, which on a machine busier than its cores is most of them) are
// skipped that way, and a tick's control-frame batch shrinks to the
// threads that ran.

// OffCPUWatch tells whether a thread has stayed off every CPU since an
// instant, from the kernel's context-switch records (see oncpu).
type OffCPUWatch interface {
	// Now is the watch's clock (CLOCK_MONOTONIC nanoseconds).
	Now() int64
	// OffSince reports whether thread tid (as the host numbers it) was
	// off every CPU at instant at and has not been switched onto one
	// since. It must answer false when the records cannot tell.
	OffSince(tid int, at int64) bool
}

// SetOffCPUWatch makes the snapshots that follow skip reading the control
// frames of threads w says have not run since they were last read; nil
// reads every thread.
func (p *Process) SetOffCPUWatch(w OffCPUWatch) { p.offCPU = w }

// StillSkips returns how many threads' control frames were not read
// because the thread had not run since they were last read.
func (p *Process) StillSkips() uint64 { return p.stillSkips }

// stillStack returns the kept stack of the thread r, whose execution
// context now points at cfp, when its kept control frames stand as they
// were read: they were read by a tick's batch (prefetchRegions) in this
// GC epoch with no GC running, from this cfp, by this native thread,
// their stack is trusted, and the thread has not been on a CPU since
// that batch began.
func (p *walker) stillStack(r *threadRef, cfp uint64) *keptStack {
	if p.offCPU == nil {
		return nil
	}
	k := p.lastFrames[r.addr]
	if !k.readByBatch() || k.epoch != p.epoch || k.cfp != cfp {
		return nil
	}
	if tid := p.refTID(r, r.tb); tid != k.tid || !p.offCPU.OffSince(tid, k.readAt) {
		return nil
	}
	p.stillSkips++
	return k
}

// readByBatch reports whether k (nil: none) is a trusted stack whose
// region a tick's batch read for a known native thread, at a known
// instant: one whose thread the switch records can say has not run since.
func (k *keptStack) readByBatch() bool {
	return k != nil && k.trusted && k.regionOK && k.readAt != 0 && k.tid != 0
}

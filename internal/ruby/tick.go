package ruby

import (
	"github.com/rbscope/rbscope/internal/target"
)

// A sample of every thread costs, in steady state, three process_vm_readv
// calls however many threads there are:
//
//  1. the GC count, the VM's ractor count, the main ractor and every thread
//     struct of the list seen last time (tickThreads), checked to still
//     form the ractor's thread list;
//  2. every thread's execution context head (vm_stack, size, cfp) and
//     native thread id (prefetch);
//  3. every thread's control-frame region: once when the target is
//     stopped, else framed by two reads of its cfp and copied twice, from
//     a few slots below the cfp (prefetch; see readFrames for why).
//
// Environments, iseq headers and method entries are read only for frames
// that changed (walk), and a thread whose frames are the bytes of the last
// two ticks is not walked at all (sameStack). More VM words per tick go into the first two
// batches.

// tickThreads lists the Ruby threads and starts the GC epoch of this
// snapshot: in one batched read when the thread list is the one seen last
// time, else by walking the list.
func (p *Process) tickThreads() ([]threadRef, error) {
	if refs, ok := p.knownThreadList(); ok {
		return refs, nil
	}
	p.beginEpoch()
	refs, err := p.threadList()
	if err != nil {
		return nil, err
	}
	p.knownThreads = p.knownThreads[:0]
	p.knownRactor = 0
	if p.ver >= v(3, 0, 0) && len(refs) > 0 && refs[0].tb != nil {
		ra := refs[0].ractor
		for _, r := range refs {
			if r.ractor != ra || r.tb == nil {
				p.knownThreads = p.knownThreads[:0]
				return refs, nil
			}
			p.knownThreads = append(p.knownThreads, r.addr)
		}
		p.knownRactor = ra
	}
	return refs, nil
}

// knownThreadList reads the GC count, the ractor count, the ractor and the
// threads seen last time in one call, and returns them when they still
// form the ractor's whole thread list.
func (p *Process) knownThreadList() ([]threadRef, bool) {
	o := &p.o
	if len(p.knownThreads) == 0 || p.knownRactor == 0 || p.vmAddr == 0 {
		return nil, false
	}
	reqs := p.tickReqs[:0]
	var gc [8]byte
	if p.gcCountAddr != 0 {
		reqs = append(reqs, target.Read{Addr: p.gcCountAddr, Buf: gc[:]})
	}
	var cnt [4]byte
	if o.vmRactorCnt.ok {
		reqs = append(reqs, target.Read{Addr: p.vmAddr + o.vmRactorCnt.off, Buf: cnt[:]})
	}
	gcReq, gcOK := p.gcRead()
	if gcOK {
		reqs = append(reqs, gcReq)
	}
	rb := p.scratch.take(int(o.ractorSize))
	reqs = append(reqs, target.Read{Addr: p.knownRactor, Buf: rb})
	refs := p.refsBuf[:0]
	for _, th := range p.knownThreads {
		refs = append(refs, threadRef{addr: th, ractor: p.knownRactor, tb: p.scratch.take(int(o.thSize))})
		reqs = append(reqs, target.Read{Addr: th, Buf: refs[len(refs)-1].tb})
	}
	p.refsBuf = refs[:0]
	p.tickReqs = reqs[:0]
	if err := p.t.ReadBatch(reqs); err != nil {
		return nil, false
	}
	p.gcFresh = gcOK
	if le32(cnt[:], 0) > 1 {
		return nil, false
	}
	// The list: head -> each thread's lt_node -> ... -> head.
	head := p.knownRactor + o.ractorThreadsSet.off
	next := le64(rb, o.ractorThreadsSet.off)
	for i := range refs {
		if next != refs[i].addr+o.thLTNode.off {
			return nil, false
		}
		next = le64(refs[i].tb, o.thLTNode.off)
	}
	if next != head {
		return nil, false
	}
	if p.gcCountAddr != 0 {
		p.epoch = le64(gc[:], 0) + 1
	} else {
		p.fallbackEpoch++
		p.epoch = 1<<63 | p.fallbackEpoch
	}
	// The same facts threadList derives from the ractor and threads.
	mainTh := o.ractorThreadsMain.u64(rb)
	runEC := o.ractorRunningEC.u64(rb)
	owner, ownerKnown := p.ownerFrom(rb, false)
	for i := range refs {
		refs[i].main = refs[i].addr == mainTh
		if ownerKnown {
			refs[i].gvl = owner != 0 && refs[i].addr == owner
		} else {
			refs[i].gvl = runEC != 0 && o.thEC.ok && o.thEC.u64(refs[i].tb) == runEC
		}
	}
	p.markWaiters(p.knownRactor, rb, refs)
	return refs, true
}

// prefetch reads, for every thread at once, the execution context head and
// native thread id, then the control-frame regions. Whatever it could not
// read is read thread by thread later.
func (p *Process) prefetch(refs []threadRef) {
	o := &p.o
	if !o.thEC.ok || len(refs) == 0 {
		return
	}
	need := max(o.ecCFP.off, o.ecVMStackSize.off) + 8
	reqs := p.tickReqs[:0]
	for i := range refs {
		r := &refs[i]
		if r.tb == nil {
			continue
		}
		ec := o.thEC.u64(r.tb)
		if !isHeapPtr(ec) {
			continue
		}
		r.eb = p.scratch.take(int(need))
		reqs = append(reqs, target.Read{Addr: ec, Buf: r.eb})
		if !o.thTID.ok && o.thNT.ok && o.ntTID.ok {
			if nt := o.thNT.u64(r.tb); isHeapPtr(nt) {
				r.haveTID = true
				reqs = append(reqs, target.Read{Addr: nt + o.ntTID.off, Buf: r.tid[:]})
			}
		}
	}
	if len(reqs) == 0 {
		return
	}
	if err := p.t.ReadBatch(reqs); err != nil {
		for i := range refs {
			refs[i].eb, refs[i].haveTID = nil, false
		}
		p.tickReqs = reqs[:0]
		return
	}
	if refs[0].haveTID && le32(refs[0].tid[:], 0) == 0 {
		// No tid there (a native thread not started): the slow path.
		for i := range refs {
			refs[i].haveTID = false
		}
	}

	if cap(p.checksBuf) < len(refs) {
		p.checksBuf = make([]regionCheck, len(refs))
	}
	checks := p.checksBuf[:len(refs)]
	clear(checks)
	reqs = reqs[:0]
	for i := range refs {
		r := &refs[i]
		if r.eb == nil {
			continue
		}
		start, size, cfp := o.ecVMStack.u64(r.eb), o.ecVMStackSize.u64(r.eb), o.ecCFP.u64(r.eb)
		end := start + size*8
		if cfp == 0 || start == 0 || cfp < start || cfp >= end {
			continue
		}
		lo, n := p.frameSpan(start, end, cfp, !p.stopped)
		if n == 0 {
			continue
		}
		r.region, r.regionCFP = p.scratch.take(int(n)), cfp
		c := &checks[i]
		c.r, c.lo, c.end = r, lo, end
		if p.stopped {
			reqs = append(reqs, target.Read{Addr: cfp, Buf: r.region})
			continue
		}
		cfpAddr := o.thEC.u64(r.tb) + o.ecCFP.off
		c.first = p.scratch.take(int(n))
		reqs = append(reqs,
			target.Read{Addr: cfpAddr, Buf: c.before[:]}, target.Read{Addr: lo, Buf: c.first},
			target.Read{Addr: lo, Buf: r.region}, target.Read{Addr: cfpAddr, Buf: c.after[:]})
	}
	p.tickReqs = reqs[:0]
	if len(reqs) == 0 {
		return
	}
	if err := p.t.ReadBatch(reqs); err != nil {
		for i := range refs {
			refs[i].region = nil
		}
		return
	}
	if p.stopped {
		return
	}
	for i := range checks {
		c := &checks[i]
		if c.r == nil {
			continue
		}
		after := le64(c.after[:], 0)
		if region, at, ok := p.settle(c.lo, c.end, le64(c.before[:], 0), after, c.first, c.r.region); ok {
			c.r.region, c.r.regionCFP = region, at
		} else {
			c.r.region, c.r.regionTorn, c.r.regionCFP = nil, true, after
		}
	}
}

// regionCheck frames a running thread's control-frame region with two
// reads of its cfp and a second copy (see readFrames and settle).
type regionCheck struct {
	r             *threadRef
	lo, end       uint64 // the copies start at lo; the VM stack ends at end
	first         []byte
	before, after [8]byte
}

// threadName returns the Ruby name of a thread from its name String,
// cached for the GC epoch.
func (p *Process) threadName(nv uint64) string {
	if s, ok := p.cachedString(p.nameCache, nv); ok {
		return s
	}
	wit := p.startWitness()
	s, err := p.rstring(nv)
	p.endWitness(wit)
	if err != nil {
		return ""
	}
	if len(p.nameCache) > 10000 {
		clear(p.nameCache)
	}
	p.nameCache[nv] = genString{s, p.epoch, wit.clip()}
	return s
}

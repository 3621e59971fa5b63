package ruby

import (
	"fmt"
	"math/rand/v2"

	"github.com/rbscope/rbscope/internal/target"
)

// A sample of every thread costs, in steady state, two process_vm_readv
// calls however many threads there are, and a third for what changed;
// when the target runs, most often one:
//
//  1. the GC count, the VM's ractor count, the main ractor, every thread
//     struct of the list seen last time (tickThreads), checked to still
//     form the ractor's thread list, and each thread's execution context
//     head (vm_stack, size, cfp) and native thread id where they were last
//     tick (keepHeads); when the target runs, also each thread's control
//     frames where they were last tick (guessRegions), which serve as the
//     next call's when its cfp is still among them;
//  2. every other thread's control-frame region: once when the target is
//     stopped, else copied twice from a few slots below the cfp, framed by
//     reads of the cfp (framedReads; see readFrames for why).
//
// A thread whose struct points to another execution context (it switched
// fibers), and every thread at the first tick, has its context read
// between the two (prefetchHeads). Environments, iseq headers and method
// entries are read only for frames that changed (walk), and a thread
// whose frames are the bytes of the last two ticks is not walked at all
// (sameStack). With an OffCPUWatch (Mode cpu, nonblocking), a thread that
// has not been on a CPU since its frames were last read is not read
// either (stillStack). More VM words per tick go into the first batch. When the
// caller stopped only the GVL's holder (HolderStopped), the owner
// read in the first batch must name it (checkHolder) before the regions
// are read, once, as from a stopped process.

// tickThreads lists the Ruby threads and starts the GC epoch of this
// snapshot: in one batched read when the thread list is the one seen last
// time, else by walking the list.
func (p *walker) tickThreads() ([]threadRef, error) {
	if refs, ok := p.knownThreadList(); ok {
		return refs, nil
	}
	p.guesses = p.guesses[:0] // made for the list known, not this one
	p.beginEpoch()
	refs, err := p.threadList()
	if err != nil {
		return nil, err
	}
	p.knownThreads = p.knownThreads[:0]
	p.knownHeads = p.knownHeads[:0]
	p.knownRactor = 0
	if p.rt.ractors && len(refs) > 0 && refs[0].tb != nil {
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
func (p *walker) knownThreadList() ([]threadRef, bool) {
	o := &p.rt.o
	if len(p.knownThreads) == 0 || p.knownRactor == 0 || p.vmAddr == 0 {
		return nil, false
	}
	reqs := p.tickReqs[:0]
	// In the Process: buffers handed to the kernel escape, and would be
	// allocated per tick on the stack's behalf.
	gc, cnt := &p.tickGC, &p.tickCnt
	*gc, *cnt = [8]byte{}, [4]byte{}
	if p.gcCountAddr != 0 {
		reqs = append(reqs, target.Read{Addr: p.gcCountAddr, Buf: gc[:]})
	}
	if o.vmRactorCnt.ok {
		reqs = append(reqs, target.Read{Addr: p.vmAddr + o.vmRactorCnt.off, Buf: cnt[:]})
	}
	gcReq, gcOK := p.gcRead()
	if gcOK {
		reqs = append(reqs, gcReq)
	}
	rb := p.scratch.take(int(o.ractorSize))
	reqs = append(reqs, target.Read{Addr: p.knownRactor, Buf: rb})
	// The requests point into refs (tid): no append may move it.
	refs := p.refsBuf[:0]
	if cap(refs) < len(p.knownThreads) {
		refs = make([]threadRef, 0, len(p.knownThreads))
	}
	heads := len(p.knownHeads) == len(p.knownThreads)
	for i, th := range p.knownThreads {
		refs = append(refs, threadRef{addr: th, ractor: p.knownRactor, tb: p.scratch.take(int(o.thSize))})
		r := &refs[len(refs)-1]
		reqs = append(reqs, target.Read{Addr: th, Buf: r.tb})
		if !heads {
			continue
		}
		// Where this thread's execution context and native thread were
		// last tick: read here, and used by prefetchHeads if the thread
		// struct read with them still points there.
		if h := p.knownHeads[i]; h.ec != 0 {
			reqs = p.headReads(reqs, r, h.ec, h.nt)
		}
	}
	p.refsBuf = refs[:0]
	p.tickReqs = reqs[:0]
	guesses := p.guessRegions(refs, heads)
	if p.offCPU != nil && len(guesses) > 0 {
		p.regionsAt = p.offCPU.Now()
	}
	err, guessErr := p.merged.ReadBatchThen(p.t, reqs, guesses)
	p.guessReqs = guesses[:0]
	if err != nil {
		return nil, false
	}
	if guessErr != nil {
		clear(p.guesses)
	}
	p.gcFresh = gcOK
	if o.vmRactorCnt.ok {
		p.ractors = int(le32(cnt[:], 0))
	} else {
		p.ractors = 0
	}
	if p.ractors > 1 {
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

// regionGuess is a thread's control-frame region read with the thread
// list, where its frames were last tick (guessRegions).
type regionGuess struct {
	ec         uint64 // the execution context whose cfp framed the copies
	start, end uint64 // its VM stack
	lo         uint64 // the copies start at lo
	first      []byte // nil: no guess
	second     []byte
	cfps       [3][8]byte
}

// maxGuessMisses is how many guesses in a row may miss a thread's frames
// before its guesses are made only every guessRetry ticks: a thread whose
// stack moves by more than frameHeadroom frames from tick to tick (a deep
// recursion) would have its frames copied twice a tick.
const (
	maxGuessMisses = 2
	guessRetry     = 8
)

// guessRegions returns, unless the target holds still, the framed reads
// (framedReads) of the control frames of each known thread that was read
// last tick, where its frames were then: read in the same system call as
// the thread list, a thread whose cfp has moved by at most frameHeadroom
// frames since (most threads that ran: a loop calls and returns) needs no
// read of its own in prefetchRegions. Threads that have not run since
// their frames were read (see stillStack) are left out. It fills
// p.guesses, one per ref; heads says p.knownHeads matches refs.
func (p *walker) guessRegions(refs []threadRef, heads bool) []target.Read {
	p.guesses = p.guesses[:0]
	if !p.guessing || !heads || !p.rt.o.thEC.ok {
		return nil
	}
	p.guessTick++
	if cap(p.guesses) < len(refs) {
		p.guesses = make([]regionGuess, len(refs))
	}
	p.guesses = p.guesses[:len(refs)]
	clear(p.guesses)
	reqs := p.guessReqs[:0]
	for i := range refs {
		h := &p.knownHeads[i]
		if h.ec == 0 || h.cfp < h.start || h.cfp >= h.end || p.likelyStill(refs[i].addr) {
			continue
		}
		if h.misses >= maxGuessMisses && p.guessTick%guessRetry != 0 {
			continue
		}
		lo, n := p.frameSpan(h.start, h.end, h.cfp, true)
		if n == 0 {
			continue
		}
		g := &p.guesses[i]
		g.ec, g.start, g.end, g.lo = h.ec, h.start, h.end, lo
		g.first, g.second = p.scratch.take(int(n)), p.scratch.take(int(n))
		reqs = framedReads(reqs, h.ec+p.rt.o.ecCFP.off, lo, g.first, g.second, &g.cfps, true)
	}
	return reqs
}

// likelyStill says whether the thread at addr seems not to have run
// since its frames were last read: stillStack's test before this tick's
// reads (it is made again on them).
func (p *walker) likelyStill(addr uint64) bool {
	if p.offCPU == nil {
		return false
	}
	k := p.lastFrames[addr]
	return k.readByBatch() && p.offCPU.OffSince(k.tid, k.readAt)
}

// guessed returns the region of refs[i] read by guessRegions, if its
// execution context and VM stack are the ones guessed from and its frames
// settled in the copies (see settle); it notes the guess's hit or miss.
func (p *walker) guessed(i int, r *threadRef, start, end uint64) ([]byte, uint64, bool) {
	if i >= len(p.guesses) || p.guesses[i].first == nil {
		return nil, 0, false
	}
	g := &p.guesses[i]
	ok := g.ec == r.ebAt && g.start == start && g.end == end
	var region []byte
	var at uint64
	if ok {
		region, at, ok = p.settle(g.lo, g.end, g.cfps, true, g.first, g.second)
	}
	if i < len(p.knownHeads) && p.knownHeads[i].ec == g.ec {
		h := &p.knownHeads[i]
		if ok {
			h.misses = 0
		} else if h.misses < 255 {
			h.misses++
		}
	}
	return region, at, ok
}

// prefetchHeads reads, for every thread at once, the execution context
// head and native thread id, unless knownThreadList read them where they
// were last tick and the thread still points there. Whatever it could not
// read is read thread by thread later.
func (p *walker) prefetchHeads(refs []threadRef) {
	o := &p.rt.o
	if !o.thEC.ok || len(refs) == 0 {
		return
	}
	wantTID := !o.thTID.ok && o.thNT.ok && o.ntTID.ok
	reqs := p.tickReqs[:0]
	for i := range refs {
		r := &refs[i]
		if r.tb == nil {
			continue
		}
		ec := o.thEC.u64(r.tb)
		if !isHeapPtr(ec) {
			r.eb = nil
			continue
		}
		nt := uint64(0)
		if wantTID {
			if nt = o.thNT.u64(r.tb); !isHeapPtr(nt) {
				nt = 0
			}
		}
		if r.eb != nil && r.ebAt == ec && r.tidAt == nt {
			r.haveTID = nt != 0
			continue
		}
		reqs = p.headReads(reqs, r, ec, nt)
		r.haveTID = nt != 0
	}
	if len(reqs) > 0 {
		if err := p.merged.ReadBatch(p.t, reqs); err != nil {
			for i := range refs {
				refs[i].eb, refs[i].haveTID = nil, false
			}
			p.tickReqs = reqs[:0]
			p.knownHeads = p.knownHeads[:0]
			return
		}
	}
	if refs[0].haveTID && le32(refs[0].tid[:], 0) == 0 {
		// No tid there (a native thread not started): the slow path.
		for i := range refs {
			refs[i].haveTID = false
		}
	}
	p.keepHeads(refs)
}

// checkHolder returns a *HolderError unless thread tid holds the GVL of the
// process's only ractor (see HolderStopped).
func (p *walker) checkHolder(refs []threadRef, tid int) error {
	fail := func(holder int, why string, args ...any) error {
		return &HolderError{Stopped: tid, Holder: holder, Why: fmt.Sprintf(why, args...)}
	}
	if !p.act.owner.ok {
		return fail(0, "the layout does not locate the GVL's owner")
	}
	if p.rt.ractors && p.ractors != 1 {
		return fail(0, "the process runs %d ractors (0: not known)", p.ractors)
	}
	var held *threadRef
	for i := range refs {
		r := &refs[i]
		if r.ractor != refs[0].ractor {
			return fail(0, "the process runs several ractors")
		}
		if r.gvl {
			held = r
		}
	}
	if held == nil {
		return fail(0, "no thread holds the GVL")
	}
	if h := p.refTID(held, held.tb); h != tid {
		return fail(h, "thread %d holds the GVL", h)
	}
	return nil
}

// prefetchRegions reads every thread's control-frame region at once: once
// when the target is stopped, else framed by reads of the cfp
// (framedReads). Whatever it could not read is read thread by thread later.
func (p *walker) prefetchRegions(refs []threadRef) {
	o := &p.rt.o
	if !o.thEC.ok || len(refs) == 0 {
		return
	}
	reqs := p.tickReqs[:0]
	if cap(p.checksBuf) < len(refs) {
		p.checksBuf = make([]regionCheck, len(refs))
	}
	checks := p.checksBuf[:len(refs)]
	clear(checks)
	// Only the thread holding the GVL runs Ruby code (unless the holder is
	// not known): its cfp is read between the copies too, and the copies
	// are spaced at random (framedReads).
	anyGVL := false
	for i := range refs {
		anyGVL = anyGVL || refs[i].gvl
	}
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
		if k := p.stillStack(r, cfp); k != nil {
			// Not on a CPU since its frames were read: they stand.
			r.region, r.regionCFP, r.still = k.region, k.cfp, true
			continue
		}
		if region, at, ok := p.guessed(i, r, start, end); ok {
			// Read with the thread list, where they were last tick.
			r.region, r.regionCFP = region, at
			p.noteCFP(i, at)
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
		c.first = p.scratch.take(int(n))
		c.mid = r.gvl || !anyGVL
		reqs = framedReads(reqs, o.thEC.u64(r.tb)+o.ecCFP.off, lo, c.first, r.region, &c.cfps, c.mid)
	}
	p.tickReqs = reqs[:0]
	if len(reqs) == 0 {
		return
	}
	if p.offCPU != nil && p.regionsAt == 0 {
		// (Not when guessRegions' reads, earlier, set it: the kept
		// stacks then stand from that instant, the earlier one.)
		p.regionsAt = p.offCPU.Now()
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
		if region, at, ok := p.settle(c.lo, c.end, c.cfps, c.mid, c.first, c.r.region); ok {
			c.r.region, c.r.regionCFP = region, at
			p.noteCFP(i, at)
		} else {
			c.r.region, c.r.regionTorn, c.r.regionCFP = nil, true, le64(c.cfps[2][:], 0)
		}
	}
}

// regionCheck frames a thread's control-frame region with reads of its cfp
// before and after two copies, and between them for a thread that may run
// (mid; see framedReads and settle).
type regionCheck struct {
	r       *threadRef
	lo, end uint64 // the copies start at lo; the VM stack ends at end
	first   []byte
	cfps    [3][8]byte // before, between (if mid) and after the copies
	mid     bool
}

// threadName returns the Ruby name of a thread from its name String,
// cached for the GC epoch.
func (p *walker) threadName(nv uint64) string {
	if s, ok := p.n.cachedString(p.nameCache, nv); ok {
		return s
	}
	wit := p.n.startWitness()
	s, err := p.n.rstring(nv)
	p.n.endWitness(wit)
	if err != nil {
		return ""
	}
	if len(p.nameCache) > 10000 {
		clear(p.nameCache)
	}
	p.nameCache[nv] = genString{s, p.epoch, wit.clip()}
	return s
}

// threadHeads is where a thread's execution context and native thread
// were at the last tick (0: not read there), with the VM stack and cfp it
// held then (for guessRegions).
type threadHeads struct {
	ec, nt          uint64
	start, end, cfp uint64
	misses          uint8 // guesses in a row that missed its frames
}

// noteCFP notes where thread refs[i]'s frames were found this tick, for
// next tick's guess.
func (p *walker) noteCFP(i int, cfp uint64) {
	if p.guessing && i < len(p.knownHeads) && p.knownHeads[i].ec != 0 {
		p.knownHeads[i].cfp = cfp
	}
}

// keepHeads notes where each thread of the known thread list had its
// execution context and native thread this tick, for knownThreadList to
// read them with the thread structs next tick: one system call less per
// tick. A thread that switched fibers points elsewhere; prefetchHeads then
// reads its new context.
func (p *walker) keepHeads(refs []threadRef) {
	if len(refs) != len(p.knownThreads) {
		p.knownHeads = p.knownHeads[:0]
		return
	}
	// The guesses' misses are kept for a thread that stays where it was.
	old := len(p.knownHeads) == len(refs)
	if !old {
		p.knownHeads = append(p.knownHeads[:0], make([]threadHeads, len(refs))...)
	}
	o := &p.rt.o
	for i := range refs {
		r := &refs[i]
		if r.addr != p.knownThreads[i] {
			p.knownHeads = p.knownHeads[:0]
			return
		}
		h := threadHeads{}
		if r.eb != nil {
			h.ec = r.ebAt
			if r.haveTID {
				h.nt = r.tidAt
			}
			h.start, h.cfp = o.ecVMStack.u64(r.eb), o.ecCFP.u64(r.eb)
			h.end = h.start + o.ecVMStackSize.u64(r.eb)*8
			if old && p.knownHeads[i].ec == h.ec {
				h.misses = p.knownHeads[i].misses
			}
		}
		p.knownHeads[i] = h
	}
}

// headReads appends the reads of a thread's execution context head at ec
// and, unless nt is 0, of the tid of its native thread at nt, and notes
// where they were read from (r.ebAt, r.tidAt). r must not move before the
// reads are made (they fill r.tid).
func (p *walker) headReads(reqs []target.Read, r *threadRef, ec, nt uint64) []target.Read {
	r.eb, r.ebAt, r.tidAt = p.scratch.take(p.ecHeadSize()), ec, nt
	reqs = append(reqs, target.Read{Addr: ec, Buf: r.eb})
	if nt != 0 {
		reqs = append(reqs, target.Read{Addr: nt + p.rt.o.ntTID.off, Buf: r.tid[:]})
	}
	return reqs
}

// ecHeadSize is how much of an execution context a tick reads: vm_stack,
// vm_stack_size and cfp lead the struct in every version.
func (p *walker) ecHeadSize() int {
	return int(max(p.rt.o.ecCFP.off, p.rt.o.ecVMStackSize.off) + 8)
}

// maxGapPad is how many extra reads of its cfp may be put between the two
// copies of a running thread's frames (each ~0.35 µs in the batch here).
const maxGapPad = 3

// framedReads appends the reads of a thread's control frames (see settle):
// its cfp (at cfpAddr, into cfps[0]), the frames from lo (first), its cfp
// again if mid (cfps[1], read 1 to 1+maxGapPad times, at random), the
// frames again (second) and its cfp (cfps[2]). mid is for a thread that
// may be running: one that waits for the GVL cannot change its frames
// but by taking it while they are read, which the copies and the cfps
// before and after catch as well.
//
// The copies are two looks at the same bytes some time apart; a thread
// whose loop takes a whole multiple of that time is in the same phase of
// it at both looks, and a copy that mixes two passes of the loop (a caller
// on the line of one call, its callee the other's) then reads the same
// twice. The loop's period and the copy's time stay put for seconds, so
// such a copy passed in run after run of ticks: 3.9 to 6 % of one looping
// thread's samples in one test run in ten (sampler/testdata/torn.rb on
// 3.3.8 with YJIT), against 0 to 0.1 % otherwise. The random number of
// cfp reads between the copies moves the second look by up to a
// microsecond, tick by tick.
func framedReads(reqs []target.Read, cfpAddr, lo uint64, first, second []byte, cfps *[3][8]byte, mid bool) []target.Read {
	reqs = append(reqs, target.Read{Addr: cfpAddr, Buf: cfps[0][:]}, target.Read{Addr: lo, Buf: first})
	if mid {
		for range 1 + rand.IntN(maxGapPad+1) {
			reqs = append(reqs, target.Read{Addr: cfpAddr, Buf: cfps[1][:]})
		}
	}
	return append(reqs, target.Read{Addr: lo, Buf: second}, target.Read{Addr: cfpAddr, Buf: cfps[2][:]})
}

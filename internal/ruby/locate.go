package ruby

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/rbscope/rbscope/internal/target"
)

// locate finds the VM (3.x, 2.2+) or the current thread (older) and the
// global symbol table, from symbols first and by scanning memory when the
// binaries are stripped.
func (p *opener) locate() error {
	switch {
	case p.rt.ractors:
		if a, ok := p.symbol("ruby_current_vm_ptr"); ok {
			p.vmPtrAddr = a
		}
	case p.rt.execContext:
		if a, ok := p.opts.Hints["ruby_current_thread"]; ok {
			// rbspy's manifests name the EC pointer "current thread".
			p.ecPtrAddr = a
			p.note("ruby_current_execution_context_ptr", a, "hint")
		} else if a, ok := p.symbol("ruby_current_execution_context_ptr"); ok {
			p.ecPtrAddr = a
		}
		if a, ok := p.symbol("ruby_current_vm_ptr"); ok {
			p.vmPtrAddr = a
		}
	default:
		if a, ok := p.symbol("ruby_current_thread"); ok {
			p.thPtrAddr = a
		}
		if a, ok := p.symbol("ruby_current_vm"); ok {
			p.vmPtrAddr = a
		}
	}
	if p.vmPtrAddr == 0 && p.ecPtrAddr == 0 && p.thPtrAddr == 0 {
		if err := p.scanForVM(); err != nil {
			return err
		}
	}
	if err := p.checkVM(); err != nil {
		return err
	}
	if a, ok := p.symbol("ruby_global_symbols"); ok {
		p.symbolsAddr = a
	} else if a, ok := p.symbol("global_symbols"); ok {
		p.symbolsAddr = a
	}
	// The global symbol table is needed only for C-function names; a
	// failure to find it is reported per frame, not here.
	return nil
}

// checkVM verifies that the located VM or thread has a plausible shape, so
// that a wrong layout or address gives a clear error instead of garbage.
func (p *opener) checkVM() error {
	ths, err := p.w.threadList()
	if err != nil {
		return fmt.Errorf("read Ruby threads (layout %s): %w", p.rt.lay.Source, err)
	}
	if len(ths) == 0 {
		return fmt.Errorf("%w: the Ruby VM has no threads (layout %s)", ErrInconsistent, p.rt.lay.Source)
	}
	return nil
}

// currentVM reads the VM pointer.
func (p *walker) currentVM() (uint64, error) {
	if p.vmAddr != 0 {
		return p.vmAddr, nil
	}
	if p.vmPtrAddr != 0 {
		vm, err := p.heapPtr(p.vmPtrAddr, "ruby_current_vm_ptr")
		if errors.Is(err, ErrInconsistent) {
			return 0, fmt.Errorf("%w (the VM is not initialised yet?)", err)
		} else if err != nil {
			return 0, err
		}
		p.vmAddr = vm
		return vm, nil
	}
	// From the current thread / EC.
	th, err := p.currentThread()
	if err != nil {
		return 0, err
	}
	if !p.rt.o.thVM.ok {
		return 0, errors.New("layout has no rb_thread_struct.vm")
	}
	vm, err := p.heapPtr(th+p.rt.o.thVM.off, fmt.Sprintf("VM pointer of thread 0x%x", th))
	if err != nil {
		return 0, err
	}
	p.vmAddr = vm
	return vm, nil
}

// heapPtr reads the pointer at addr (what names it in errors) and checks
// that it can point at a heap object.
func (p *Process) heapPtr(addr uint64, what string) (uint64, error) {
	v, err := p.r.u64(addr)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", what, err)
	}
	if !isHeapPtr(v) {
		return 0, invalidf("%s is 0x%x", what, v)
	}
	return v, nil
}

// currentThread returns the rb_thread_t running (holding the GVL) for
// Rubies that export it (before 3.0).
func (p *walker) currentThread() (uint64, error) {
	switch {
	case p.ecPtrAddr != 0:
		ec, err := p.heapPtr(p.ecPtrAddr, "current execution context")
		if err != nil {
			return 0, err
		}
		if !p.rt.o.ecThreadPtr.ok {
			return 0, errors.New("layout has no rb_execution_context_struct.thread_ptr")
		}
		th, err := p.r.u64(ec + p.rt.o.ecThreadPtr.off)
		if err != nil {
			return 0, fmt.Errorf("read EC's thread: %w", err)
		}
		return th, nil
	case p.thPtrAddr != 0:
		return p.heapPtr(p.thPtrAddr, "ruby_current_thread")
	}
	return 0, errors.New("no current thread pointer known")
}

// threadRef is one Ruby thread found in the VM.
type threadRef struct {
	addr uint64
	main bool
	gvl  bool
	// waiting: in the GVL's wait list
	waiting bool
	ractor  uint64
	tb      []byte // the rb_thread_t, when already read

	// Read by prefetchHeads for the whole tick (see tick.go).
	eb         []byte  // the execution context's head
	ebAt       uint64  // the execution context eb was read from
	haveTID    bool    // tid holds the native thread's tid
	tid        [4]byte //
	tidAt      uint64  // the native thread tid was read from (0: none)
	region     []byte  // the control frames from regionCFP, consistent
	regionCFP  uint64  // where region starts, or the latest cfp seen
	still      bool    // region is the kept copy of a thread that has not run since (stillStack)
	regionTorn bool    // the stack changed while it was read
}

const maxListLen = 100000

// walkList follows a ccan list_head at head, calling fn with each node's
// address; it stops at head, on a cycle bound or on a read error.
func (p *walker) walkList(head uint64, fn func(node uint64) error) error {
	node, err := p.r.u64(head)
	if err != nil {
		return fmt.Errorf("read list head at 0x%x: %w", head, err)
	}
	for i := 0; node != head; i++ {
		if i >= maxListLen || !isHeapPtr(node) {
			return invalidf("list at 0x%x is broken at node 0x%x", head, node)
		}
		if err := fn(node); err != nil {
			return err
		}
		next, err := p.r.u64(node)
		if err != nil {
			return fmt.Errorf("read list node at 0x%x: %w", node, err)
		}
		node = next
	}
	return nil
}

// threadList lists the VM's Ruby threads (the source of truth, re-read on
// every snapshot).
func (p *walker) threadList() ([]threadRef, error) {
	o := &p.rt.o
	switch {
	case p.rt.ractors:
		vm, err := p.currentVM()
		if err != nil {
			return nil, err
		}
		var ractors []uint64
		cnt := uint64(0)
		if o.vmRactorCnt.ok {
			if c, err := p.r.u32(vm + o.vmRactorCnt.off); err == nil {
				cnt = uint64(c)
			}
		}
		p.ractors = int(cnt)
		if cnt > 1 && o.vmRactorSet.ok && o.ractorVMLRNode.ok {
			err = p.walkList(vm+o.vmRactorSet.off, func(node uint64) error {
				ractors = append(ractors, node-o.ractorVMLRNode.off)
				return nil
			})
		}
		if len(ractors) == 0 || err != nil {
			// One ractor (the common case): the main one.
			mr, err2 := p.heapPtr(vm+o.vmMainRactor.off, "main ractor pointer")
			if err2 != nil {
				return nil, err2
			}
			ractors = []uint64{mr}
		}
		var out []threadRef
		for _, ra := range ractors {
			b, err := p.r.readOwned(ra, int(o.ractorSize))
			if err != nil {
				return nil, fmt.Errorf("read ractor at 0x%x: %w", ra, err)
			}
			mainTh := o.ractorThreadsMain.u64(b)
			runEC := o.ractorRunningEC.u64(b)
			owner, ownerKnown := p.ownerFrom(b, false)
			// Follow the list through the thread structs themselves (the
			// list node is inside rb_thread_t), keeping each struct.
			first := len(out)
			head := ra + o.ractorThreadsSet.off
			node := le64(b, o.ractorThreadsSet.off)
			for i := 0; node != head; i++ {
				if i >= maxListLen || !isHeapPtr(node) {
					return nil, invalidf("thread list of ractor 0x%x is broken at node 0x%x", ra, node)
				}
				th := node - o.thLTNode.off
				tb, err := p.r.readOwned(th, int(o.thSize))
				if err != nil {
					return nil, fmt.Errorf("read thread at 0x%x: %w", th, err)
				}
				ref := threadRef{addr: th, main: th == mainTh, ractor: ra, tb: tb}
				if ownerKnown {
					ref.gvl = owner != 0 && th == owner
				} else if runEC != 0 && o.thEC.ok && o.thEC.u64(tb) == runEC {
					ref.gvl = true
				}
				out = append(out, ref)
				node = le64(tb, o.thLTNode.off)
			}
			p.markWaiters(ra, b, out[first:])
		}
		return out, nil
	case p.rt.livingThreads:
		vm, err := p.currentVM()
		if err != nil {
			return nil, err
		}
		cur, _ := p.currentThread()
		b, err := p.r.readOwned(vm, int(o.vmSize))
		if err != nil {
			return nil, fmt.Errorf("read VM: %w", err)
		}
		mainTh := o.vmMainThread.u64(b)
		if owner, ok := p.ownerFrom(b, true); ok {
			cur = owner
		}
		var out []threadRef
		err = p.walkList(vm+o.vmLivingThreads.off, func(node uint64) error {
			th := node - o.thVMLTNode.off
			out = append(out, threadRef{addr: th, main: th == mainTh, gvl: cur != 0 && th == cur})
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("list living threads: %w", err)
		}
		return out, nil
	default:
		// Ruby < 2.2 keeps threads in an st_table; report the running one.
		cur, err := p.currentThread()
		if err != nil {
			return nil, err
		}
		return []threadRef{{addr: cur, main: true, gvl: true}}, nil
	}
}

// scanForVM finds the VM (or the current EC/thread pointer) without
// symbols: it scans the writable data of the Ruby binaries for a pointer
// whose target passes structural checks, as rbspy does for stripped
// binaries.
func (p *opener) scanForVM() error {
	maps, err := p.t.Mappings()
	if err != nil {
		return fmt.Errorf("read mappings: %w", err)
	}
	regions := dataRegions(maps, p.info.Binaries)
	if len(regions) == 0 {
		return fmt.Errorf("%w: no data segment of a Ruby binary to search", ErrNotRuby)
	}
	heap := readableRanges(maps)
	found, err := p.scanWords(regions, 8, func(addr uint64, data []byte) bool {
		val := binary.LittleEndian.Uint64(data)
		return isHeapPtr(val) && inRanges(heap, val) && p.tryCandidate(addr)
	})
	if found || err != nil {
		return err
	}
	return fmt.Errorf("%w: no symbol for the Ruby VM and no plausible VM pointer in the data of %s",
		ErrNotRuby, binaryNames(p.info.Binaries))
}

// maxScanRegion bounds the data region a memory scan reads at once.
const maxScanRegion = 64 << 20

// scanWords reads each region (skipping unreadable ones and any larger
// than maxScanRegion) and calls match at every 8-byte-aligned address
// with at least need bytes of the region from it, until match says it
// found what it looks for. A process that refuses to be read, or is gone,
// ends the scan with that error.
func (p *Process) scanWords(regions []addrRange, need uint64, match func(addr uint64, data []byte) bool) (bool, error) {
	for _, rg := range regions {
		size := rg.End - rg.Start
		if size > maxScanRegion {
			continue
		}
		data := make([]byte, size)
		if err := p.t.ReadAt(data, rg.Start); err != nil {
			if errors.Is(err, target.ErrDenied) || errors.Is(err, target.ErrExited) {
				return false, fmt.Errorf("scan the data of %s: %w", binaryNames(p.info.Binaries), err)
			}
			continue
		}
		for off := uint64(0); off+need <= size; off += 8 {
			if match(rg.Start+off, data[off:]) {
				return true, nil
			}
		}
	}
	return false, nil
}

// tryCandidate checks whether addr holds the VM pointer (3.x), the EC
// pointer (2.5-2.7) or the current thread pointer (older).
func (p *opener) tryCandidate(addr uint64) bool {
	save := *p.Process
	ok := false
	switch {
	case p.rt.ractors:
		p.vmPtrAddr = addr
		ok = p.plausibleVM3()
	case p.rt.execContext:
		p.ecPtrAddr = addr
		ok = p.plausibleThread()
	default:
		p.thPtrAddr = addr
		ok = p.plausibleThread()
	}
	if ok {
		name := map[bool]string{true: "ruby_current_vm_ptr", false: "ruby_current_thread"}[p.rt.ractors]
		if p.ecPtrAddr != 0 {
			name = "ruby_current_execution_context_ptr"
		}
		p.note(name, addr, "memory scan")
		return true
	}
	caches := p.caches
	*p.Process = save
	p.caches = caches
	return false
}

// plausibleVM3: vm.ractor.main_ractor -> ractor whose main thread points
// back to the VM and the ractor.
func (p *opener) plausibleVM3() bool {
	o := &p.rt.o
	vm, err := p.r.u64(p.vmPtrAddr)
	if err != nil || !isHeapPtr(vm) {
		return false
	}
	mr, err := p.r.u64(vm + o.vmMainRactor.off)
	if err != nil || !isHeapPtr(mr) {
		return false
	}
	mainTh, err := p.r.u64(mr + o.ractorThreadsMain.off)
	if err != nil || !isHeapPtr(mainTh) {
		return false
	}
	thVM, err := p.r.u64(mainTh + o.thVM.off)
	if err != nil || thVM != vm {
		return false
	}
	if f, err := p.rt.lay.Field("rb_thread_struct", "ractor"); err == nil {
		r, err := p.r.u64(mainTh + f.Offset)
		if err != nil || r != mr {
			return false
		}
	}
	p.vmAddr = 0
	return true
}

// plausibleThread: the current thread's VM points to a VM whose main
// thread's VM is the same VM.
func (p *opener) plausibleThread() bool {
	th, err := p.w.currentThread()
	if err != nil || !isHeapPtr(th) {
		return false
	}
	vm, err := p.r.u64(th + p.rt.o.thVM.off)
	if err != nil || !isHeapPtr(vm) {
		return false
	}
	if p.rt.o.vmMainThread.ok {
		mt, err := p.r.u64(vm + p.rt.o.vmMainThread.off)
		if err != nil || !isHeapPtr(mt) {
			return false
		}
		mvm, err := p.r.u64(mt + p.rt.o.thVM.off)
		if err != nil || mvm != vm {
			return false
		}
	}
	p.vmAddr = 0
	return true
}

type addrRange struct{ Start, End uint64 }

// dataRegions returns the writable mappings of the Ruby binaries and the
// anonymous mapping right after each (.bss).
func dataRegions(maps []target.Mapping, bins []Binary) []addrRange {
	var out []addrRange
	for i, m := range maps {
		isRuby := false
		for _, b := range bins {
			if m.Path == b.Path {
				isRuby = true
			}
		}
		if !isRuby || !strings.Contains(m.Perms, "w") {
			continue
		}
		out = append(out, addrRange{m.Start, m.End})
		if i+1 < len(maps) && maps[i+1].Path == "" && maps[i+1].Start == m.End {
			out = append(out, addrRange{maps[i+1].Start, maps[i+1].End})
		}
	}
	return out
}

func readableRanges(maps []target.Mapping) []addrRange {
	var out []addrRange
	for _, m := range maps {
		if strings.HasPrefix(m.Perms, "r") || m.Perms == "" {
			out = append(out, addrRange{m.Start, m.End})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Start < out[j].Start })
	return out
}

func inRanges(rs []addrRange, a uint64) bool {
	i := sort.Search(len(rs), func(i int) bool { return rs[i].End > a })
	return i < len(rs) && rs[i].Start <= a
}

func binaryNames(bins []Binary) string {
	var names []string
	for _, b := range bins {
		names = append(names, b.Path)
	}
	return strings.Join(names, ", ")
}

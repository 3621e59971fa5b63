package ruby

import "github.com/rbscope/rbscope/internal/target"

// FrameRegions returns, for every Ruby thread, a read of its control-frame
// region (from its current cfp to the end of its VM stack), with buffers
// allocated: the least a sample of every stack must read. Benchmarks use
// one ReadBatch of them as the floor of a tick's cost.
func (p *Process) FrameRegions() ([]target.Read, error) {
	refs, err := p.w.threadList()
	if err != nil {
		return nil, err
	}
	o := &p.rt.o
	var out []target.Read
	for _, ref := range refs {
		tb := ref.tb
		if tb == nil {
			if tb, err = p.r.readOwned(ref.addr, int(o.thSize)); err != nil {
				return nil, err
			}
		}
		var start, size, cfp uint64
		if o.thEC.ok {
			ec := o.thEC.u64(tb)
			if !isHeapPtr(ec) {
				continue
			}
			eb, err := p.r.readOwned(ec, int(max(o.ecCFP.off, o.ecVMStackSize.off)+8))
			if err != nil {
				return nil, err
			}
			start, size, cfp = o.ecVMStack.u64(eb), o.ecVMStackSize.u64(eb), o.ecCFP.u64(eb)
		} else {
			start, size, cfp = o.thStack.u64(tb), o.thStackSize.u64(tb), o.thCFP.u64(tb)
		}
		end := start + size*8
		if cfp == 0 || cfp < start || cfp >= end {
			continue
		}
		_, n := p.w.frameSpan(start, end, cfp, false)
		out = append(out, target.Read{Addr: cfp, Buf: make([]byte, n)})
	}
	return out, nil
}

package ruby

import (
	"errors"
	"fmt"
	"strings"

	"github.com/rbscope/rbscope/internal/layout"
)

// ErrNoLayout is returned when no layout at hand fits the process: the
// built-in tables lack its exact release and none of its series' tables
// passes the checks on the process itself.
var ErrNoLayout = errors.New("no layout fits this Ruby process")

// Bounds of validateLayout: the threads and frames it checks (a wrong
// layout fails on the first few), and how often it re-reads a live
// process whose stacks moved under it.
const (
	validateThreads = 64
	validateFrames  = 4096
	validateTries   = 3
	maxVMStackWords = 1 << 28
)

// openLayout checks the layout versionAndLayout chose and locates the VM
// with it. A layout from
// DWARF, the exact built-in release or the caller is used as it is; when
// the tables lack the exact release every table of the series is a
// candidate, newest first, and the first one whose reading of the process
// passes validateLayout is taken (Source says so). None passing is
// ErrNoLayout, never a guess.
func (p *opener) openLayout() error {
	cands := p.opts.LayoutCandidates
	lacks := ""
	if len(cands) == 0 {
		// p.rt.lay is what versionAndLayout chose (DWARF, a table, or
		// the caller's).
		if !strings.Contains(p.rt.lay.Source, layout.NearestMarker) {
			return p.locate()
		}
		names, err := layout.BuiltinSeries(p.rt.version)
		if err != nil {
			return err
		}
		lacks = fmt.Sprintf("; the tables lack Ruby %s", p.rt.version)
		for _, n := range names {
			l, err := layout.BuiltinRelease(n)
			if err != nil {
				return err
			}
			cands = append(cands, l)
		}
	}
	var why []string
	for _, l := range cands {
		// The candidate is copied: its Source says how it was chosen.
		cl := *l
		if cl.Source == "" {
			cl.Source = "builtin:" + l.RubyVersion
		}
		cl.Source += " (checked on the process" + lacks + ")"
		err := p.tryLayout(&cl)
		if err == nil {
			return nil
		}
		why = append(why, fmt.Sprintf("%s: %v", l.RubyVersion, err))
	}
	return fmt.Errorf("%w: no candidate table reads this Ruby %s process consistently (%s)%s; give rbscope the Ruby binary's DWARF or its debug file",
		ErrNoLayout, p.rt.version, strings.Join(why, "; "), lacks)
}

// tryLayout uses l (in a Runtime of its own), locates the VM with it and
// checks what it reads.
func (p *opener) tryLayout(l *layout.Layout) error {
	rt, err := newRuntime(p.rt.version, p.rt.versionSource, l)
	if err != nil {
		return err
	}
	p.useRuntime(rt)
	p.vmAddr, p.vmPtrAddr, p.ecPtrAddr, p.thPtrAddr = 0, 0, 0, 0
	if err := p.locate(); err != nil {
		return err
	}
	for try := 0; ; try++ {
		err = p.validateLayout()
		if err == nil || try+1 >= validateTries || p.stoppedAll {
			return err
		}
	}
}

// validateLayout checks invariants of the process as the layout reads it:
// the thread list closes (threadList), every started thread's execution
// context points back at it and into a VM stack of sane size, its control
// frames lie inside that stack, and each frame's iseq slot is empty or an
// imemo of a kind a frame holds (iseq, C-block ifunc, method entry). At
// least one frame must hold an iseq. A live process's stacks move while
// they are read, so the caller retries.
func (p *opener) validateLayout() error {
	o := &p.rt.o
	refs, err := p.w.threadList()
	if err != nil {
		return err
	}
	if len(refs) == 0 {
		return invalidf("the VM has no threads")
	}
	if !o.cfpIseq.ok || p.rt.o.cfpSize == 0 {
		return invalidf("the layout has no control frame iseq")
	}
	iseqs := 0
	for i, ref := range refs {
		if i >= validateThreads {
			break
		}
		tb := ref.tb
		if tb == nil {
			if tb, err = p.r.readOwned(ref.addr, int(o.thSize)); err != nil {
				return fmt.Errorf("read thread 0x%x: %w", ref.addr, err)
			}
		}
		var stackStart, stackSize, cfp uint64
		if o.thEC.ok {
			ec := o.thEC.u64(tb)
			if !isHeapPtr(ec) {
				return invalidf("thread 0x%x has execution context 0x%x", ref.addr, ec)
			}
			n := uint64(p.w.ecHeadSize())
			if o.ecThreadPtr.ok && o.ecThreadPtr.off+8 > n {
				n = o.ecThreadPtr.off + 8
			}
			eb, err := p.r.readOwned(ec, int(n))
			if err != nil {
				return fmt.Errorf("read execution context 0x%x: %w", ec, err)
			}
			if o.ecThreadPtr.ok {
				if back := o.ecThreadPtr.u64(eb); back != ref.addr {
					return invalidf("execution context 0x%x of thread 0x%x points at thread 0x%x", ec, ref.addr, back)
				}
			}
			stackStart, stackSize, cfp = o.ecVMStack.u64(eb), o.ecVMStackSize.u64(eb), o.ecCFP.u64(eb)
		} else {
			stackStart, stackSize, cfp = o.thStack.u64(tb), o.thStackSize.u64(tb), o.thCFP.u64(tb)
		}
		if cfp == 0 && stackStart == 0 {
			continue // not started yet
		}
		if !isHeapPtr(stackStart) || stackSize == 0 || stackSize > maxVMStackWords {
			return invalidf("thread 0x%x has a VM stack of %d words at 0x%x", ref.addr, stackSize, stackStart)
		}
		end := stackStart + stackSize*8
		if cfp < stackStart || cfp >= end || (end-cfp)%o.cfpSize != 0 {
			return invalidf("thread 0x%x: control frame 0x%x is not a frame of its VM stack 0x%x-0x%x", ref.addr, cfp, stackStart, end)
		}
		n, err := p.checkFrames(cfp, end)
		if err != nil {
			return fmt.Errorf("thread 0x%x: %w", ref.addr, err)
		}
		iseqs += n
	}
	if iseqs == 0 {
		return invalidf("no control frame of any thread holds an iseq")
	}
	return nil
}

// checkFrames checks the iseq slot of the control frames from cfp to the
// end of the VM stack and returns how many hold an iseq.
func (p *opener) checkFrames(cfp, end uint64) (int, error) {
	o := &p.rt.o
	frames := (end - cfp) / o.cfpSize
	if frames > validateFrames {
		frames = validateFrames
	}
	b, err := p.r.readOwned(cfp, int(frames*o.cfpSize))
	if err != nil {
		return 0, fmt.Errorf("read %d control frames at 0x%x: %w", frames, cfp, err)
	}
	iseqs := 0
	if !p.rt.epFrames {
		// Before 2.3 an iseq is a T_DATA, not an imemo: the stack
		// bounds above are the check.
		return 1, nil
	}
	var hdr [8]byte
	for i := uint64(0); i < frames; i++ {
		f := b[i*o.cfpSize : (i+1)*o.cfpSize]
		iseq := o.cfpIseq.u64(f)
		if iseq == 0 {
			continue
		}
		if !isHeapPtr(iseq) {
			return 0, invalidf("control frame %d holds iseq 0x%x", i, iseq)
		}
		if err := p.t.ReadAt(hdr[:], iseq); err != nil {
			return 0, invalidf("control frame %d holds iseq 0x%x, which cannot be read", i, iseq)
		}
		flags := le64(hdr[:], 0)
		if flags&tMask != tImemo {
			return 0, invalidf("control frame %d holds 0x%x, of type 0x%x, not an imemo", i, iseq, flags&tMask)
		}
		switch (flags >> flUShift) & 0x0f {
		case imemoIseq:
			iseqs++
		case imemoIfunc, imemoMent:
		default:
			return 0, invalidf("control frame %d holds imemo 0x%x of kind %d", i, iseq, (flags>>flUShift)&0x0f)
		}
	}
	return iseqs, nil
}

package ruby

import (
	"encoding/binary"
	"fmt"
)

// The walker caches what it reads about iseqs, method entries, classes and
// strings by their addresses, and GC frees those objects and reuses their
// addresses. An object that is reachable while GC.count is N stays where
// it is until the sweep of GC N+1 at the earliest, and GC N+1 increments
// the count when it starts. So a cache entry built while the count was N
// holds as long as the count is still N; after a GC it must be checked
// again. The count (objspace->profile.count) lives in gc.c's private
// rb_objspace, which no layout table describes; rb_gc_count(), Ruby's
// public GC.count, is a tiny function that loads exactly that word, so its
// machine code gives the address.

// When the count cannot be found, every snapshot is an epoch of its own:
// every cache entry is checked again on its first use in each snapshot.

// maxGCCodeBytes bounds the code of rb_gc_count that is decoded.
const maxGCCodeBytes = 64

// findGCCount locates the word GC.count reads, by running rb_gc_count's
// loads (lea/mov reg, [rip+d] / [reg+d]) against the target's memory.
func (p *Process) findGCCount() (uint64, error) {
	fn, ok := p.codeSymbol("rb_gc_count")
	if !ok {
		return 0, fmt.Errorf("no rb_gc_count symbol")
	}
	code := make([]byte, maxGCCodeBytes)
	if err := p.t.ReadAt(code, fn); err != nil {
		return 0, fmt.Errorf("read rb_gc_count code: %w", err)
	}
	load := func(a uint64) (uint64, error) { return p.r.u64(a) }
	// From 3.4 (the modular GC), rb_gc_count calls rb_gc_get_objspace
	// (GET_VM()->gc.objspace, itself a chain of loads) and loads the
	// count from what it returns.
	call := func() (uint64, error) {
		getter, ok := p.codeSymbol("rb_gc_get_objspace")
		if !ok {
			return 0, fmt.Errorf("a call, and no rb_gc_get_objspace symbol")
		}
		gcode := make([]byte, maxGCCodeBytes)
		if err := p.t.ReadAt(gcode, getter); err != nil {
			return 0, fmt.Errorf("read rb_gc_get_objspace code: %w", err)
		}
		a, err := lastLoad(gcode, getter, load, nil)
		if err != nil {
			return 0, fmt.Errorf("decode rb_gc_get_objspace: %w", err)
		}
		return p.r.u64(a)
	}
	addr, err := lastLoad(code, fn, load, call)
	if err != nil {
		return 0, fmt.Errorf("decode rb_gc_count: %w", err)
	}
	return addr, nil
}

// codeSymbol returns the run-time address of a function symbol.
func (p *Process) codeSymbol(name string) (uint64, bool) {
	for _, s := range p.syms {
		if sym, ok := s.syms.Lookup(name); ok && sym.Value != 0 && !sym.TLS {
			return sym.Value, true
		}
	}
	return 0, false
}

// lastLoad emulates the 64-bit register loads of a leaf function that
// returns a value read through a chain of pointers (start of code at pc),
// reading memory with load, and returns the address of the last load
// before ret. It accepts only what such a function is made of (endbr64,
// frame pointer set-up, stack alignment, lea and mov r64 loads, ret, and a
// call when call is given: it stands for the callee and returns its rax)
// and fails on anything else.
func lastLoad(code []byte, pc uint64, load func(uint64) (uint64, error), call func() (uint64, error)) (uint64, error) {
	var regs [16]uint64
	var known [16]bool
	last := uint64(0)
	i := 0
	for i < len(code) {
		switch {
		case i+4 <= len(code) && code[i] == 0xf3 && code[i+1] == 0x0f && code[i+2] == 0x1e && code[i+3] == 0xfa: // endbr64
			i += 4
			continue
		case code[i] == 0x55 || code[i] == 0x5d: // push rbp / pop rbp
			i++
			continue
		case i+3 <= len(code) && code[i] == 0x48 && code[i+1] == 0x89 && code[i+2] == 0xe5: // mov rbp, rsp
			i += 3
			continue
		case i+4 <= len(code) && code[i] == 0x48 && code[i+1] == 0x83 && (code[i+2] == 0xec || code[i+2] == 0xc4): // sub/add rsp, imm8
			i += 4
			continue
		case i+5 <= len(code) && code[i] == 0xe8: // call rel32
			if call == nil {
				return 0, fmt.Errorf("call at +%d", i)
			}
			v, err := call()
			if err != nil {
				return 0, err
			}
			for r := range known {
				known[r] = false // the callee may clobber them
			}
			regs[0], known[0] = v, true
			i += 5
			continue
		case code[i] == 0xc3: // ret
			if last == 0 {
				return 0, fmt.Errorf("no load before ret")
			}
			return last, nil
		}
		reg, lea, addr, j, err := memOperand(code, i, pc, &regs, &known)
		if err != nil {
			return 0, err
		}
		i = j
		if lea {
			regs[reg], known[reg] = addr, true
			continue
		}
		v, err := load(addr)
		if err != nil {
			return 0, fmt.Errorf("load at 0x%x: %w", addr, err)
		}
		regs[reg], known[reg] = v, true
		last = addr
	}
	return 0, fmt.Errorf("no ret within %d bytes", len(code))
}

// memOperand decodes the mov or lea at code[i] (mov r64, r/m64 or lea
// r64, m: REX.W (0x48-0x4f) 8b|8d modrm [sib] [disp]), the function
// starting at pc, with the registers known so far: its destination
// register, whether it is a lea, the address it reads or computes, and
// where the next instruction starts.
func memOperand(code []byte, i int, pc uint64, regs *[16]uint64, known *[16]bool) (int, bool, uint64, int, error) {
	if i+3 > len(code) || code[i]&0xf8 != 0x48 || (code[i+1] != 0x8b && code[i+1] != 0x8d) {
		return 0, false, 0, 0, fmt.Errorf("unexpected instruction byte 0x%02x at +%d", code[i], i)
	}
	lea := code[i+1] == 0x8d
	rex := code[i]
	modrm := code[i+2]
	mod, reg, rm := modrm>>6, int(modrm>>3&7), int(modrm&7)
	if rex&4 != 0 {
		reg += 8
	}
	base := rm
	if rex&1 != 0 {
		base += 8
	}
	j := i + 3
	var addr uint64
	switch {
	case mod == 3:
		return 0, false, 0, 0, fmt.Errorf("register move at +%d", i)
	case mod == 0 && rm == 5: // [rip + disp32]
		if j+4 > len(code) {
			return 0, false, 0, 0, fmt.Errorf("truncated at +%d", i)
		}
		disp := int32(binary.LittleEndian.Uint32(code[j:]))
		j += 4
		addr = pc + uint64(j) + uint64(int64(disp))
	case rm == 4: // SIB: only [disp32] (no base, no index) is accepted
		if j+1 > len(code) {
			return 0, false, 0, 0, fmt.Errorf("truncated at +%d", i)
		}
		sib := code[j]
		j++
		if mod != 0 || sib != 0x25 || j+4 > len(code) {
			return 0, false, 0, 0, fmt.Errorf("indexed load at +%d", i)
		}
		addr = uint64(int64(int32(binary.LittleEndian.Uint32(code[j:]))))
		j += 4
	default:
		if !known[base] {
			return 0, false, 0, 0, fmt.Errorf("load through an unknown register at +%d", i)
		}
		var disp int64
		switch mod {
		case 1:
			if j+1 > len(code) {
				return 0, false, 0, 0, fmt.Errorf("truncated at +%d", i)
			}
			disp = int64(int8(code[j]))
			j++
		case 2:
			if j+4 > len(code) {
				return 0, false, 0, 0, fmt.Errorf("truncated at +%d", i)
			}
			disp = int64(int32(binary.LittleEndian.Uint32(code[j:])))
			j += 4
		}
		addr = regs[base] + uint64(disp)
	}
	return reg, lea, addr, j, nil
}

// beginEpoch starts a snapshot: it reads the GC count, or, when it is not
// known, makes this snapshot an epoch of its own.
func (p *Process) beginEpoch() {
	p.ensureGCCount()
	if p.gcCountAddr != 0 {
		if n, err := p.r.u64(p.gcCountAddr); err == nil {
			// +1: entries never built have generation 0.
			p.epoch = n + 1
			return
		}
	}
	p.fallbackEpoch++
	p.epoch = 1<<63 | p.fallbackEpoch
}

// ensureGCCount looks for the GC count once.
func (p *Process) ensureGCCount() {
	if p.gcCountTried {
		return
	}
	p.gcCountTried = true
	if a, err := p.findGCCount(); err == nil {
		p.gcCountAddr = a
		p.note("gc_count", a, "rb_gc_count code")
	}
}

// GCCount returns the target's GC count (GC.count) when rbscope found where
// Ruby keeps it.
func (p *Process) GCCount() (uint64, bool, error) {
	p.ensureGCCount()
	if p.gcCountAddr == 0 {
		return 0, false, nil
	}
	n, err := p.r.u64(p.gcCountAddr)
	if err != nil {
		return 0, false, fmt.Errorf("read GC count: %w", err)
	}
	return n, true, nil
}

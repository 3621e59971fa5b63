package alloc

import (
	"debug/elf"
	"errors"
	"fmt"
	"sort"
	"strings"

	"golang.org/x/arch/x86/x86asm"
)

// Ruby fires its create probes (RUBY_DTRACE_CREATE_HOOK) before it
// allocates: the probe knows the class and the site, not the new
// object's address. For the retained view the address is taken where the
// allocation returns: from each create probe the machine code is followed
// forward (through jumps, both ways at conditional branches) to the first
// call on every path: the allocator (an indirect call through
// rb_alloc_func_t after object__create; a call into gc.c's newobj
// functions after string__, array__ and hash__create, which live in other
// files and are never inlined into the probe's function). A second probe
// on the instruction after each such call reads the VALUE the call
// returned (rax) and pairs it with the thread's pending create event.
// No DWARF is needed: only the probe sites (ELF notes) and the code.

// maxRetPath bounds the instructions followed from one probe site (over
// all its paths), and maxRetSites the return sites it may have.
const (
	maxRetPath  = 512
	maxRetSites = 12
)

// errNoCall says the code after a probe site reaches no call.
var errNoCall = errors.New("no call follows the probe site")

// returnSites returns the virtual addresses of the instructions after the
// calls that may allocate on each path from the probe at vaddr probe in
// code (which starts at vaddr base). A path stops at a call that
// allocates for sure: an indirect call (the allocator after
// object__create) or a call to a function named in allocFuncs; other
// calls are followed through, at most maxCallsPerPath of them, and are
// return sites too unless the code after them uses only part of rax or
// drops it (returnsWord: a helper that says whether a string fits in its
// slot returns a bool, and the rest of rax is stale): the program pairs
// the first one that returns an object of the probe's type and ignores
// the others. name names a direct call's target ("" when unknown).
func returnSites(code []byte, base, probe uint64, name func(uint64) string) ([]uint64, error) {
	if probe < base || probe >= base+uint64(len(code)) {
		return nil, fmt.Errorf("probe 0x%x outside the code read (0x%x+%d)", probe, base, len(code))
	}
	type state struct {
		pc    uint64
		calls int
	}
	seen := map[uint64]bool{}
	rets := map[uint64]bool{}
	work := []state{{probe, 0}}
	steps := 0
	for len(work) > 0 {
		st := work[len(work)-1]
		work = work[:len(work)-1]
		pc, calls := st.pc, st.calls
		for {
			if seen[pc] {
				break
			}
			seen[pc] = true
			if steps++; steps > maxRetPath {
				return nil, fmt.Errorf("probe 0x%x: more than %d instructions before its calls", probe, maxRetPath)
			}
			if pc < base || pc >= base+uint64(len(code)) {
				// A jump far away: a tail call (into the PLT, or
				// another function). The path ends there.
				break
			}
			inst, err := x86asm.Decode(code[pc-base:], 64)
			if err != nil {
				return nil, fmt.Errorf("probe 0x%x: decode at 0x%x: %w", probe, pc, err)
			}
			next := pc + uint64(inst.Len)
			stop := false
			switch {
			case inst.Op == x86asm.CALL:
				calls++
				rel, direct := inst.Args[0].(x86asm.Rel)
				alloc := !direct || allocFuncs[name(uint64(int64(next)+int64(rel)))]
				if alloc || returnsWord(code, base, next) {
					rets[next] = true
				}
				if alloc || calls >= maxCallsPerPath {
					stop = true
				}
			case inst.Op == x86asm.RET, inst.Op == x86asm.UD2, inst.Op == x86asm.HLT:
				// The path ends (or traps: __builtin_unreachable).
				stop = true
			case inst.Op == x86asm.JMP:
				rel, ok := inst.Args[0].(x86asm.Rel)
				if !ok {
					// A tail call or a jump table: the path is not
					// followed further.
					stop = true
					break
				}
				next = uint64(int64(next) + int64(rel))
			case isCondJump(inst.Op):
				rel, ok := inst.Args[0].(x86asm.Rel)
				if !ok {
					return nil, fmt.Errorf("probe 0x%x: conditional jump without a target at 0x%x", probe, pc)
				}
				work = append(work, state{uint64(int64(next) + int64(rel)), calls})
			}
			if stop {
				break
			}
			pc = next
		}
	}
	if len(rets) == 0 {
		return nil, fmt.Errorf("probe 0x%x: %w", probe, errNoCall)
	}
	if len(rets) > maxRetSites {
		return nil, fmt.Errorf("probe 0x%x: %d calls follow it (at most %d)", probe, len(rets), maxRetSites)
	}
	out := make([]uint64, 0, len(rets))
	for r := range rets {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out, nil
}

// returnsWord reports whether the code at pc (after a call) may use the
// call's result as a 64-bit word: false when the first instruction that
// touches rax reads only part of it (al, ax, eax: the callee returns a
// bool or an int) or overwrites it unread (the result is dropped). The
// upper bits of rax after a function that returns a bool are whatever
// it held before: Ruby 3.4's str_enc_new asks rb_gc_size_allocatable_p
// whether a string fits in a slot right after its probe, and rax still
// holds the probe's source path, the buffer of a live String, whose slot
// the return probe then took for the new string. The code is followed
// straight on, up to maxWordScan instructions; a jump, call or return
// before rax is touched, or code that does not decode, says "may".
func returnsWord(code []byte, base, pc uint64) bool {
	for k := 0; k < maxWordScan; k++ {
		if pc < base || pc >= base+uint64(len(code)) {
			return true
		}
		inst, err := x86asm.Decode(code[pc-base:], 64)
		if err != nil {
			return true
		}
		switch use := raxUse(inst); use {
		case raxFull:
			return true
		case raxPart, raxWritten:
			return false
		}
		switch {
		case inst.Op == x86asm.CALL, inst.Op == x86asm.RET, inst.Op == x86asm.JMP, isCondJump(inst.Op):
			return true
		}
		pc += uint64(inst.Len)
	}
	return true
}

// maxWordScan bounds the instructions returnsWord reads after a call.
const maxWordScan = 16

// How an instruction uses rax.
const (
	raxNone    = iota
	raxFull    // reads all of rax (a register operand, or an address)
	raxPart    // reads al, ah, ax or eax and not rax
	raxWritten // writes rax (or part of it) without reading it
)

// raxUse says how inst uses rax. The destination (the first operand in
// x86asm's Intel order) of a move, a load of an address or a set is
// written only; xor or sub of a register with itself is a zeroing idiom.
func raxUse(inst x86asm.Inst) int {
	writeOnly := false
	switch inst.Op {
	case x86asm.MOV, x86asm.MOVZX, x86asm.MOVSX, x86asm.MOVSXD, x86asm.LEA, x86asm.POP,
		x86asm.SETA, x86asm.SETAE, x86asm.SETB, x86asm.SETBE, x86asm.SETE, x86asm.SETG, x86asm.SETGE,
		x86asm.SETL, x86asm.SETLE, x86asm.SETNE, x86asm.SETNO, x86asm.SETNP, x86asm.SETNS, x86asm.SETO,
		x86asm.SETP, x86asm.SETS:
		writeOnly = true
	case x86asm.XOR, x86asm.SUB:
		if a, ok := inst.Args[0].(x86asm.Reg); ok && inst.Args[1] == a {
			writeOnly = true
		}
	}
	full, part, written := false, false, false
	for i, a := range inst.Args {
		switch a := a.(type) {
		case nil:
		case x86asm.Reg:
			if a == x86asm.RAX {
				if i == 0 && writeOnly {
					written = true
				} else {
					full = true
				}
				continue
			}
			if a == x86asm.AL || a == x86asm.AH || a == x86asm.AX || a == x86asm.EAX {
				if i == 0 && writeOnly {
					written = true
				} else {
					part = true
				}
			}
		case x86asm.Mem:
			if a.Base == x86asm.RAX || a.Index == x86asm.RAX {
				full = true
			}
			if a.Base == x86asm.EAX || a.Index == x86asm.EAX {
				part = true
			}
		}
	}
	switch {
	case full:
		return raxFull
	case part:
		return raxPart
	case written:
		return raxWritten
	}
	return raxNone
}

// maxCallsPerPath bounds the calls a path from a probe is followed
// through when none is known to allocate.
const maxCallsPerPath = 3

// allocFuncs are gc.c's exported allocation functions (3.0-3.3): a call
// to one of them is the allocation a create probe precedes.
var allocFuncs = map[string]bool{
	"rb_wb_protected_newobj_of":    true,
	"rb_wb_unprotected_newobj_of":  true,
	"rb_ec_wb_protected_newobj_of": true,
	"rb_newobj_of":                 true,
	"rb_newobj":                    true,
}

// callNames names direct call targets in f: functions by their symbols
// (dynamic and static), PLT stubs by the relocation of the GOT slot they
// jump through.
func callNames(f *elf.File) func(uint64) string {
	byAddr := map[uint64]string{}
	for _, get := range []func() ([]elf.Symbol, error){f.DynamicSymbols, f.Symbols} {
		syms, _ := get()
		for _, s := range syms {
			if elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Value != 0 {
				if _, ok := byAddr[s.Value]; !ok {
					byAddr[s.Value] = s.Name
				}
			}
		}
	}
	got := map[uint64]string{}
	dyn, _ := f.DynamicSymbols()
	for _, sec := range f.Sections {
		if sec.Type != elf.SHT_RELA || (sec.Name != ".rela.plt" && sec.Name != ".rela.dyn") {
			continue
		}
		b, err := sec.Data()
		if err != nil {
			continue
		}
		for i := 0; i+24 <= len(b); i += 24 {
			off := f.ByteOrder.Uint64(b[i:])
			info := f.ByteOrder.Uint64(b[i+8:])
			sym, typ := info>>32, elf.R_X86_64(info&0xffffffff)
			if (typ == elf.R_X86_64_JMP_SLOT || typ == elf.R_X86_64_GLOB_DAT) && sym > 0 && int(sym) <= len(dyn) {
				got[off] = dyn[sym-1].Name
			}
		}
	}
	var plts []*elf.Section
	for _, sec := range f.Sections {
		if strings.HasPrefix(sec.Name, ".plt") {
			plts = append(plts, sec)
		}
	}
	return func(addr uint64) string {
		if n, ok := byAddr[addr]; ok {
			return n
		}
		for _, sec := range plts {
			if addr < sec.Addr || addr >= sec.Addr+sec.Size {
				continue
			}
			var stub [16]byte
			if _, err := sec.ReadAt(stub[:], int64(addr-sec.Addr)); err != nil {
				return ""
			}
			pc, b := addr, stub[:]
			for k := 0; k < 2 && len(b) > 0; k++ {
				inst, err := x86asm.Decode(b, 64)
				if err != nil {
					return ""
				}
				next := pc + uint64(inst.Len)
				if inst.Op == x86asm.JMP {
					if m, ok := inst.Args[0].(x86asm.Mem); ok && m.Base == x86asm.RIP {
						return got[uint64(int64(next)+m.Disp)]
					}
					return ""
				}
				pc, b = next, b[inst.Len:]
			}
		}
		return ""
	}
}

func isCondJump(op x86asm.Op) bool {
	switch op {
	case x86asm.JA, x86asm.JAE, x86asm.JB, x86asm.JBE, x86asm.JE, x86asm.JG, x86asm.JGE,
		x86asm.JL, x86asm.JLE, x86asm.JNE, x86asm.JNO, x86asm.JNP, x86asm.JNS, x86asm.JO,
		x86asm.JP, x86asm.JS, x86asm.JCXZ, x86asm.JECXZ, x86asm.JRCXZ:
		return true
	}
	return false
}

// retCodeWindow is how much code around a probe site is read to follow
// its paths (they jump back into the function's hot path, which the
// compiler often places before the probe's cold block).
const retCodeWindow = 256 << 10

// addReturnSites adds, for every allocation probe of a USDT plan, the
// return sites of the allocation call that follows it (KindReturn,
// Origins naming the probe sites they pair with). A probe whose code
// cannot be followed is listed in Skipped: its objects are not tracked.
func addReturnSites(p *Plan, f *elf.File) {
	byAddr := map[uint64]int{}
	name := callNames(f)
	n := len(p.Sites)
	for i := 0; i < n; i++ {
		s := p.Sites[i]
		switch s.Kind {
		case KindObject, KindArray, KindHash, KindString:
		default:
			continue
		}
		vaddr, sec, err := offsetToVaddr(f, s.Offset)
		if err != nil {
			p.RetSkipped = append(p.RetSkipped, fmt.Sprintf("%s at 0x%x: %v", s.Name, s.Offset, err))
			continue
		}
		lo := sec.Addr
		if vaddr > sec.Addr+retCodeWindow {
			lo = vaddr - retCodeWindow
		}
		hi := min(vaddr+retCodeWindow, sec.Addr+sec.Size)
		code := make([]byte, hi-lo)
		if n, err := sec.ReadAt(code, int64(lo-sec.Addr)); n < len(code) && err != nil {
			p.RetSkipped = append(p.RetSkipped, fmt.Sprintf("%s at 0x%x: read code: %v", s.Name, s.Offset, err))
			continue
		}
		rets, err := returnSites(code, lo, vaddr, name)
		if err != nil {
			p.RetSkipped = append(p.RetSkipped, fmt.Sprintf("%s at 0x%x: %v", s.Name, s.Offset, err))
			continue
		}
		for _, r := range rets {
			off := r - sec.Addr + sec.Offset
			if j, ok := byAddr[off]; ok {
				if len(p.Sites[j].Origins) < maxOrigins {
					p.Sites[j].Origins = append(p.Sites[j].Origins, i)
				}
				continue
			}
			byAddr[off] = len(p.Sites)
			p.Sites = append(p.Sites, Site{Kind: KindReturn, Name: s.Name + "/return", Offset: off, Origins: []int{i}})
		}
	}
}

// maxOrigins is how many probe sites one return site pairs with (the
// program's spec holds them in its three argument slots).
const maxOrigins = 3

// offsetToVaddr maps a file offset in an executable section to its
// virtual address.
func offsetToVaddr(f *elf.File, off uint64) (uint64, *elf.Section, error) {
	for _, s := range f.Sections {
		if s.Type != elf.SHT_PROGBITS || s.Flags&elf.SHF_EXECINSTR == 0 {
			continue
		}
		if off >= s.Offset && off < s.Offset+s.Size {
			return s.Addr + off - s.Offset, s, nil
		}
	}
	return 0, nil, fmt.Errorf("offset 0x%x is in no code section", off)
}

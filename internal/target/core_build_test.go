package target

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
)

// This file builds small ELF cores the way the kernel and gcore lay them
// out (ELF header, program headers, one PT_NOTE, PT_LOAD data), so that
// tests and fuzz seeds exercise every branch without shipping real dumps.

type tinySeg struct {
	vaddr  uint64
	filesz uint64 // bytes held in the core (pattern-filled)
	memsz  uint64
	flags  uint32
}

type tinyFile struct {
	start, end, off uint64
	path            string
}

type tinyCore struct {
	pid      int
	tids     []int
	name     string
	args     string
	rsp      uint64 // of every thread
	fsbase   uint64
	auxv     [][2]uint64
	files    []tinyFile
	segs     []tinySeg
	xnum     bool // count program headers through section header 0 (PN_XNUM)
	machine  uint16
	elfClass byte
}

// pattern is the byte every tiny core (and every file it maps) holds at
// address addr, so that any read can be checked.
func pattern(addr uint64) byte { return byte(addr>>8) ^ byte(addr)*7 ^ byte(addr>>16) }

// tinyExeHeader is the start of the tiny executable, in the core and on
// disk alike: ELF program headers with text at file offset 0x1000.
func tinyExeHeader() []byte {
	le := binary.LittleEndian
	b := make([]byte, elfHeaderSize+2*progHeaderLen)
	copy(b, "\x7fELF\x02\x01\x01")
	le.PutUint64(b[32:], elfHeaderSize)
	le.PutUint16(b[54:], progHeaderLen)
	le.PutUint16(b[56:], 2)
	for i, seg := range []struct{ off, flags uint32 }{{0, pfR}, {0x1000, pfR | pfX}} {
		p := b[elfHeaderSize+i*progHeaderLen:]
		le.PutUint32(p, ptLoad)
		le.PutUint32(p[4:], seg.flags)
		le.PutUint64(p[8:], uint64(seg.off))
		le.PutUint64(p[32:], 0x1000)
	}
	return b
}

// tinyByte is the byte at addr of the tiny process: the pattern, but for
// the executable's header.
func tinyByte(addr uint64) byte {
	if h := tinyExeHeader(); addr >= 0x400000 && addr < 0x400000+uint64(len(h)) {
		return h[addr-0x400000]
	}
	return pattern(addr)
}

// fillPattern fills b with the tiny process's bytes from addr on.
func fillPattern(b []byte, addr uint64) {
	for i := range b {
		b[i] = pattern(addr + uint64(i))
	}
	if addr == 0x400000 && len(b) >= len(tinyExeHeader()) {
		copy(b, tinyExeHeader())
	}
}

const (
	tinyExe     = "/usr/local/bin/ruby"
	tinyLib     = "/usr/lib/libfoo.so"
	tinyExecfn  = 0x7ffc00001f00
	tinyVDSO    = 0x7ffc00100000
	tinyLibBase = 0x7f0000000000
)

// defaultTinyCore is a two-thread process with an executable whose first
// page is in the core and second is not (as gcore leaves text out), a
// library whose segment holds one page of two (as the kernel does for
// file-backed pages coredump_filter excludes), adjacent anonymous
// segments, a stack and a vDSO.
func defaultTinyCore() tinyCore {
	return tinyCore{
		pid: 4242, tids: []int{4242, 4243}, name: "ruby", args: "ruby app.rb",
		rsp: 0x7ffc00001000, fsbase: 0x7f0000005000,
		auxv: [][2]uint64{{atPhdr, 0x400040}, {atEntry, 0x401000}, {atExecfn, tinyExecfn}, {atSysinfoEhdr, tinyVDSO}},
		files: []tinyFile{
			{0x400000, 0x401000, 0, tinyExe},
			{0x401000, 0x402000, 0x1000, tinyExe},
			{tinyLibBase, tinyLibBase + 0x2000, 0, tinyLib},
		},
		segs: []tinySeg{
			{0x400000, 0x1000, 0x1000, pfR},
			{tinyLibBase, 0x1000, 0x2000, pfR | pfX},
			{tinyLibBase + 0x2000, 0x1000, 0x1000, pfR | pfW},
			{tinyLibBase + 0x3000, 0x1000, 0x1000, pfR | pfW},
			{0x7ffc00000000, 0x2000, 0x2000, pfR | pfW},
			{tinyVDSO, 0x1000, 0x1000, pfR | pfX},
		},
		machine: emX86_64, elfClass: 2,
	}
}

func note(typ uint32, desc []byte) []byte {
	le := binary.LittleEndian
	b := make([]byte, 12, 12+8+len(desc)+3)
	le.PutUint32(b, 5)
	le.PutUint32(b[4:], uint32(len(desc)))
	le.PutUint32(b[8:], typ)
	b = append(b, "CORE\x00\x00\x00\x00"...)
	b = append(b, desc...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

func (tc tinyCore) notes() []byte {
	le := binary.LittleEndian
	ps := make([]byte, prpsinfoSize)
	le.PutUint32(ps[prpsinfoPid:], uint32(tc.pid))
	copy(ps[prpsinfoFname:prpsinfoArgs], tc.name)
	copy(ps[prpsinfoArgs:], tc.args+" ")
	out := note(ntPrpsinfo, ps)
	for _, tid := range tc.tids {
		st := make([]byte, prstatusSize+8)
		le.PutUint32(st[prstatusPid:], uint32(tid))
		le.PutUint64(st[prstatusRegs+16*8:], 0x401234) // rip
		le.PutUint64(st[prstatusRegs+19*8:], tc.rsp)
		le.PutUint64(st[prstatusRegs+21*8:], tc.fsbase+uint64(tid))
		out = append(out, note(ntPrstatus, st)...)
	}
	var av []byte
	for _, kv := range append(tc.auxv, [2]uint64{0, 0}) {
		av = le.AppendUint64(av, kv[0])
		av = le.AppendUint64(av, kv[1])
	}
	out = append(out, note(ntAuxv, av)...)
	fl := le.AppendUint64(nil, uint64(len(tc.files)))
	fl = le.AppendUint64(fl, 4096)
	for _, f := range tc.files {
		fl = le.AppendUint64(fl, f.start)
		fl = le.AppendUint64(fl, f.end)
		fl = le.AppendUint64(fl, f.off/4096)
	}
	for _, f := range tc.files {
		fl = append(append(fl, f.path...), 0)
	}
	return append(out, note(ntFile, fl)...)
}

// bytes lays the core out: header, program headers, notes, segment data.
func (tc tinyCore) bytes() []byte {
	le := binary.LittleEndian
	notes := tc.notes()
	nph := 1 + len(tc.segs)
	phoff := uint64(elfHeaderSize)
	noteOff := phoff + uint64(nph)*progHeaderLen
	dataOff := (noteOff + uint64(len(notes)) + 15) &^ 15
	size := dataOff
	for _, s := range tc.segs {
		size += s.filesz
	}
	shoff := size
	if tc.xnum {
		size += 64
	}
	b := make([]byte, size)
	copy(b, "\x7fELF")
	b[4], b[5], b[6] = tc.elfClass, 1, 1
	le.PutUint16(b[16:], etCore)
	le.PutUint16(b[18:], tc.machine)
	le.PutUint32(b[20:], 1)
	le.PutUint64(b[32:], phoff)
	le.PutUint16(b[52:], elfHeaderSize)
	le.PutUint16(b[54:], progHeaderLen)
	le.PutUint16(b[56:], uint16(nph))
	if tc.xnum {
		le.PutUint64(b[40:], shoff)
		le.PutUint16(b[56:], pnXNum)
		le.PutUint16(b[58:], 64)
		le.PutUint16(b[60:], 1)
		le.PutUint32(b[shoff+44:], uint32(nph))
	}
	ph := b[phoff:]
	le.PutUint32(ph, ptNote)
	le.PutUint32(ph[4:], pfR)
	le.PutUint64(ph[8:], noteOff)
	le.PutUint64(ph[32:], uint64(len(notes)))
	copy(b[noteOff:], notes)
	off := dataOff
	for i, s := range tc.segs {
		p := ph[(i+1)*progHeaderLen:]
		le.PutUint32(p, ptLoad)
		le.PutUint32(p[4:], s.flags)
		le.PutUint64(p[8:], off)
		le.PutUint64(p[16:], s.vaddr)
		le.PutUint64(p[32:], s.filesz)
		le.PutUint64(p[40:], s.memsz)
		le.PutUint64(p[48:], 1)
		fillPattern(b[off:off+s.filesz], s.vaddr)
		off += s.filesz
	}
	// AT_EXECFN's string on the stack.
	for _, s := range tc.segs {
		if tinyExecfn >= s.vaddr && tinyExecfn+32 <= s.vaddr+s.filesz {
			o := dataOff
			for _, t := range tc.segs {
				if t == s {
					break
				}
				o += t.filesz
			}
			copy(b[o+tinyExecfn-s.vaddr:], tinyExe+"\x00")
		}
	}
	return b
}

// writeTiny writes data to a file in a test directory and returns its path.
func writeTiny(t testing.TB, data []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "core")
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// tinySysroot writes the files the default tiny core maps, filled with the
// pattern of the addresses they are mapped at.
func tinySysroot(t testing.TB) string {
	t.Helper()
	root := t.TempDir()
	for _, f := range []struct {
		path string
		base uint64
	}{{tinyExe, 0x400000}, {tinyLib, tinyLibBase}} {
		b := make([]byte, 0x2000)
		fillPattern(b, f.base)
		p := filepath.Join(root, f.path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

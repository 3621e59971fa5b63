package elfx

import (
	"encoding/binary"
	"fmt"
)

// byteMem is a process image made of one byte slice mapped at base.
type byteMem struct {
	base uint64
	b    []byte
}

func (m byteMem) ReadAt(p []byte, addr uint64) error {
	if addr < m.base || addr-m.base > uint64(len(m.b)) || uint64(len(p)) > uint64(len(m.b))-(addr-m.base) {
		return fmt.Errorf("address 0x%x (%d bytes) is not mapped", addr, len(p))
	}
	copy(p, m.b[addr-m.base:])
	return nil
}

type tinySym struct {
	name  string
	value uint64
	info  byte // STT in the low nibble
	shndx uint16
}

type tinyImage struct {
	link      uint64 // link-time address of file offset 0 (0 for PIE/DSO)
	relocated bool   // d_ptr values hold run-time addresses, as ld.so leaves them
	hash      string // "gnu", "sysv" or "" (none)
	syms      []tinySym
	soname    string
}

func defaultTinyImage() tinyImage {
	return tinyImage{
		hash: "gnu", soname: "libtiny.so.1",
		syms: []tinySym{
			{"rb_undefined", 0, 0x12, 0}, // an import
			{"ruby_version", 0x2000, 0x11, 10},
			{"ruby_current_ec", 8, 0x16, 11},
			{"abs_sym", 0x1234, 0x10, 0xfff1},
			{"rb_func", 0x3000, 0x12, 9},
		},
	}
}

var tinyBuildID = []byte{0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}

func gnuHash(s string) uint32 {
	h := uint32(5381)
	for i := 0; i < len(s); i++ {
		h = h*33 + uint32(s[i])
	}
	return h
}

// Offsets of the parts in the tiny image.
const (
	tiPhdr    = 0x40
	tiNote    = 0xe8
	tiHash    = 0x110
	tiSymtab  = 0x140
	tiStrtab  = 0x1d0
	tiDynamic = 0x228
	tiSize    = 0x2b0
)

// bytes lays out an ELF image as ld.so maps it, for base (the address of
// its first byte).
func (ti tinyImage) bytes(base uint64) []byte {
	le := binary.LittleEndian
	b := make([]byte, tiSize)
	copy(b, "\x7fELF")
	b[4], b[5], b[6] = 2, 1, 1
	le.PutUint16(b[16:], 3)
	le.PutUint16(b[18:], 62)
	le.PutUint64(b[32:], tiPhdr)
	le.PutUint16(b[54:], 56)
	le.PutUint16(b[56:], 3)
	ph := func(i int, typ uint32, off, size uint64) {
		p := b[tiPhdr+i*56:]
		le.PutUint32(p, typ)
		le.PutUint32(p[4:], 4)
		le.PutUint64(p[8:], off)
		le.PutUint64(p[16:], ti.link+off)
		le.PutUint64(p[24:], ti.link+off)
		le.PutUint64(p[32:], size)
		le.PutUint64(p[40:], size)
	}
	ph(0, 1, 0, tiSize)
	ph(1, 2, tiDynamic, 16*8)
	ph(2, 4, tiNote, 16+20)

	n := b[tiNote:]
	le.PutUint32(n, 4)
	le.PutUint32(n[4:], 20)
	le.PutUint32(n[8:], 3)
	copy(n[12:], "GNU\x00")
	copy(n[16:], tinyBuildID)

	strs := []byte{0}
	addStr := func(s string) uint32 {
		off := uint32(len(strs))
		strs = append(append(strs, s...), 0)
		return off
	}
	nsyms := 1 + len(ti.syms)
	for i, s := range ti.syms {
		e := b[tiSymtab+(i+1)*24:]
		le.PutUint32(e, addStr(s.name))
		e[4] = s.info
		le.PutUint16(e[6:], s.shndx)
		le.PutUint64(e[8:], s.value)
		le.PutUint64(e[16:], 8)
	}
	soname := addStr(ti.soname)
	copy(b[tiStrtab:], strs)

	h := b[tiHash:]
	switch ti.hash {
	case "gnu":
		// One bucket, symbols from index 1, one bloom word.
		le.PutUint32(h, 1)
		le.PutUint32(h[4:], 1)
		le.PutUint32(h[8:], 1)
		le.PutUint32(h[12:], 6)
		le.PutUint64(h[16:], ^uint64(0))
		le.PutUint32(h[24:], 1)
		for i := 1; i < nsyms; i++ {
			v := gnuHash(ti.syms[i-1].name) &^ 1
			if i == nsyms-1 {
				v |= 1
			}
			le.PutUint32(h[28+(i-1)*4:], v)
		}
	case "sysv":
		le.PutUint32(h, 1)
		le.PutUint32(h[4:], uint32(nsyms))
	}

	ptr := func(off uint64) uint64 {
		if ti.relocated {
			return base + off
		}
		return ti.link + off
	}
	d := b[tiDynamic:]
	tags := [][2]uint64{{dtStrtab, ptr(tiStrtab)}, {dtSymtab, ptr(tiSymtab)}, {dtStrsz, uint64(len(strs))}, {dtSyment, 24}, {dtSoname, uint64(soname)}}
	switch ti.hash {
	case "gnu":
		tags = append(tags, [2]uint64{dtGNUHash, ptr(tiHash)})
	case "sysv":
		tags = append(tags, [2]uint64{dtHash, ptr(tiHash)})
	}
	for i, kv := range tags {
		le.PutUint64(d[i*16:], kv[0])
		le.PutUint64(d[i*16+8:], kv[1])
	}
	return b
}

package dwarfstruct

import (
	"debug/elf"
	"encoding/binary"
	"fmt"
	"sort"
)

// reloc is one relocation of a DWARF section in a relocatable object (a
// .o file): write val, size bytes little-endian, at off.
type reloc struct {
	off  uint64
	size int
	val  uint64
}

// maxRelocs bounds the relocations read for one section.
const maxRelocs = 1 << 22

// sectionRelocs returns the relocations that apply to the section called
// name in an ET_REL file, sorted by offset; nil for linked files, whose
// DWARF needs none. Only the absolute 32- and 64-bit relocations that
// compilers emit in DWARF are supported (x86_64, aarch64).
func sectionRelocs(f *elf.File, secs map[string]*elf.Section, name string, lim dwarfLimits) ([]reloc, error) {
	if f.Type != elf.ET_REL {
		return nil, nil
	}
	target := secs[name]
	if target == nil {
		return nil, nil
	}
	idx := -1
	for i, s := range f.Sections {
		if s == target {
			idx = i
		}
	}
	var rs *elf.Section
	for _, s := range f.Sections {
		if s.Type == elf.SHT_RELA && int(s.Info) == idx {
			rs = s
		}
	}
	if rs == nil {
		return nil, nil
	}
	if f.Class != elf.ELFCLASS64 {
		return nil, fmt.Errorf("relocations of %s: only 64-bit objects are supported", name)
	}
	data, err := readSection(rs, lim)
	if err != nil {
		return nil, err
	}
	if len(data)/24 > maxRelocs {
		return nil, fmt.Errorf("%s: more than %d relocations", rs.Name, maxRelocs)
	}
	syms, err := f.Symbols()
	if err != nil {
		return nil, fmt.Errorf("read symbols for %s: %w", rs.Name, err)
	}
	out := make([]reloc, 0, len(data)/24)
	for p := 0; p+24 <= len(data); p += 24 {
		off := binary.LittleEndian.Uint64(data[p:])
		info := binary.LittleEndian.Uint64(data[p+8:])
		addend := int64(binary.LittleEndian.Uint64(data[p+16:]))
		typ, sym := uint32(info), info>>32
		var symVal uint64
		if sym > 0 {
			if sym > uint64(len(syms)) {
				return nil, fmt.Errorf("%s: symbol index %d out of range", rs.Name, sym)
			}
			symVal = syms[sym-1].Value
		}
		size := 0
		switch f.Machine {
		case elf.EM_X86_64:
			switch elf.R_X86_64(typ) {
			case elf.R_X86_64_64:
				size = 8
			case elf.R_X86_64_32, elf.R_X86_64_32S:
				size = 4
			}
		case elf.EM_AARCH64:
			switch elf.R_AARCH64(typ) {
			case elf.R_AARCH64_ABS64:
				size = 8
			case elf.R_AARCH64_ABS32:
				size = 4
			}
		}
		if size == 0 {
			continue // not a DWARF offset (or an unsupported machine)
		}
		out = append(out, reloc{off: off, size: size, val: symVal + uint64(addend)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].off < out[j].off })
	return out, nil
}

// applyRelocs applies the relocations that fall in the bytes b, which hold
// the section's bytes from offset base on.
func applyRelocs(b []byte, base uint64, rels []reloc) {
	i := sort.Search(len(rels), func(i int) bool { return rels[i].off >= base })
	for ; i < len(rels); i++ {
		r := rels[i]
		if r.off-base+uint64(r.size) > uint64(len(b)) {
			break
		}
		p := b[r.off-base:]
		if r.size == 8 {
			binary.LittleEndian.PutUint64(p, r.val)
		} else {
			binary.LittleEndian.PutUint32(p, uint32(r.val))
		}
	}
}

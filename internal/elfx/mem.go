package elfx

import (
	"bytes"
	"encoding/binary"
	"fmt"
)

// MemReader reads a process image's memory (target.Target satisfies it).
type MemReader interface {
	// ReadAt fills p from address addr; a short read is an error.
	ReadAt(p []byte, addr uint64) error
}

// Limits on what ReadMemoryImage reads, so that a damaged image cannot
// make it allocate without bound.
const (
	MaxMemSymbols   = 1 << 20  // dynamic symbols
	MaxMemStrtab    = 64 << 20 // bytes of dynamic string table
	maxMemPhnum     = 4096
	maxMemDynamic   = 1 << 20 // bytes of .dynamic
	maxMemNote      = 1 << 16 // bytes of one PT_NOTE segment
	maxGNUHashWords = 1 << 24 // buckets or bloom words of .gnu.hash
)

// MemImage is an ELF image found in a process's memory: its dynamic
// symbols (from the dynamic section, not the file's section headers),
// load bias and build id.
type MemImage struct {
	Base    uint64 // where the ELF header is mapped
	Bias    uint64 // run-time address minus link-time address
	BuildID string // hex, "" when the image has no build-id note in memory
	Soname  string // DT_SONAME, "" for most executables
	// Symbols holds the defined dynamic symbols with link-time values;
	// Lookup returns run-time addresses.
	Symbols Table
	abs     map[string]bool // SHN_ABS symbols: their values need no bias
}

// Lookup returns the dynamic symbol called name with its run-time address
// (bias applied; TLS symbols and absolute symbols are left as they are).
func (m *MemImage) Lookup(name string) (Symbol, bool) {
	s, ok := m.Symbols[name]
	if !ok {
		return Symbol{}, false
	}
	if !s.TLS && !m.abs[name] {
		s.Value += m.Bias
	}
	return s, true
}

// Dynamic tags ReadMemoryImage uses.
const (
	dtNull    = 0
	dtHash    = 4
	dtStrtab  = 5
	dtSymtab  = 6
	dtStrsz   = 10
	dtSyment  = 11
	dtSoname  = 14
	dtGNUHash = 0x6ffffef5
)

// ReadMemoryImage reads the dynamic symbol table of the ELF image whose
// header is mapped at base (the mapping of file offset 0 of an executable
// or shared library) from memory, through the program headers and the
// dynamic section.
func ReadMemoryImage(r MemReader, base uint64) (*MemImage, error) {
	h, err := readMemHeaders(r, base)
	if err != nil {
		return nil, err
	}
	m := &MemImage{Base: base, Bias: h.bias, Symbols: Table{}}
	m.BuildID = h.buildID(r)
	dyn := h.dyn
	if dyn == nil {
		return nil, fmt.Errorf("ELF image at 0x%x has no dynamic section (static executable?)", base)
	}
	if err := m.readDynamic(r, dyn.vaddr, dyn.memsz); err != nil {
		return nil, err
	}
	return m, nil
}

// memProg is one program header of an image in memory.
type memProg struct{ typ, vaddr, off, memsz uint64 }

// memHeaders are the program headers of an ELF image in memory.
type memHeaders struct {
	base, bias uint64
	dyn        *memProg
	notes      []memProg
}

// readMemHeaders reads the ELF and program headers of the image whose
// header is mapped at base, and its load bias.
func readMemHeaders(r MemReader, base uint64) (*memHeaders, error) {
	le := binary.LittleEndian
	var h [64]byte
	if err := r.ReadAt(h[:], base); err != nil {
		return nil, fmt.Errorf("read ELF header at 0x%x: %w", base, err)
	}
	if string(h[:4]) != "\x7fELF" {
		return nil, fmt.Errorf("no ELF header at 0x%x", base)
	}
	if h[4] != 2 || h[5] != 1 {
		return nil, fmt.Errorf("ELF image at 0x%x is not 64-bit little-endian", base)
	}
	phoff := le.Uint64(h[32:])
	phentsize := le.Uint16(h[54:])
	phnum := int(le.Uint16(h[56:]))
	if phentsize != 56 || phnum == 0 || phnum > maxMemPhnum || phoff > 1<<32 {
		return nil, fmt.Errorf("ELF image at 0x%x: bad program header table (%d entries of %d bytes at %d)", base, phnum, phentsize, phoff)
	}
	ph := make([]byte, phnum*56)
	if err := r.ReadAt(ph, base+phoff); err != nil {
		return nil, fmt.Errorf("read program headers at 0x%x: %w", base+phoff, err)
	}
	out := &memHeaders{base: base}
	var firstLoad *memProg
	for i := 0; i < phnum; i++ {
		p := ph[i*56:]
		pr := memProg{typ: uint64(le.Uint32(p)), off: le.Uint64(p[8:]), vaddr: le.Uint64(p[16:]), memsz: le.Uint64(p[40:])}
		switch pr.typ {
		case 1: // PT_LOAD
			if firstLoad == nil {
				firstLoad = &pr
			}
		case 2: // PT_DYNAMIC
			if out.dyn == nil {
				out.dyn = &pr
			}
		case 4: // PT_NOTE
			out.notes = append(out.notes, pr)
		}
	}
	if firstLoad == nil {
		return nil, fmt.Errorf("ELF image at 0x%x has no PT_LOAD segment", base)
	}
	// The mapping at base holds file offset 0, which the first PT_LOAD
	// maps at its page-aligned vaddr minus its offset.
	link := (firstLoad.vaddr - firstLoad.off) &^ 0xfff
	if base < link {
		return nil, fmt.Errorf("ELF image at 0x%x: first segment's address 0x%x is above the image", base, link)
	}
	out.bias = base - link
	return out, nil
}

// buildID reads the image's PT_NOTE segments from memory and returns its
// GNU build id, "" when no note can be read or none holds one.
func (h *memHeaders) buildID(r MemReader) string {
	for _, n := range h.notes {
		b := make([]byte, min(n.memsz, maxMemNote))
		if err := r.ReadAt(b, h.bias+n.vaddr); err != nil {
			continue // notes are optional: the build id stays unknown
		}
		if id := BuildIDFromNotes(b); id != "" {
			return id
		}
	}
	return ""
}

// ReadMemoryBuildID returns the GNU build id of the ELF image whose header
// is mapped at base, read from the process image's memory alone (its
// program headers and notes): the identity of the binary the process
// really mapped, whatever is on disk now. It returns "" without error when
// the image has no build-id note or its notes are not in memory.
func ReadMemoryBuildID(r MemReader, base uint64) (string, error) {
	h, err := readMemHeaders(r, base)
	if err != nil {
		return "", err
	}
	return h.buildID(r), nil
}

func (m *MemImage) readDynamic(r MemReader, vaddr, size uint64) error {
	le := binary.LittleEndian
	size = min(size, maxMemDynamic) &^ 15
	d := make([]byte, size)
	if err := r.ReadAt(d, m.Bias+vaddr); err != nil {
		return fmt.Errorf("read dynamic section at 0x%x: %w", m.Bias+vaddr, err)
	}
	tags := map[uint64]uint64{}
	for i := uint64(0); i+16 <= size; i += 16 {
		tag, val := le.Uint64(d[i:]), le.Uint64(d[i+8:])
		if tag == dtNull {
			break
		}
		if _, seen := tags[tag]; !seen {
			tags[tag] = val
		}
	}
	// ld.so relocates the d_ptr entries of most objects in place; those it
	// leaves alone (and every entry of an image not yet relocated) are
	// link-time addresses.
	ptr := func(tag uint64) (uint64, bool) {
		v, ok := tags[tag]
		if !ok {
			return 0, false
		}
		if v < m.Bias {
			v += m.Bias
		}
		return v, true
	}
	symtab, ok1 := ptr(dtSymtab)
	strtab, ok2 := ptr(dtStrtab)
	strsz, ok3 := tags[dtStrsz]
	if !ok1 || !ok2 || !ok3 {
		return fmt.Errorf("dynamic section at 0x%x lacks DT_SYMTAB, DT_STRTAB or DT_STRSZ", m.Bias+vaddr)
	}
	if ent, ok := tags[dtSyment]; ok && ent != 24 {
		return fmt.Errorf("dynamic symbols of %d bytes, not 24", ent)
	}
	if strsz > MaxMemStrtab {
		return fmt.Errorf("dynamic string table of %d bytes is over the %d byte limit", strsz, MaxMemStrtab)
	}
	var nsyms uint64
	var err error
	if gh, ok := ptr(dtGNUHash); ok {
		nsyms, err = gnuHashCount(r, gh)
	} else if hh, ok := ptr(dtHash); ok {
		var b [8]byte
		if err = r.ReadAt(b[:], hh); err == nil {
			nsyms = uint64(le.Uint32(b[4:]))
		}
	} else if strtab > symtab {
		// No hash table: the string table conventionally follows the
		// symbol table.
		nsyms = (strtab - symtab) / 24
	}
	if err != nil {
		return fmt.Errorf("count dynamic symbols: %w", err)
	}
	if nsyms > MaxMemSymbols {
		return fmt.Errorf("%d dynamic symbols is over the %d limit", nsyms, MaxMemSymbols)
	}
	strs := make([]byte, strsz)
	if err := r.ReadAt(strs, strtab); err != nil {
		return fmt.Errorf("read dynamic string table at 0x%x: %w", strtab, err)
	}
	syms := make([]byte, nsyms*24)
	if err := r.ReadAt(syms, symtab); err != nil {
		return fmt.Errorf("read %d dynamic symbols at 0x%x: %w", nsyms, symtab, err)
	}
	if so, ok := tags[dtSoname]; ok && so < strsz {
		m.Soname = cstr(strs[so:])
	}
	for i := uint64(0); i < nsyms; i++ {
		s := syms[i*24:]
		nameOff := uint64(le.Uint32(s))
		info := s[4]
		shndx := le.Uint16(s[6:])
		if shndx == 0 || nameOff == 0 || nameOff >= strsz { // undefined, unnamed or damaged
			continue
		}
		name := cstr(strs[nameOff:])
		if _, dup := m.Symbols[name]; dup || name == "" {
			continue
		}
		m.Symbols[name] = Symbol{
			Name:  name,
			Value: le.Uint64(s[8:]),
			Size:  le.Uint64(s[16:]),
			TLS:   info&0xf == 6, // STT_TLS
		}
		if shndx == 0xfff1 { // SHN_ABS
			if m.abs == nil {
				m.abs = map[string]bool{}
			}
			m.abs[name] = true
		}
	}
	return nil
}

// gnuHashCount returns the number of dynamic symbols from the GNU hash
// table at addr: one past the highest symbol any bucket's chain reaches.
func gnuHashCount(r MemReader, addr uint64) (uint64, error) {
	le := binary.LittleEndian
	var h [16]byte
	if err := r.ReadAt(h[:], addr); err != nil {
		return 0, fmt.Errorf("read GNU hash header at 0x%x: %w", addr, err)
	}
	nbuckets := uint64(le.Uint32(h[0:]))
	symoffset := uint64(le.Uint32(h[4:]))
	bloomSize := uint64(le.Uint32(h[8:]))
	if nbuckets > maxGNUHashWords || bloomSize > maxGNUHashWords {
		return 0, fmt.Errorf("GNU hash table with %d buckets and %d bloom words is over the limit", nbuckets, bloomSize)
	}
	bucketsAt := addr + 16 + bloomSize*8
	buckets := make([]byte, nbuckets*4)
	if err := r.ReadAt(buckets, bucketsAt); err != nil {
		return 0, fmt.Errorf("read GNU hash buckets at 0x%x: %w", bucketsAt, err)
	}
	last := uint64(0)
	for i := uint64(0); i < nbuckets; i++ {
		last = max(last, uint64(le.Uint32(buckets[i*4:])))
	}
	if last < symoffset {
		return symoffset, nil
	}
	chainAt := bucketsAt + nbuckets*4
	var w [4 * 64]byte
	for idx := last; ; {
		if idx-symoffset >= MaxMemSymbols {
			return 0, fmt.Errorf("GNU hash chain runs past %d symbols", MaxMemSymbols)
		}
		// Read the chain in blocks; fall back to single words at the
		// end of the mapping.
		buf := w[:]
		if err := r.ReadAt(buf, chainAt+(idx-symoffset)*4); err != nil {
			buf = w[:4]
			if err := r.ReadAt(buf, chainAt+(idx-symoffset)*4); err != nil {
				return 0, fmt.Errorf("read GNU hash chain: %w", err)
			}
		}
		for k := 0; k+4 <= len(buf); k += 4 {
			if le.Uint32(buf[k:])&1 != 0 {
				return idx + 1, nil
			}
			idx++
		}
	}
}

func cstr(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		return string(b[:i])
	}
	return string(b)
}

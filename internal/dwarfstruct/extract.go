// Package dwarfstruct reads the layouts of named C structs (size,
// alignment, and each field's offset, size, type name and bit position)
// from the DWARF debug information of an ELF file.
//
// It reads as little as it can and holds little: compilation units are
// streamed one at a time and pre-scanned without allocating, only units
// that define a wanted struct are decoded (by debug/dwarf), reading stops
// when every wanted struct is found, and .debug_str is kept out of memory
// when it can be. Every size it reads from the file is capped, so corrupt
// or hostile input gives an error, never a panic or unbounded memory.
// Compressed sections (SHF_COMPRESSED zlib or zstd, legacy .zdebug),
// relocatable objects and dwz partial units are handled.
//
// What to read is the caller's business: internal/layout says which
// structs Ruby needs, finds debug files and caches what is read.
package dwarfstruct

import (
	"debug/dwarf"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"strconv"

	"github.com/rbscope/rbscope/internal/cstruct"
)

// ErrNoDWARF says that a file carries no DWARF debug information.
var ErrNoDWARF = errors.New("no DWARF debug info")

// maxNesting bounds how deep nested members are followed, and maxFields
// how many fields one struct may yield, so malformed DWARF cannot loop or
// blow up.
const (
	maxNesting = 16
	maxFields  = 20000
	maxTypeHop = 64
	// maxBadUnits is how many units may fail to parse before a file
	// is given up on.
	maxBadUnits = 8
)

// Result is what Extract read: the layouts of the wanted structs that the
// DWARF defines, and the machine they are laid out for.
type Result struct {
	// Arch names the ELF machine: "x86_64", "aarch64", "i386", or
	// debug/elf's name of another.
	Arch string
	// Structs holds the layout of each wanted struct found, by name.
	Structs map[string]cstruct.Struct
}

// Extract reads the layouts of the structs named in want from the DWARF
// of the ELF file r (plain, SHF_COMPRESSED zlib or zstd, or legacy
// .zdebug sections; relocations applied in ET_REL objects). It streams
// compilation units one at a time, decoding only those that define a
// wanted struct, and stops as soon as every wanted struct is found: memory
// stays bounded by the largest unit plus the string and abbreviation
// sections, each capped (64 MiB). Units that refer to other units (dwz
// partial units, LTO) are read with the whole .debug_info instead, capped
// at 512 MiB. Structs absent from the DWARF are absent from the result; it
// fails with ErrNoDWARF when there is no DWARF and when none of want is
// found. Malformed DWARF gives an error, never a panic.
func Extract(r io.ReaderAt, want []string) (*Result, error) {
	l, _, err := extractDWARF(r, want, defaultLimits, false)
	return l, err
}

// extractStats says how much of the DWARF a run looked at.
type extractStats struct {
	units     int   // compilation units read
	decoded   int   // units handed to debug/dwarf
	whole     bool  // .debug_info was read whole (units refer to each other)
	infoBytes int64 // bytes of .debug_info decompressed
	compact   bool  // .debug_str was never held whole
}

// extractDWARF is Extract within lim, saying how much it read; wholeStr
// loads .debug_str whole even when it could be kept out of memory (for
// tests that compare the two ways).
func extractDWARF(r io.ReaderAt, want []string, lim dwarfLimits, wholeStr bool) (l *Result, st extractStats, err error) {
	defer func() {
		// Last resort: debug/elf and debug/dwarf should return errors
		// on malformed input, but a panic must not cross this boundary.
		if p := recover(); p != nil {
			l, err = nil, fmt.Errorf("malformed DWARF: %v", p)
		}
	}()
	// extra is made here and kept out of dwarfSource so that it need not
	// leave this frame for the heap.
	extra := map[string][]byte{}
	src, err := openSource(r, lim, extra)
	if err != nil {
		return nil, st, err
	}
	f, secs := src.f, src.secs
	wantSet := map[string]bool{}
	for _, w := range want {
		wantSet[w] = true
	}
	if !wholeStr && f.Type != elf.ET_REL && secs[".debug_str"] != nil && extra[".debug_str_offsets"] == nil {
		// Keep .debug_str out of memory (see strings.go); fall
		// back to loading it whole when that cannot be done.
		if l, cst, err := extractCompact(secs, src.abbrev, extra, wantSet, lim); err == nil {
			l.Arch = archName(f.Machine)
			cst.compact = true
			return l, cst, nil
		}
	}
	str, err := loadSection(secs, ".debug_str", lim)
	if err != nil {
		return nil, st, err
	}
	infoRels, err := sectionRelocs(f, secs, ".debug_info", lim)
	if err != nil {
		return nil, st, err
	}
	if err := relocate(f, secs, ".debug_str", str, lim); err != nil {
		return nil, st, err
	}
	units, err := newUnitStream(secs[".debug_info"], lim)
	if err != nil {
		return nil, st, err
	}

	l = &Result{Arch: archName(f.Machine), Structs: map[string]cstruct.Struct{}}
	needWhole, firstErr := src.streamUnits(units, str, extra, infoRels, wantSet, l, &st)
	if needWhole && len(l.Structs) < len(wantSet) {
		st.whole = true
		info, err := loadSection(secs, ".debug_info", dwarfLimits{section: lim.whole})
		if err == nil {
			applyRelocs(info, 0, infoRels)
			err = scanWhole(info, src.abbrev, str, extra, wantSet, l)
		}
		if err != nil && firstErr == nil {
			firstErr = err
		}
	}
	if len(l.Structs) == 0 {
		if firstErr != nil {
			return nil, st, fmt.Errorf("read DWARF: %w", firstErr)
		}
		return nil, st, fmt.Errorf("%w: none of %d wanted structs defined", ErrNoDWARF, len(wantSet))
	}
	return l, st, nil
}

// dwarfSource is an ELF file's DWARF as extraction finds it: the
// sections by canonical name, and .debug_abbrev.
type dwarfSource struct {
	f      *elf.File
	secs   map[string]*elf.Section
	abbrev []byte
}

// openSource parses r's ELF headers and loads .debug_abbrev and, into
// extra, .debug_str_offsets, .debug_line_str and .debug_addr (nil when
// absent), relocated, within lim; ErrNoDWARF when r has no DWARF.
func openSource(r io.ReaderAt, lim dwarfLimits, extra map[string][]byte) (dwarfSource, error) {
	f, err := elf.NewFile(r)
	if err != nil {
		return dwarfSource{}, fmt.Errorf("parse ELF: %w", err)
	}
	secs := debugSections(f)
	if secs[".debug_info"] == nil || secs[".debug_abbrev"] == nil {
		return dwarfSource{}, ErrNoDWARF
	}
	abbrev, err := loadSection(secs, ".debug_abbrev", lim)
	if err != nil {
		return dwarfSource{}, err
	}
	for _, name := range []string{".debug_str_offsets", ".debug_line_str", ".debug_addr"} {
		b, err := loadSection(secs, name, lim)
		if err != nil {
			return dwarfSource{}, err
		}
		if err := relocate(f, secs, name, b, lim); err != nil {
			return dwarfSource{}, err
		}
		extra[name] = b
	}
	return dwarfSource{f: f, secs: secs, abbrev: abbrev}, nil
}

// streamUnits reads the units of .debug_info one at a time, relocated by
// infoRels, and adds to l the wanted structs of those the pre-scan says
// define one (decoded with .debug_str str and the sections of extra),
// until l holds every wanted struct. needWhole says that a
// unit with wanted structs refers to other units, so was left for a read
// of the whole section; firstErr is the first error met.
func (src dwarfSource) streamUnits(units *unitStream, str []byte, extra map[string][]byte, infoRels []reloc, want map[string]bool, l *Result, st *extractStats) (needWhole bool, firstErr error) {
	pre := &scanner{abbrev: src.abbrev, str: str, lineStr: extra[".debug_line_str"], strOffsets: extra[".debug_str_offsets"]}
	badUnits := 0
	for len(l.Structs) < len(want) {
		unit, uoff, err := units.next()
		if err == io.EOF {
			break
		}
		if err != nil {
			// Unit boundaries are lost: nothing after this is usable.
			if firstErr == nil {
				firstErr = err
			}
			break
		}
		applyRelocs(unit, uint64(uoff), infoRels)
		st.units++
		st.infoBytes += int64(len(unit))
		hit, cross, err := pre.unitDefinesWanted(unit, want, l.Structs)
		if err == nil && !hit {
			continue // nothing wanted here (on error, let debug/dwarf decide)
		}
		if cross {
			// Its references may point into other units: only a
			// whole-section read can follow them.
			needWhole = true
			continue
		}
		st.decoded++
		if err := scanUnit(unit, src.abbrev, str, extra, want, l); err != nil {
			if firstErr == nil {
				firstErr = err
			}
			// Real DWARF has no bad units; many mean garbage, which is
			// not worth walking to the end.
			if badUnits++; badUnits >= maxBadUnits {
				break
			}
		}
	}
	return needWhole, firstErr
}

// relocate applies an object file's relocations to a loaded section.
func relocate(f *elf.File, secs map[string]*elf.Section, name string, b []byte, lim dwarfLimits) error {
	if b == nil {
		return nil
	}
	rels, err := sectionRelocs(f, secs, name, lim)
	if err != nil {
		return err
	}
	applyRelocs(b, 0, rels)
	return nil
}

func archName(m elf.Machine) string {
	switch m {
	case elf.EM_X86_64:
		return "x86_64"
	case elf.EM_AARCH64:
		return "aarch64"
	case elf.EM_386:
		return "i386"
	}
	return m.String()
}

// scanUnit looks through one compilation unit (its bytes alone, so
// offsets are unit-relative: the unit must hold no DW_FORM_ref_addr) for
// wanted structs not yet in l and adds their layouts.
func scanUnit(unit, abbrev, str []byte, extra map[string][]byte, want map[string]bool, l *Result) error {
	d, err := newData(abbrev, unit, str, extra)
	if err != nil {
		return fmt.Errorf("parse unit: %w", err)
	}
	r := d.Reader()
	cu, err := r.Next()
	if err != nil {
		return fmt.Errorf("read unit entry: %w", err)
	}
	if cu == nil || (cu.Tag != dwarf.TagCompileUnit && cu.Tag != dwarf.TagPartialUnit) || !cu.Children {
		return nil
	}
	cands, err := candidates(r, want, l)
	if err != nil {
		return err
	}
	return extractCandidates(d, cands, l, int64(len(unit)))
}

// scanWhole walks every unit of a whole .debug_info, for files whose units
// refer to each other (dwz's partial units, LTO).
func scanWhole(info, abbrev, str []byte, extra map[string][]byte, want map[string]bool, l *Result) error {
	d, err := newData(abbrev, info, str, extra)
	if err != nil {
		return fmt.Errorf("parse .debug_info: %w", err)
	}
	r := d.Reader()
	var firstErr error
	for len(l.Structs) < len(want) {
		cu, err := r.Next()
		if err != nil {
			return fmt.Errorf("read unit entry: %w", err)
		}
		if cu == nil {
			break
		}
		if (cu.Tag != dwarf.TagCompileUnit && cu.Tag != dwarf.TagPartialUnit) || !cu.Children {
			r.SkipChildren()
			continue
		}
		cands, err := candidates(r, want, l)
		if err != nil {
			return err
		}
		if len(cands) == 0 {
			continue
		}
		// The walker seeks; come back to the next unit afterwards.
		next, _ := r.Next()
		if err := extractCandidates(d, cands, l, 0); err != nil && firstErr == nil {
			firstErr = err
		}
		if next == nil {
			break
		}
		r.Seek(next.Offset)
	}
	return firstErr
}

func newData(abbrev, info, str []byte, extra map[string][]byte) (*dwarf.Data, error) {
	d, err := dwarf.New(abbrev, nil, nil, info, nil, nil, nil, str)
	if err != nil {
		return nil, err
	}
	for name, b := range extra {
		if b != nil {
			if err := d.AddSection(name, b); err != nil {
				return nil, fmt.Errorf("add %s: %w", name, err)
			}
		}
	}
	return d, nil
}

type cand struct {
	name string
	off  dwarf.Offset
}

// candidates reads the top-level children of the unit whose entry r has
// just returned, and lists the wanted struct, union and typedef
// definitions not yet in l. It leaves r after the unit's last child.
func candidates(r *dwarf.Reader, want map[string]bool, l *Result) ([]cand, error) {
	var cands []cand
	for {
		e, err := r.Next()
		if err != nil {
			return nil, fmt.Errorf("read entry: %w", err)
		}
		if e == nil || e.Tag == 0 {
			return cands, nil
		}
		switch e.Tag {
		case dwarf.TagStructType, dwarf.TagUnionType, dwarf.TagTypedef:
			name, _ := e.Val(dwarf.AttrName).(string)
			if name != "" && want[name] {
				if _, done := l.Structs[name]; !done {
					if decl, _ := e.Val(dwarf.AttrDeclaration).(bool); !decl {
						cands = append(cands, cand{name, e.Offset})
					}
				}
			}
		}
		r.SkipChildren()
	}
}

// extractCandidates adds the layouts of cands to l. unitLen, when not 0,
// is the length of the lone unit d holds: references beyond it are errors.
func extractCandidates(d *dwarf.Data, cands []cand, l *Result, unitLen int64) error {
	if len(cands) == 0 {
		return nil
	}
	w := &unitWalker{r: d.Reader(), types: map[dwarf.Offset]*typeDesc{}, unitLen: unitLen}
	var firstErr error
	for _, c := range cands {
		if _, done := l.Structs[c.name]; done {
			continue
		}
		s, ok, err := w.structAt(c.off)
		if err != nil {
			if firstErr == nil {
				firstErr = fmt.Errorf("struct %s: %w", c.name, err)
			}
			continue
		}
		if ok {
			l.Structs[c.name] = s
		}
	}
	return firstErr
}

// typeDesc is what the walker needs to know of a type.
type typeDesc struct {
	name      string
	size      int64 // -1 when unknown
	align     int64 // 0 when unknown
	aggregate bool  // a defined struct or union, stored inline
	aggOff    dwarf.Offset
	resolving bool
}

// unitWalker resolves types and members inside one compilation unit.
type unitWalker struct {
	r       *dwarf.Reader
	types   map[dwarf.Offset]*typeDesc
	count   int
	unitLen int64
}

func (w *unitWalker) entry(off dwarf.Offset) (*dwarf.Entry, error) {
	if w.unitLen > 0 && (off < 0 || int64(off) >= w.unitLen) {
		return nil, fmt.Errorf("reference %#x outside its unit", off)
	}
	w.r.Seek(off)
	e, err := w.r.Next()
	if err != nil {
		return nil, err
	}
	if e == nil || e.Offset != off {
		return nil, fmt.Errorf("no entry at offset %#x", off)
	}
	return e, nil
}

// children returns the direct children of the entry at off.
func (w *unitWalker) children(off dwarf.Offset) ([]*dwarf.Entry, error) {
	e, err := w.entry(off)
	if err != nil {
		return nil, err
	}
	if !e.Children {
		return nil, nil
	}
	var out []*dwarf.Entry
	for {
		c, err := w.r.Next()
		if err != nil {
			return nil, err
		}
		if c == nil {
			return nil, fmt.Errorf("children of %#x: unit ends early", off)
		}
		if c.Tag == 0 {
			return out, nil
		}
		out = append(out, c)
		if len(out) > maxFields {
			return nil, fmt.Errorf("entry %#x has more than %d children", off, maxFields)
		}
		w.r.SkipChildren()
	}
}

// structAt returns the layout of the struct or union at off, following a
// typedef; ok is false when it is only declared here.
func (w *unitWalker) structAt(off dwarf.Offset) (cstruct.Struct, bool, error) {
	t, err := w.typ(off, 0)
	if err != nil {
		return cstruct.Struct{}, false, err
	}
	if !t.aggregate || t.size < 0 {
		return cstruct.Struct{}, false, nil
	}
	s := cstruct.Struct{Size: uint64(t.size), Fields: map[string]cstruct.Field{}}
	al, err := w.members(t.aggOff, "", 0, s.Fields, 0)
	if err != nil {
		return cstruct.Struct{}, false, err
	}
	s.Align = uint64(al)
	return s, true, nil
}

// members adds the members of the aggregate at off to fields, with paths
// under prefix and offsets from base; it returns the aggregate's
// alignment.
func (w *unitWalker) members(off dwarf.Offset, prefix string, base uint64, fields map[string]cstruct.Field, depth int) (int64, error) {
	if depth > maxNesting {
		return 0, fmt.Errorf("members nested deeper than %d", maxNesting)
	}
	kids, err := w.children(off)
	if err != nil {
		return 0, err
	}
	var align int64 = 1
	for _, m := range kids {
		if m.Tag != dwarf.TagMember {
			continue
		}
		name, _ := m.Val(dwarf.AttrName).(string)
		toff, ok := m.Val(dwarf.AttrType).(dwarf.Offset)
		if !ok {
			return 0, fmt.Errorf("member %q has no type", prefix+name)
		}
		t, err := w.typ(toff, 0)
		if err != nil {
			return 0, fmt.Errorf("member %q: %w", prefix+name, err)
		}
		loc, err := memberLocation(m)
		if err != nil {
			return 0, fmt.Errorf("member %q: %w", prefix+name, err)
		}
		fl := cstruct.Field{Offset: base + loc, Type: t.name}
		if t.size > 0 {
			fl.Size = uint64(t.size)
		}
		if bits, ok := m.Val(dwarf.AttrBitSize).(int64); ok && bits > 0 {
			if err := bitfield(m, &fl, base, loc, bits, t.size); err != nil {
				return 0, fmt.Errorf("member %q: %w", prefix+name, err)
			}
		}
		a := t.align
		if t.aggregate && fl.Bitfield == nil {
			path := prefix
			if name != "" {
				path = prefix + name + "."
			}
			a, err = w.members(t.aggOff, path, fl.Offset, fields, depth+1)
			if err != nil {
				return 0, err
			}
		}
		if a > align {
			align = a
		}
		if name == "" {
			continue // an anonymous member contributes only its fields
		}
		fields[prefix+name] = fl
		if w.count++; w.count > maxFields {
			return 0, fmt.Errorf("more than %d fields", maxFields)
		}
	}
	return align, nil
}

// memberLocation decodes DW_AT_data_member_location: a constant, or (DWARF
// 2) a DW_OP_plus_uconst/DW_OP_constu expression. Union members have none.
func memberLocation(m *dwarf.Entry) (uint64, error) {
	switch v := m.Val(dwarf.AttrDataMemberLoc).(type) {
	case nil:
		return 0, nil
	case int64:
		if v < 0 {
			return 0, fmt.Errorf("negative member location %d", v)
		}
		return uint64(v), nil
	case []byte:
		if len(v) > 1 && (v[0] == 0x23 || v[0] == 0x10) {
			return uleb(v[1:])
		}
		return 0, fmt.Errorf("unsupported member location expression % x", v)
	default:
		return 0, fmt.Errorf("unsupported member location %T", v)
	}
}

// bitfield fills fl for a bitfield member of bits bits, in the tables'
// convention: Offset is the byte holding the first bit, BitOffset the bit
// within it, Size the bytes that cover the field.
func bitfield(m *dwarf.Entry, fl *cstruct.Field, base, loc uint64, bits, typeSize int64) error {
	if bits > 64 {
		return fmt.Errorf("bitfield of %d bits", bits)
	}
	var dbo int64 // bit offset from the start of the containing aggregate
	if v, ok := m.Val(dwarf.AttrDataBitOffset).(int64); ok {
		dbo = v
	} else if v, ok := m.Val(dwarf.AttrBitOffset).(int64); ok {
		// DWARF 2-4: counted from the most significant bit of a
		// storage unit of DW_AT_byte_size (or the type's) bytes at the
		// member location; on a little-endian target that is:
		unit := typeSize
		if bs, ok := m.Val(dwarf.AttrByteSize).(int64); ok {
			unit = bs
		}
		if unit <= 0 || unit > 16 {
			return fmt.Errorf("bitfield storage unit of %d bytes", unit)
		}
		dbo = int64(loc)*8 + unit*8 - v - bits
	} else {
		dbo = int64(loc) * 8
	}
	if dbo < 0 {
		return fmt.Errorf("negative bit offset %d", dbo)
	}
	bo := dbo % 8
	fl.Offset = base + uint64(dbo/8)
	fl.Size = uint64((bo + bits + 7) / 8)
	fl.Bitfield = &cstruct.Bitfield{BitOffset: int(bo), BitWidth: int(bits)}
	return nil
}

// typ describes the type at off: its C name, size, alignment and, for a
// defined struct or union (possibly behind typedefs and qualifiers), where
// its members are.
func (w *unitWalker) typ(off dwarf.Offset, hops int) (td *typeDesc, err error) {
	if t, ok := w.types[off]; ok {
		if t.resolving {
			return nil, fmt.Errorf("type cycle at %#x", off)
		}
		return t, nil
	}
	if hops > maxTypeHop {
		return nil, fmt.Errorf("type chain longer than %d", maxTypeHop)
	}
	t := &typeDesc{size: -1, resolving: true}
	w.types[off] = t
	defer func() {
		t.resolving = false
		if err != nil {
			delete(w.types, off)
		}
	}()
	e, err := w.entry(off)
	if err != nil {
		return nil, err
	}
	name, _ := e.Val(dwarf.AttrName).(string)
	if bs, ok := e.Val(dwarf.AttrByteSize).(int64); ok && bs >= 0 {
		t.size = bs
	}
	switch e.Tag {
	case dwarf.TagBaseType, dwarf.TagEnumerationType:
		w.scalarType(e, t, name, hops)
	case dwarf.TagPointerType, dwarf.TagReferenceType, dwarf.TagRvalueReferenceType, dwarf.TagPtrToMemberType:
		w.pointerType(e, t, hops)
	case dwarf.TagTypedef, dwarf.TagConstType, dwarf.TagVolatileType, dwarf.TagRestrictType, dwarf.TagAtomicType:
		err = w.qualifiedType(e, t, name, hops)
	case dwarf.TagStructType, dwarf.TagUnionType, dwarf.TagClassType:
		aggregateType(e, t, name, off)
	case dwarf.TagArrayType:
		err = w.arrayType(e, t, off, hops)
	case dwarf.TagSubroutineType:
		t.name = "func"
	default:
		t.name = orAnon(name)
	}
	if err != nil {
		return nil, err
	}
	return t, nil
}

// inner describes the type that e's DW_AT_type names; nil, nil when it
// names none (void).
func (w *unitWalker) inner(e *dwarf.Entry, hops int) (*typeDesc, error) {
	toff, ok := e.Val(dwarf.AttrType).(dwarf.Offset)
	if !ok {
		return nil, nil
	}
	return w.typ(toff, hops+1)
}

// scalarType fills t for a base or enumeration type named name.
func (w *unitWalker) scalarType(e *dwarf.Entry, t *typeDesc, name string, hops int) {
	t.name = name
	if e.Tag == dwarf.TagEnumerationType {
		t.name = "enum " + orAnon(name)
		if t.size < 0 {
			if in, err := w.inner(e, hops); err == nil && in != nil {
				t.size = in.size
			}
		}
	}
	t.align = naturalAlign(t.size)
}

// pointerType fills t for a pointer (or reference) type.
func (w *unitWalker) pointerType(e *dwarf.Entry, t *typeDesc, hops int) {
	if t.size < 0 {
		t.size = int64(w.r.AddressSize())
	}
	t.align = t.size
	t.name = "void *"
	if _, ok := e.Val(dwarf.AttrType).(dwarf.Offset); ok {
		// Name the pointee without expanding it; a pointer cycle
		// (struct a { struct a *next; }) is fine: names stop at
		// structs.
		in, err := w.inner(e, hops)
		if err != nil {
			t.name = "? *"
		} else {
			t.name = in.name + " *"
		}
	}
}

// qualifiedType fills t for a typedef named name or a qualified type: the
// type it stands for, under its own name.
func (w *unitWalker) qualifiedType(e *dwarf.Entry, t *typeDesc, name string, hops int) error {
	in, err := w.inner(e, hops)
	if err != nil {
		return err
	}
	if in == nil {
		in = &typeDesc{name: "void", size: -1}
	}
	t.size, t.align, t.aggregate, t.aggOff = in.size, in.align, in.aggregate, in.aggOff
	switch e.Tag {
	case dwarf.TagTypedef:
		t.name = name
	case dwarf.TagConstType:
		t.name = "const " + in.name
	case dwarf.TagVolatileType:
		t.name = "volatile " + in.name
	case dwarf.TagAtomicType:
		t.name = "_Atomic " + in.name
	default:
		t.name = in.name
	}
	return nil
}

// aggregateType fills t for the struct, union or class named name at off;
// only a definition (not a declaration) of known size has members to
// read.
func aggregateType(e *dwarf.Entry, t *typeDesc, name string, off dwarf.Offset) {
	kw := "struct "
	if e.Tag == dwarf.TagUnionType {
		kw = "union "
	}
	if name == "" {
		t.name = "anonymous " + kw[:len(kw)-1]
	} else {
		t.name = kw + name
	}
	decl, _ := e.Val(dwarf.AttrDeclaration).(bool)
	if !decl && t.size >= 0 {
		t.aggregate, t.aggOff = true, off
		t.align = naturalAlign(t.size) // refined by members()
		if a, ok := e.Val(dwarf.AttrAlignment).(int64); ok && a > 0 {
			t.align = a
		}
	}
}

// arrayType fills t for the array type at off.
func (w *unitWalker) arrayType(e *dwarf.Entry, t *typeDesc, off dwarf.Offset, hops int) error {
	in, err := w.inner(e, hops)
	if err != nil {
		return err
	}
	if in == nil {
		return fmt.Errorf("array at %#x has no element type", off)
	}
	n, dims, err := w.arrayCount(off)
	if err != nil {
		return err
	}
	t.name = in.name + dims
	t.align = in.align
	if t.size < 0 && in.size >= 0 {
		t.size = n * in.size
	}
	return nil
}

// arrayCount multiplies the element counts of an array's subranges and
// renders them ("[3][4]"); a flexible array counts 0.
func (w *unitWalker) arrayCount(off dwarf.Offset) (int64, string, error) {
	kids, err := w.children(off)
	if err != nil {
		return 0, "", err
	}
	n, dims := int64(1), ""
	for _, k := range kids {
		if k.Tag != dwarf.TagSubrangeType {
			continue
		}
		c, known := int64(0), true
		if v, ok := k.Val(dwarf.AttrCount).(int64); ok {
			c = v
		} else if v, ok := k.Val(dwarf.AttrUpperBound).(int64); ok {
			c = v + 1
		} else {
			known = false // a flexible array member
		}
		if c < 0 || c > 1<<32 {
			return 0, "", fmt.Errorf("array bound %d", c)
		}
		n *= c
		if n > 1<<40 {
			return 0, "", fmt.Errorf("array of %d elements", n)
		}
		if known {
			dims += "[" + strconv.FormatInt(c, 10) + "]"
		} else {
			dims += "[]"
		}
	}
	if dims == "" {
		dims = "[]"
		n = 0
	}
	return n, dims, nil
}

func naturalAlign(size int64) int64 {
	switch {
	case size <= 0:
		return 1
	case size >= 16:
		return 16
	case size >= 8:
		return 8
	case size >= 4:
		return 4
	case size >= 2:
		return 2
	}
	return 1
}

func orAnon(name string) string {
	if name == "" {
		return "anonymous"
	}
	return name
}

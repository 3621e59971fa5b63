package dwarfstruct

import (
	"debug/dwarf"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/rbscope/rbscope/internal/cstruct"
)

// This file is a fast, allocation-free pre-scan of one compilation unit:
// it decodes only the tag and name of the unit's top-level DIEs and skips
// everything else by form size, to tell whether the unit defines any
// wanted struct. Only units that do are handed to debug/dwarf, whose
// Reader allocates for every entry it decodes.

var errScan = errors.New("unsupported DWARF for the pre-scan")

const (
	tagStruct  = 0x13
	tagTypedef = 0x16
	tagUnion   = 0x17

	atSibling         = 0x01
	atName            = 0x03
	atDeclaration     = 0x3c
	atStrOffsetsBase  = 0x72
	formStrx          = 0x1a
	formString        = 0x08
	formStrp          = 0x0e
	formLineStrp      = 0x1f
	formFlag          = 0x0c
	formFlagPresent   = 0x19
	formImplicitConst = 0x21
	formIndirect      = 0x16
	formRefAddr       = 0x10
	formGNURefAlt     = 0x1f20
)

type scanAttr struct {
	attr, form uint64
}

type scanAbbrev struct {
	tag      uint64
	children bool
	first, n int // attributes: scanner.attrStore[first : first+n]
}

// scanner holds what the pre-scan reuses across units.
type scanner struct {
	abbrev, str, lineStr, strOffsets []byte
	// The last table decoded (units rarely share one; keeping one
	// bounds memory).
	lastOff   uint64
	lastTable []scanAbbrev
	lastCross bool
	curCross  bool // the current unit's table uses DW_FORM_ref_addr
	attrStore []scanAttr
	// strNames, when set, stands in for str: the wanted names by their
	// .debug_str offset (see wantedStrOffsets); other strp names read
	// as nil.
	strNames map[uint64][]byte
	// collect, when set, makes the pre-scan list every wanted struct a
	// unit defines (adding them to collect) instead of stopping at the
	// first.
	collect map[string]cstruct.Struct
	// found lists, in collect mode, the unit-relative offsets of the
	// DIEs collected from the last unit scanned.
	found []cand
}

func (s *scanner) attrs(a scanAbbrev) []scanAttr { return s.attrStore[a.first : a.first+a.n] }

// parseAbbrevTable decodes the abbreviation table at off, indexed by code
// (gcc and clang number codes densely from 1).
func (s *scanner) parseAbbrevTable(off uint64) ([]scanAbbrev, error) {
	if s.lastTable != nil && s.lastOff == off {
		return s.lastTable, nil
	}
	cross := false
	if off >= uint64(len(s.abbrev)) {
		return nil, fmt.Errorf("abbrev offset %d outside .debug_abbrev", off)
	}
	b := buf{data: s.abbrev, off: int(off)}
	// Reuse the previous table's memory: only one table is kept.
	t := s.lastTable[:0]
	attrs := s.attrStore[:0]
	s.lastTable = nil
	for {
		code := b.uleb()
		if b.err != nil {
			return nil, b.err
		}
		if code == 0 {
			break
		}
		if code > 1<<14 {
			return nil, errScan
		}
		var a scanAbbrev
		a.tag = b.uleb()
		a.children = b.u8() != 0
		start := len(attrs)
		for {
			at, form := b.uleb(), b.uleb()
			if b.err != nil {
				return nil, b.err
			}
			if at == 0 && form == 0 {
				break
			}
			if form == formImplicitConst {
				b.sleb()
			}
			if form == formRefAddr || form == formIndirect || form == formGNURefAlt {
				cross = true
			}
			attrs = append(attrs, scanAttr{at, form})
		}
		a.first, a.n = start, len(attrs)-start
		for uint64(len(t)) <= code {
			t = append(t, scanAbbrev{})
		}
		t[code] = a
	}
	s.attrStore = attrs
	s.lastOff, s.lastTable, s.lastCross = off, t, cross
	return t, nil
}

// unitDefinesWanted reports whether the unit (header included) has a
// top-level struct, union or typedef DIE that is not a declaration and
// whose name is in want and not yet in done, and whether the unit may
// refer to other units (its abbreviations use DW_FORM_ref_addr). An error
// means the pre-scan could not decide.
func (s *scanner) unitDefinesWanted(unit []byte, want map[string]bool, done map[string]cstruct.Struct) (hit, cross bool, err error) {
	s.curCross = false
	s.found = s.found[:0]
	hit, err = s.scanUnit(unit, want, done)
	return hit, s.curCross, err
}

// unitHeader is what the pre-scan and the string walkers read of a unit's
// header.
type unitHeader struct {
	offSize, addrSize, version int
	abbrevOff                  uint64
	skip                       bool // a type or split unit: no structs we read
}

// parseUnitHeader reads the header of unit into h, leaving b after it.
func parseUnitHeader(b *buf) (unitHeader, error) {
	var h unitHeader
	length := uint64(b.u32())
	h.offSize = 4
	if length == 0xffffffff {
		b.u64()
		h.offSize = 8
	}
	h.version = b.u16()
	switch {
	case h.version >= 2 && h.version <= 4:
		h.abbrevOff = b.offset(h.offSize)
		h.addrSize = int(b.u8())
	case h.version == 5:
		ut := b.u8()
		h.addrSize = int(b.u8())
		h.abbrevOff = b.offset(h.offSize)
		switch ut {
		case 1, 3: // compile, partial
		default:
			h.skip = true
		}
	default:
		return h, fmt.Errorf("unit version %d", h.version)
	}
	return h, b.err
}

// scanUnit is unitDefinesWanted's walk over the unit's top-level DIEs.
func (s *scanner) scanUnit(unit []byte, want map[string]bool, done map[string]cstruct.Struct) (bool, error) {
	b := buf{data: unit}
	h, err := parseUnitHeader(&b)
	if h.skip {
		return false, nil // even when the header is cut short: nothing to read
	}
	if err != nil {
		return false, err
	}
	offSize, addrSize, version := h.offSize, h.addrSize, h.version
	table, err := s.parseAbbrevTable(h.abbrevOff)
	if err != nil {
		return false, err
	}
	s.curCross = s.lastCross
	sc := dieScan{s: s, b: &b, table: table, offSize: offSize, addrSize: addrSize, version: version}
	// The unit DIE.
	code := b.uleb()
	if code == 0 || code >= uint64(len(table)) || table[code].tag == 0 {
		return false, errScan
	}
	cu := table[code]
	var strOffBase uint64
	for _, a := range s.attrs(cu) {
		if a.attr == atStrOffsetsBase && a.form == 0x17 {
			strOffBase = b.offset(offSize)
			continue
		}
		if err := sc.skip(a.form); err != nil {
			return false, err
		}
	}
	sc.strOffBase = strOffBase
	if !cu.children {
		return false, nil
	}
	depth := 1
	hitAny := false
	for depth > 0 && b.err == nil && b.off < len(b.data) {
		dieOff := b.off
		code := b.uleb()
		if code == 0 {
			depth--
			continue
		}
		if code >= uint64(len(table)) || table[code].tag == 0 {
			return false, errScan
		}
		a := table[code]
		interesting := depth == 1 && (a.tag == tagStruct || a.tag == tagUnion || a.tag == tagTypedef)
		var name []byte
		decl := false
		sibling := -1
		for _, at := range s.attrs(a) {
			switch {
			case interesting && at.attr == atName:
				name, err = sc.name(at.form)
				if err != nil {
					return false, err
				}
			case interesting && at.attr == atDeclaration && (at.form == formFlag || at.form == formFlagPresent):
				decl = at.form == formFlagPresent || b.u8() != 0
			case depth == 1 && at.attr == atSibling && at.form >= 0x11 && at.form <= 0x14:
				// A unit-relative reference to the next sibling.
				sibling = int(sc.fixed(at.form))
			default:
				if err := sc.skip(at.form); err != nil {
					return false, err
				}
			}
		}
		if interesting && !decl && len(name) > 0 && want[string(name)] {
			if _, ok := done[string(name)]; !ok {
				if s.collect == nil {
					return true, nil
				}
				s.collect[string(name)] = cstruct.Struct{}
				s.found = append(s.found, cand{string(name), dwarf.Offset(dieOff)})
				hitAny = true
			}
		}
		if a.children {
			if sibling > b.off && sibling <= len(b.data) {
				b.off = sibling // skip the subtree
			} else {
				depth++
			}
		}
	}
	return hitAny, b.err
}

// dieScan decodes attribute values of one unit.
type dieScan struct {
	s                *scanner
	b                *buf
	table            []scanAbbrev
	offSize          int
	addrSize         int
	version          int
	strOffBase       uint64
	indirectionDepth int
}

// fixed reads a ref1/2/4/8 value.
func (d *dieScan) fixed(form uint64) uint64 {
	switch form {
	case 0x11:
		return uint64(d.b.u8())
	case 0x12:
		return uint64(d.b.u16())
	case 0x13:
		return uint64(d.b.u32())
	}
	return d.b.u64()
}

// name decodes a DW_AT_name value, without copying; forms it cannot
// resolve give nil.
func (d *dieScan) name(form uint64) ([]byte, error) {
	b := d.b
	switch form {
	case formString:
		start := b.off
		for b.off < len(b.data) && b.data[b.off] != 0 {
			b.off++
		}
		if b.off >= len(b.data) {
			return nil, errors.New("unterminated string")
		}
		b.off++
		return b.data[start : b.off-1], nil
	case formStrp:
		off := b.offset(d.offSize)
		if d.s.strNames != nil {
			return d.s.strNames[off], nil
		}
		return cstr(d.s.str, off), nil
	case formLineStrp:
		return cstr(d.s.lineStr, b.offset(d.offSize)), nil
	case formStrx, 0x25, 0x26, 0x27, 0x28:
		var idx uint64
		switch form {
		case formStrx:
			idx = b.uleb()
		case 0x25:
			idx = uint64(b.u8())
		case 0x26:
			idx = uint64(b.u16())
		case 0x27:
			idx = uint64(b.u16()) | uint64(b.u8())<<16
		case 0x28:
			idx = uint64(b.u32())
		}
		p := d.strOffBase + idx*uint64(d.offSize)
		if p+uint64(d.offSize) > uint64(len(d.s.strOffsets)) || p < d.strOffBase {
			return nil, nil
		}
		var so uint64
		if d.offSize == 8 {
			so = binary.LittleEndian.Uint64(d.s.strOffsets[p:])
		} else {
			so = uint64(binary.LittleEndian.Uint32(d.s.strOffsets[p:]))
		}
		return cstr(d.s.str, so), nil
	}
	return nil, d.skip(form)
}

func cstr(sec []byte, off uint64) []byte {
	if off >= uint64(len(sec)) {
		return nil
	}
	end := off
	for end < uint64(len(sec)) && sec[end] != 0 {
		end++
	}
	return sec[off:end]
}

// skip steps over one attribute value of the given form.
func (d *dieScan) skip(form uint64) error {
	b := d.b
	switch form {
	case 0x01: // addr
		b.advance(d.addrSize)
	case 0x03: // block2
		b.advance(int(b.u16()))
	case 0x04: // block4
		b.advance(int(b.u32()))
	case 0x05, 0x12: // data2, ref2
		b.advance(2)
	case 0x06, 0x13, 0x1c: // data4, ref4, ref_sup4
		b.advance(4)
	case 0x07, 0x14, 0x20, 0x24: // data8, ref8, ref_sig8, ref_sup8
		b.advance(8)
	case formString:
		for b.off < len(b.data) && b.data[b.off] != 0 {
			b.off++
		}
		b.advance(1)
	case 0x09, 0x18: // block, exprloc
		n := b.uleb()
		if n > uint64(len(b.data)) {
			return errors.New("block longer than the unit")
		}
		b.advance(int(n))
	case 0x0a: // block1
		b.advance(int(b.u8()))
	case 0x0b, 0x0c, 0x11, 0x25, 0x29: // data1, flag, ref1, strx1, addrx1
		b.advance(1)
	case 0x0d: // sdata
		b.sleb()
	case 0x0f, 0x15, 0x1a, 0x1b, 0x22, 0x23, 0x1f01, 0x1f02: // udata, ref_udata, strx, addrx, loclistx, rnglistx, GNU indexes
		b.uleb()
	case formStrp, 0x17, 0x1d, formLineStrp, 0x1f20, 0x1f21: // strp, sec_offset, strp_sup, line_strp, GNU alt
		b.advance(d.offSize)
	case 0x10: // ref_addr
		if d.version == 2 {
			b.advance(d.addrSize)
		} else {
			b.advance(d.offSize)
		}
	case formFlagPresent, formImplicitConst:
	case 0x1e: // data16
		b.advance(16)
	case 0x26, 0x2a: // strx2, addrx2
		b.advance(2)
	case 0x27, 0x2b: // strx3, addrx3
		b.advance(3)
	case 0x28, 0x2c: // strx4, addrx4
		b.advance(4)
	case formIndirect:
		if d.indirectionDepth > 4 {
			return errScan
		}
		d.indirectionDepth++
		err := d.skip(b.uleb())
		d.indirectionDepth--
		return err
	default:
		return fmt.Errorf("%w: form %#x", errScan, form)
	}
	return b.err
}

// buf is a little-endian cursor that records the first overrun.
type buf struct {
	data []byte
	off  int
	err  error
}

var errOverrun = errors.New("DWARF data ends early")

func (b *buf) need(n int) bool {
	if b.err != nil {
		return false
	}
	if n < 0 || b.off+n > len(b.data) || b.off+n < b.off {
		b.err = errOverrun
		return false
	}
	return true
}

func (b *buf) advance(n int) {
	if b.need(n) {
		b.off += n
	}
}

func (b *buf) u8() uint8 {
	if !b.need(1) {
		return 0
	}
	b.off++
	return b.data[b.off-1]
}

func (b *buf) u16() int {
	if !b.need(2) {
		return 0
	}
	b.off += 2
	return int(binary.LittleEndian.Uint16(b.data[b.off-2:]))
}

func (b *buf) u32() uint32 {
	if !b.need(4) {
		return 0
	}
	b.off += 4
	return binary.LittleEndian.Uint32(b.data[b.off-4:])
}

func (b *buf) u64() uint64 {
	if !b.need(8) {
		return 0
	}
	b.off += 8
	return binary.LittleEndian.Uint64(b.data[b.off-8:])
}

func (b *buf) offset(size int) uint64 {
	if size == 8 {
		return b.u64()
	}
	return uint64(b.u32())
}

func (b *buf) uleb() uint64 {
	v, _, _ := b.leb()
	return v
}

func (b *buf) sleb() int64 {
	v, shift, last := b.leb()
	if shift < 64 && last&0x40 != 0 {
		v |= ^uint64(0) << shift
	}
	return int64(v)
}

// leb reads the 7-bit groups of a LEB128 number: their value, how many
// bits they hold and the last byte (whose 0x40 bit is the sign of a
// signed one). A number cut short by the end of the data reads as 0.
func (b *buf) leb() (v uint64, shift uint, last byte) {
	for {
		if !b.need(1) {
			return 0, 0, 0
		}
		c := b.data[b.off]
		b.off++
		if shift < 64 {
			v |= uint64(c&0x7f) << shift
		}
		shift += 7
		if c&0x80 == 0 {
			return v, shift, c
		}
	}
}

package layout

import (
	"bufio"
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sort"
)

// This file keeps .debug_str out of memory. A -ggdb3 libruby's .debug_str
// is mostly macro text (3 MiB for Ruby 3.3), of which the few units that
// define the wanted structs use a small part. Instead of loading it whole:
//
//  1. one streaming pass over .debug_str finds the offsets of the wanted
//     struct names (wantedStrOffsets), which is all the pre-scan needs;
//  2. the pre-scan streams .debug_info, and for each unit that defines a
//     wanted struct collects every string offset the unit uses
//     (unitStrps);
//  3. a second streaming pass copies just those strings into a compact
//     table (compactStrings);
//  4. the hit units, kept from step 2, have their DW_FORM_strp values
//     rewritten to point into the compact table (rewriteStrps), and
//     decoded by debug/dwarf against it.
//
// Whatever this path cannot handle (string indexes, indirect forms, units
// that refer to each other) makes extractDWARF fall back to loading
// .debug_str whole.

var errNoCompact = errors.New("DWARF needs the whole .debug_str")

// maxNameHits bounds how many places in .debug_str may hold a wanted name.
const maxNameHits = 1 << 16

// wantedStrOffsets streams .debug_str and returns, for each offset at which
// a wanted name starts as a NUL-terminated string (alone, or as the tail
// of a longer string: linkers merge suffixes), that name: wherever
// "name\x00" occurs, a string reference reads name.
func wantedStrOffsets(s *elf.Section, want map[string]bool, lim dwarfLimits) (map[uint64][]byte, error) {
	r, size, err := openSection(s, lim.section)
	if err != nil {
		return nil, err
	}
	byTail := map[[2]byte][][]byte{}
	keep := 0 // bytes carried over chunk boundaries
	for w := range want {
		if len(w) < 2 {
			continue
		}
		k := [2]byte{w[len(w)-2], w[len(w)-1]}
		byTail[k] = append(byTail[k], []byte(w))
		keep = max(keep, len(w)+1)
	}
	out := map[uint64][]byte{}
	const chunk = 64 << 10
	buf := make([]byte, keep+chunk)
	have := 0      // bytes in buf
	var base int64 // stream offset of buf[0]
	for read := int64(0); read < size; {
		n, err := io.ReadFull(r, buf[have:min(int64(len(buf)), int64(have)+size-read)])
		read += int64(n)
		have += n
		if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("read .debug_str: %w", err)
		}
		// At every NUL, compare only the names ending with the two
		// bytes before it.
		for i := 0; i < have; {
			j := bytes.IndexByte(buf[i:have], 0)
			if j < 0 {
				break
			}
			e := i + j
			if e >= 2 {
				for _, p := range byTail[[2]byte{buf[e-2], buf[e-1]}] {
					if e >= len(p) && bytes.Equal(buf[e-len(p):e], p) {
						out[uint64(base)+uint64(e-len(p))] = p
						if len(out) > maxNameHits {
							// Real files hold each name a few
							// times; this one is garbage.
							return nil, errNoCompact
						}
					}
				}
			}
			i = e + 1
		}
		if n == 0 {
			break
		}
		// Keep the last `keep` bytes: a name cut by the boundary is
		// found whole next time, one found already is not (it ends
		// with its NUL before the kept tail begins).
		k := min(keep, have)
		copy(buf, buf[have-k:have])
		base += int64(have - k)
		have = k
	}
	return out, nil
}

// compactStrings streams .debug_str and copies the NUL-terminated strings
// at offsets need (sorted, unique) into one table; remap gives each old
// offset's place in it.
func compactStrings(s *elf.Section, need []uint64, lim dwarfLimits) (table []byte, remap *strRemap, err error) {
	r, size, err := openSection(s, lim.section)
	if err != nil {
		return nil, nil, err
	}
	br := bufio.NewReaderSize(r, 64<<10)
	remap = &strRemap{old: need, new: make([]uint64, len(need))}
	var (
		pos      uint64 // stream position
		lastNew  uint64 // table offset of the last string copied
		haveLast bool
		// old offsets of the last string copied and of its NUL
		lastStart, lastEnd uint64
	)
	for i, off := range need {
		if off >= uint64(size) {
			return nil, nil, fmt.Errorf("string offset %#x beyond .debug_str (%d bytes)", off, size)
		}
		if haveLast && off >= lastStart && off <= lastEnd {
			// Inside the string just copied (a merged suffix).
			remap.new[i] = lastNew + (off - lastStart)
			continue
		}
		if off < pos {
			return nil, nil, fmt.Errorf("string offsets out of order at %#x", off)
		}
		if _, err := br.Discard(int(off - pos)); err != nil {
			return nil, nil, fmt.Errorf("read .debug_str: %w", err)
		}
		pos = off
		newOff := uint64(len(table))
		for {
			chunk, err := br.ReadSlice(0)
			table = append(table, chunk...)
			pos += uint64(len(chunk))
			if errors.Is(err, bufio.ErrBufferFull) {
				continue
			}
			if err != nil {
				return nil, nil, fmt.Errorf("read .debug_str at %#x: %w", off, err)
			}
			break
		}
		remap.new[i] = newOff
		lastStart, lastEnd, lastNew, haveLast = off, pos-1, newOff, true
	}
	return table, remap, nil
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

// walkStrps calls f with the position in unit and the value of every
// DW_FORM_strp attribute of every DIE of the unit. Forms that index
// strings another way give errNoCompact.
func (s *scanner) walkStrps(unit []byte, f func(pos, size int, val uint64)) error {
	b := buf{data: unit}
	h, err := parseUnitHeader(&b)
	if err != nil {
		return err
	}
	if h.skip {
		return nil
	}
	table, err := s.parseAbbrevTable(h.abbrevOff)
	if err != nil {
		return err
	}
	sc := dieScan{s: s, b: &b, table: table, offSize: h.offSize, addrSize: h.addrSize, version: h.version}
	for b.err == nil && b.off < len(b.data) {
		code := b.uleb()
		if code == 0 {
			continue // end of a sibling chain
		}
		if code >= uint64(len(table)) || table[code].tag == 0 {
			return errScan
		}
		for _, at := range s.attrs(table[code]) {
			switch at.form {
			case formStrp:
				pos := b.off
				v := b.offset(h.offSize)
				if b.err == nil {
					f(pos, h.offSize, v)
				}
			case formStrx, 0x25, 0x26, 0x27, 0x28, formIndirect:
				return errNoCompact
			default:
				if err := sc.skip(at.form); err != nil {
					return err
				}
			}
		}
	}
	return b.err
}

// strpSet collects string offsets, sorted and unique on demand.
type strpSet struct{ offs []uint64 }

func (p *strpSet) add(v uint64) {
	p.offs = append(p.offs, v)
	if len(p.offs) >= 1<<16 && len(p.offs)&(len(p.offs)-1) == 0 {
		p.compact() // keep duplicates from piling up
	}
}

// compact sorts the offsets and drops duplicates.
func (p *strpSet) compact() []uint64 {
	sort.Slice(p.offs, func(i, j int) bool { return p.offs[i] < p.offs[j] })
	out := p.offs[:0]
	for i, v := range p.offs {
		if i == 0 || v != out[len(out)-1] {
			out = append(out, v)
		}
	}
	p.offs = out
	return out
}

// unitStrps adds the string offsets unit uses to set.
func (s *scanner) unitStrps(unit []byte, set *strpSet) error {
	return s.walkStrps(unit, func(_, _ int, v uint64) { set.add(v) })
}

// strRemap maps old .debug_str offsets (sorted) to compact-table ones.
type strRemap struct {
	old []uint64
	new []uint64
}

func (m *strRemap) lookup(v uint64) (uint64, bool) {
	i := sort.Search(len(m.old), func(i int) bool { return m.old[i] >= v })
	if i == len(m.old) || m.old[i] != v {
		return 0, false
	}
	return m.new[i], true
}

// rewriteStrps replaces every DW_FORM_strp value of unit by its offset in
// the compact table.
func (s *scanner) rewriteStrps(unit []byte, remap *strRemap) error {
	var missing error
	err := s.walkStrps(unit, func(pos, size int, v uint64) {
		n, ok := remap.lookup(v)
		if !ok {
			if missing == nil {
				missing = fmt.Errorf("string offset %#x was not collected", v)
			}
			return
		}
		if size == 8 {
			binary.LittleEndian.PutUint64(unit[pos:], n)
		} else {
			binary.LittleEndian.PutUint32(unit[pos:], uint32(n))
		}
	})
	if err != nil {
		return err
	}
	return missing
}

// extractCompact is extractDWARF without .debug_str in memory (see the top
// of this file). Any error means: use the whole-section path instead.
func extractCompact(secs map[string]*elf.Section, abbrev []byte, extra map[string][]byte, want map[string]bool, lim dwarfLimits) (*Layout, extractStats, error) {
	var st extractStats
	names, err := wantedStrOffsets(secs[".debug_str"], want, lim)
	if err != nil {
		return nil, st, err
	}
	// Pass 1: find the units that define wanted structs, and the
	// strings they use.
	claimed := map[string]Struct{}
	pre := &scanner{abbrev: abbrev, strNames: names, lineStr: extra[".debug_line_str"], collect: claimed}
	units, err := newUnitStream(secs[".debug_info"], lim)
	if err != nil {
		return nil, st, err
	}
	type hitUnit struct {
		unit  []byte
		cands []cand // the wanted DIEs, found by the pre-scan
	}
	var hits []hitUnit
	var kept int64
	var need strpSet
	for len(claimed) < len(want) {
		unit, _, err := units.next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, st, err
		}
		st.units++
		st.infoBytes += int64(len(unit))
		hit, cross, err := pre.unitDefinesWanted(unit, want, claimed)
		if err != nil {
			return nil, st, err
		}
		if !hit {
			continue
		}
		if cross {
			return nil, st, errNoCompact
		}
		if err := pre.unitStrps(unit, &need); err != nil {
			return nil, st, err
		}
		// Keep the unit (a few hundred KiB for libruby's) rather than
		// decompress .debug_info again for pass 2.
		if kept += int64(len(unit)); kept > lim.whole {
			return nil, st, errNoCompact
		}
		hits = append(hits, hitUnit{append([]byte(nil), unit...), append([]cand(nil), pre.found...)})
	}
	if len(hits) == 0 {
		return nil, st, errNoCompact // let the whole path say what is missing
	}
	offs := need.compact()
	units, names = nil, nil
	// Pass 1's buffers are garbage now; collecting them before the
	// table is built keeps the peak to one pass's worth (a one-time,
	// millisecond-long collection of a few MiB heap).
	runtime.GC()
	table, remap, err := compactStrings(secs[".debug_str"], offs, lim)
	if err != nil {
		return nil, st, err
	}
	// Pass 2: decode the hit units against the compact table.
	l := &Layout{Structs: map[string]Struct{}}
	rw := &scanner{abbrev: abbrev}
	for _, h := range hits {
		if err := rw.rewriteStrps(h.unit, remap); err != nil {
			return nil, st, err
		}
		st.decoded++
		d, err := newData(abbrev, h.unit, table, extra)
		if err != nil {
			return nil, st, fmt.Errorf("parse unit: %w", err)
		}
		if err := extractCandidates(d, h.cands, l, int64(len(h.unit))); err != nil {
			return nil, st, err
		}
	}
	for name := range claimed {
		if _, ok := l.Structs[name]; !ok {
			// Named but not defined there after all: the whole path
			// keeps looking.
			return nil, st, errNoCompact
		}
	}
	if len(l.Structs) == 0 {
		return nil, st, errNoCompact
	}
	return l, st, nil
}

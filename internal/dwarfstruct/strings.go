package dwarfstruct

import (
	"bufio"
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/rbscope/rbscope/internal/cstruct"
)

// This file keeps .debug_str out of memory. A -ggdb3 libruby's .debug_str
// is mostly macro text (3 MiB for Ruby 3.3), of which the layout uses a few
// hundred names. Instead of loading it whole:
//
//  1. one streaming pass over .debug_str finds the offsets of the wanted
//     struct names (wantedStrOffsets), which is all the pre-scan needs;
//  2. the pre-scan streams .debug_info, and each unit that defines a
//     wanted struct is decoded at once by debug/dwarf, its DW_FORM_strp
//     values rewritten to point at placeholders that carry the offset
//     (placeholderStrps), so that no unit is kept once decoded;
//  3. a second streaming pass copies just the strings the resulting
//     layout names (member and type names) into a compact table
//     (compactStrings), and they replace their placeholders.
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

// Placeholders stand for .debug_str strings while a hit unit is decoded
// (see the top of this file): the bytes phStart, the string's offset in
// .debug_str in hex, phEnd. Neither byte occurs in C names or in the text
// the walker adds around them ("struct ", " *", "[3]", ".").
const (
	phStart = 0xff
	phEnd   = 0xfe
)

// placeholderStrps rewrites every DW_FORM_strp value of unit to point into
// table (returned, grown) at a placeholder naming the value, so that
// debug/dwarf can decode the unit with no .debug_str in memory.
func (s *scanner) placeholderStrps(unit, table []byte) ([]byte, error) {
	var tooBig error
	err := s.walkStrps(unit, func(pos, size int, v uint64) {
		n := uint64(len(table))
		if size == 4 && n > math.MaxUint32 {
			tooBig = errNoCompact
			return
		}
		table = append(table, phStart)
		table = strconv.AppendUint(table, v, 16)
		table = append(table, phEnd, 0)
		if size == 8 {
			binary.LittleEndian.PutUint64(unit[pos:], n)
		} else {
			binary.LittleEndian.PutUint32(unit[pos:], uint32(n))
		}
	})
	if err == nil {
		err = tooBig
	}
	return table, err
}

// placeholders calls f with the .debug_str offset of each placeholder in
// text, and returns text with each replaced by what f returns.
func placeholders(text string, f func(off uint64) string) string {
	if strings.IndexByte(text, phStart) < 0 {
		return text
	}
	var b strings.Builder
	for {
		i := strings.IndexByte(text, phStart)
		if i < 0 {
			b.WriteString(text)
			return b.String()
		}
		j := strings.IndexByte(text[i:], phEnd)
		if j < 0 {
			b.WriteString(text)
			return b.String()
		}
		b.WriteString(text[:i])
		off, err := strconv.ParseUint(text[i+1:i+j], 16, 64)
		if err != nil {
			b.WriteString(text[i : i+j+1])
		} else {
			b.WriteString(f(off))
		}
		text = text[i+j+1:]
	}
}

// layoutStrings calls f for every string of l that may hold placeholders
// (field paths and type names) and stores what f returns in their place.
func layoutStrings(l *Result, f func(string) string) {
	for name, st := range l.Structs {
		fields := make(map[string]cstruct.Field, len(st.Fields))
		for path, fl := range st.Fields {
			fl.Type = f(fl.Type)
			fields[f(path)] = fl
		}
		st.Fields = fields
		l.Structs[name] = st
	}
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

// extractCompact is extractDWARF without .debug_str in memory (see the top
// of this file). Any error means: use the whole-section path instead.
func extractCompact(secs map[string]*elf.Section, abbrev []byte, extra map[string][]byte, want map[string]bool, lim dwarfLimits) (*Result, extractStats, error) {
	l, st, err := decodeWithPlaceholders(secs, abbrev, extra, want, lim)
	if err != nil {
		return nil, st, err
	}
	// The stream's unit buffer, the wanted names and the placeholders
	// were decodeWithPlaceholders' own: a collection during the read
	// below may take them.
	if err := resolvePlaceholders(l, secs[".debug_str"], lim); err != nil {
		return nil, st, err
	}
	return l, st, nil
}

// decodeWithPlaceholders makes one pass over .debug_info: it finds the
// units that define wanted structs and decodes each at once, its strings
// standing in as placeholders. It fails unless every struct it found
// named in a unit was also defined there.
func decodeWithPlaceholders(secs map[string]*elf.Section, abbrev []byte, extra map[string][]byte, want map[string]bool, lim dwarfLimits) (*Result, extractStats, error) {
	var st extractStats
	names, err := wantedStrOffsets(secs[".debug_str"], want, lim)
	if err != nil {
		return nil, st, err
	}
	claimed := map[string]cstruct.Struct{}
	pre := &scanner{abbrev: abbrev, strNames: names, lineStr: extra[".debug_line_str"], collect: claimed}
	units, err := newUnitStream(secs[".debug_info"], lim)
	if err != nil {
		return nil, st, err
	}
	l := &Result{Structs: map[string]cstruct.Struct{}}
	var table []byte // placeholders of the unit being decoded
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
		if table, err = pre.placeholderStrps(unit, table[:0]); err != nil {
			return nil, st, err
		}
		st.decoded++
		d, err := newData(abbrev, unit, table, extra)
		if err != nil {
			return nil, st, fmt.Errorf("parse unit: %w", err)
		}
		if err := extractCandidates(d, pre.found, l, int64(len(unit))); err != nil {
			return nil, st, err
		}
	}
	if st.decoded == 0 {
		return nil, st, errNoCompact // let the whole path say what is missing
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

// resolvePlaceholders reads from .debug_str (section s) the few strings
// the layouts of l use (member and type names) and puts them in place of
// their placeholders.
func resolvePlaceholders(l *Result, s *elf.Section, lim dwarfLimits) error {
	var need []uint64
	layoutStrings(l, func(text string) string {
		placeholders(text, func(off uint64) string {
			need = append(need, off)
			return ""
		})
		return text
	})
	sort.Slice(need, func(i, j int) bool { return need[i] < need[j] })
	need = slices.Compact(need)
	strs, remap, err := compactStrings(s, need, lim)
	if err != nil {
		return err
	}
	layoutStrings(l, func(text string) string {
		return placeholders(text, func(off uint64) string {
			n, ok := remap.lookup(off)
			if !ok {
				err = fmt.Errorf("string offset %#x was not collected", off)
				return ""
			}
			end := bytes.IndexByte(strs[n:], 0)
			if end < 0 {
				err = fmt.Errorf("string at %#x has no end", off)
				return ""
			}
			return string(strs[n : n+uint64(end)])
		})
	})
	return err
}

// Package layout holds Ruby VM struct layouts: for each struct, its size and
// the byte offset, size and (for bitfields) bit position of each field.
//
// A Layout comes either from DWARF debug information (see FromDWARF) or from
// the built-in per-version tables embedded in this package (see Builtin). Both
// use the schema of ../shared/ruby-layouts: struct names are C tags
// ("rb_thread_struct"), field names use dots for nesting ("as.heap.ptr").
package layout

import (
	"encoding/binary"
	"fmt"
	"sort"
)

// Bitfield locates a bitfield inside the bytes [Offset, Offset+Size) of its
// field: load Size bytes little-endian, shift right by BitOffset, keep
// BitWidth bits.
type Bitfield struct {
	BitOffset int `json:"bit_offset"`
	BitWidth  int `json:"bit_width"`
}

// Field is one (possibly nested) member of a struct.
type Field struct {
	Offset   uint64    `json:"offset"`
	Size     uint64    `json:"size"`
	Type     string    `json:"type,omitempty"`
	Bitfield *Bitfield `json:"bitfield,omitempty"`
	// Source says where this field's offset came from when it differs from
	// the layout's Source (a DWARF layout completed from a table).
	Source string `json:"source,omitempty"`
}

// Struct is the layout of one C struct.
type Struct struct {
	Size   uint64           `json:"size"`
	Align  uint64           `json:"align,omitempty"`
	Fields map[string]Field `json:"fields"`
}

// Layout is the set of struct layouts of one Ruby build.
type Layout struct {
	RubyVersion string            `json:"ruby_version"`
	Arch        string            `json:"arch"`
	Source      string            `json:"source"`
	Structs     map[string]Struct `json:"structs"`
}

// Has reports whether the layout knows struct s, and field f of it when f is
// not empty.
func (l *Layout) Has(s, f string) bool {
	st, ok := l.Structs[s]
	if !ok {
		return false
	}
	if f == "" {
		return true
	}
	_, ok = st.Fields[f]
	return ok
}

// Field returns field f of struct s.
func (l *Layout) Field(s, f string) (Field, error) {
	st, ok := l.Structs[s]
	if !ok {
		return Field{}, fmt.Errorf("layout %s: no struct %s", l.Source, s)
	}
	fl, ok := st.Fields[f]
	if !ok {
		return Field{}, fmt.Errorf("layout %s: struct %s has no field %s", l.Source, s, f)
	}
	return fl, nil
}

// Offset returns the offset of field f in struct s.
func (l *Layout) Offset(s, f string) (uint64, error) {
	fl, err := l.Field(s, f)
	return fl.Offset, err
}

// Size returns the size of struct s.
func (l *Layout) Size(s string) (uint64, error) {
	st, ok := l.Structs[s]
	if !ok {
		return 0, fmt.Errorf("layout %s: no struct %s", l.Source, s)
	}
	return st.Size, nil
}

// StructNames returns the struct names in sorted order.
func (l *Layout) StructNames() []string {
	names := make([]string, 0, len(l.Structs))
	for n := range l.Structs {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Decode reads field fl from buf, a copy of the struct's bytes. Fields of 1,
// 2, 4 or 8 bytes are read little-endian; bitfields are extracted. It fails
// when buf is too short or the field has another size.
func (fl Field) Decode(buf []byte) (uint64, error) {
	end := fl.Offset + fl.Size
	if end > uint64(len(buf)) || end < fl.Offset {
		return 0, fmt.Errorf("field at %d+%d outside %d-byte buffer", fl.Offset, fl.Size, len(buf))
	}
	b := buf[fl.Offset:end]
	var v uint64
	switch fl.Size {
	case 1:
		v = uint64(b[0])
	case 2:
		v = uint64(binary.LittleEndian.Uint16(b))
	case 4:
		v = uint64(binary.LittleEndian.Uint32(b))
	case 8:
		v = binary.LittleEndian.Uint64(b)
	default:
		if fl.Bitfield == nil || fl.Size > 8 {
			return 0, fmt.Errorf("cannot decode a %d-byte field as an integer", fl.Size)
		}
		var tmp [8]byte
		copy(tmp[:], b)
		v = binary.LittleEndian.Uint64(tmp[:])
	}
	if bf := fl.Bitfield; bf != nil {
		v >>= uint(bf.BitOffset)
		if bf.BitWidth < 64 {
			v &= (uint64(1) << uint(bf.BitWidth)) - 1
		}
	}
	return v, nil
}

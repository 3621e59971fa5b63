// Package layout holds Ruby VM struct layouts: for each struct, its size and
// the byte offset, size and (for bitfields) bit position of each field.
//
// A Layout comes either from DWARF debug information (see FromDWARF; package
// dwarfstruct reads it) or from the built-in per-version tables embedded in
// this package (see Builtin). Both use the schema of ../shared/ruby-layouts:
// struct names are C tags ("rb_thread_struct"), field names use dots for
// nesting ("as.heap.ptr"). This package decides what to read: which structs
// a Ruby version needs, where its debug files are, what is cached.
package layout

import (
	"fmt"
	"sort"

	"github.com/rbscope/rbscope/internal/cstruct"
)

// Bitfield, Field and Struct are the C struct layouts of package
// cstruct, which the DWARF reader shares: see there.
type (
	// Bitfield locates a bitfield inside its field's bytes.
	Bitfield = cstruct.Bitfield
	// Field is one (possibly nested) member of a struct.
	Field = cstruct.Field
	// Struct is the layout of one C struct.
	Struct = cstruct.Struct
)

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

package layout

import (
	"fmt"
	"io"
	"os"
	"sort"

	"github.com/rbscope/rbscope/internal/dwarfstruct"
)

// WantedStructs lists the structs rbscope extracts from DWARF: every
// struct named in the built-in tables plus the ones the walker may need
// beyond them. Names are C tags, or the typedef name of a typedef'd
// anonymous struct (rb_symbols_t).
var WantedStructs = []string{
	// In the built-in tables.
	"RArray", "RBasic", "RClass", "RClass_and_rb_classext_t", "RString",
	"iseq_insn_info_entry", "iseq_line_info_entry",
	"rb_callable_method_entry_struct", "rb_classext_struct",
	"rb_control_frame_struct", "rb_execution_context_struct",
	"rb_iseq_constant_body", "rb_iseq_location_struct", "rb_iseq_struct",
	"rb_method_cfunc_struct", "rb_method_definition_struct",
	"rb_method_entry_struct", "rb_native_thread", "rb_ractor_struct",
	"rb_thread_struct", "rb_vm_struct",
	// Beyond them.
	"rb_symbols_t", "st_table", "st_table_entry", "rb_id_table",
	"succ_index_table", "succ_dict_block",
	// GC state (gc.c; gc/default.c from 3.4), and its heap pages
	// (rbscope heap).
	"rb_objspace", "heap_page",
}

// NeededStructs lists the structs a DWARF extraction for Ruby version v
// must find before it can stop reading: those of the built-in table
// nearest to v (what the walker reads, and what that Ruby series is known
// to define), plus rb_classext_struct, whose class path the walker reads
// from Ruby 2.0 on although some tables omit it, and rb_objspace (the GC
// flags). Structs a version does
// not define are left out, so that extraction stops at the unit that
// completes the set instead of reading every unit of the file looking for
// them. For a version without a table it returns WantedStructs.
func NeededStructs(v string) []string {
	tab, err := Builtin(v)
	if err != nil {
		return WantedStructs
	}
	names := tab.StructNames()
	if p := parseVersion(v); len(p) >= 2 && p[0] >= 2 && !tab.Has("rb_classext_struct", "") {
		names = append(names, "rb_classext_struct")
	}
	// The GC state (rb_objspace, in gc.c, which links before vm.c in
	// Ruby's builds: asking for it rarely lengthens the walk) is in no
	// table.
	// heap_page (the object heap's pages, for rbscope heap; 2.1+) is
	// defined in the same unit.
	names = append(names, "rb_objspace")
	if p := parseVersion(v); len(p) >= 2 && (p[0] > 2 || p[0] == 2 && p[1] >= 1) {
		names = append(names, "heap_page")
	}
	sort.Strings(names)
	return names
}

// ErrNoDWARF says that a file carries no DWARF debug information (or
// none of the structs sought).
var ErrNoDWARF = dwarfstruct.ErrNoDWARF

// FromDWARFFile extracts the layouts of the structs named in want from the
// DWARF in the ELF file at path (the file itself, not a separate debug
// file: see FindDebugFile). Source is "dwarf:<path>".
func FromDWARFFile(path string, want []string) (*Layout, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	defer f.Close()
	l, err := FromDWARF(f, want)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	l.Source = "dwarf:" + path
	return l, nil
}

// FromDWARF extracts the layouts of the structs named in want from the
// DWARF of the ELF file r, as dwarfstruct.Extract reads them (streamed,
// stopping once all are found, within caps); Source and RubyVersion are
// left for the caller. Structs absent from the DWARF are absent from the
// layout; it fails with ErrNoDWARF when there is no DWARF and when none of
// want is found.
func FromDWARF(r io.ReaderAt, want []string) (*Layout, error) {
	res, err := dwarfstruct.Extract(r, want)
	if err != nil {
		return nil, err
	}
	return &Layout{Arch: res.Arch, Structs: res.Structs}, nil
}

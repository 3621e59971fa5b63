package dwarfstruct

import "io"

// What the external tests (package dwarfstruct_test, which may import
// internal/layout for its lists of structs) need of the internals.

// Limits bounds what a test's extraction may read.
type Limits = dwarfLimits

// DefaultLimits are Extract's; SmallLimits keep fuzzing and the memory
// tests cheap.
var (
	DefaultLimits = defaultLimits
	SmallLimits   = dwarfLimits{section: 1 << 20, unit: 1 << 20, info: 8 << 20, whole: 4 << 20}
)

// Stats says how much of the DWARF a run looked at.
type Stats struct {
	Units, Decoded int  // units read; units handed to debug/dwarf
	Whole          bool // .debug_info was read whole
	Compact        bool // .debug_str was never held whole
}

// ExtractWith is Extract within lim, loading .debug_str whole when
// wholeStr, and saying how much it read.
func ExtractWith(r io.ReaderAt, want []string, lim Limits, wholeStr bool) (*Result, Stats, error) {
	res, st, err := extractDWARF(r, want, lim, wholeStr)
	return res, Stats{Units: st.units, Decoded: st.decoded, Whole: st.whole, Compact: st.compact}, err
}

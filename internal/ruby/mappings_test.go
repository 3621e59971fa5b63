package ruby

import (
	"testing"

	"github.com/rbscope/rbscope/internal/target"
)

// TestFirstMappingSkipsCrashReporterCopy uses the libruby mappings of a
// real kernel core of a Ruby process that crashed through rb_bug: the
// crash reporter maps the whole file again, read-only, below the loader's
// mapping, and the load address must come from the loader's.
func TestFirstMappingSkipsCrashReporterCopy(t *testing.T) {
	const lib = "/usr/lib/x86_64-linux-gnu/libruby-3.1.so.3.1.2"
	ms := []target.Mapping{
		{Start: 0x7f5b0bc00000, End: 0x7f5b0bfb0000, Offset: 0, Path: lib}, // the crash reporter's
		{Start: 0x7f5b0c000000, End: 0x7f5b0c021000},
		{Start: 0x7f5b14000000, End: 0x7f5b14033000, Offset: 0, Path: lib},
		{Start: 0x7f5b14033000, End: 0x7f5b1428c000, Offset: 0x33000, Path: lib},
		{Start: 0x7f5b1428c000, End: 0x7f5b143a4000, Offset: 0x28c000, Path: lib},
		{Start: 0x7f5b20000000, End: 0x7f5b20001000, Offset: 0, Path: "/lone.so"},
	}
	if start, off, ok := firstMapping(ms, lib); !ok || start != 0x7f5b14000000 || off != 0 {
		t.Errorf("libruby at 0x%x+%d (%v), want the loader's mapping at 0x7f5b14000000", start, off, ok)
	}
	if start, _, ok := firstMapping(ms, "/lone.so"); !ok || start != 0x7f5b20000000 {
		t.Errorf("a lone mapping: 0x%x %v", start, ok)
	}
	if _, _, ok := firstMapping(ms, "/absent.so"); ok {
		t.Error("found a file that is not mapped")
	}
}

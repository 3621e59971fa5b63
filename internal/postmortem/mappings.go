package postmortem

import (
	"github.com/rbscope/rbscope/internal/target"
)

// WithoutStrayMappings returns t with the stray whole-file mappings of a
// crashed Ruby process hidden from Mappings.
//
// Ruby's crash report (rb_bug, which every SIGSEGV and SIGBUS of a Ruby
// process goes through before it aborts) symbolizes its C backtrace by
// mmapping each binary whole, read-only and shared, at an address below
// where the binary is loaded. Code that takes the lowest mapping of
// libruby at file offset 0 as its load address then computes every symbol
// address wrongly ("ruby_current_vm_ptr is not mapped"). A mapping at file
// offset 0 is stray when no mapping of the same file follows it directly
// while another offset-0 mapping of that file does (a loaded image is
// several adjacent mappings: headers, text, data).
//
// The Target returned implements target.CoreInfo when t does.
func WithoutStrayMappings(t target.Target) target.Target {
	if ci, ok := t.(target.CoreInfo); ok {
		return coreLoaded{loadedOnly{t}, ci}
	}
	return loadedOnly{t}
}

type loadedOnly struct{ target.Target }

type coreLoaded struct {
	loadedOnly
	target.CoreInfo
}

// Mappings implements target.Target.
func (l loadedOnly) Mappings() ([]target.Mapping, error) {
	ms, err := l.Target.Mappings()
	if err != nil {
		return ms, err
	}
	return dropStray(ms), nil
}

// dropStray removes the stray whole-file mappings of ms (see
// WithoutStrayMappings).
func dropStray(ms []target.Mapping) []target.Mapping {
	// The starts of each file's mappings, to test adjacency.
	starts := map[string]map[uint64]bool{}
	for _, m := range ms {
		if m.Path == "" || m.Path[0] == '[' {
			continue
		}
		if starts[m.Path] == nil {
			starts[m.Path] = map[uint64]bool{}
		}
		starts[m.Path][m.Start] = true
	}
	loadedHead := map[string]bool{} // the file has an offset-0 mapping with a successor
	for _, m := range ms {
		if m.Offset == 0 && starts[m.Path][m.End] {
			loadedHead[m.Path] = true
		}
	}
	out := ms[:0:0]
	for _, m := range ms {
		if m.Offset == 0 && loadedHead[m.Path] && !starts[m.Path][m.End] {
			continue
		}
		out = append(out, m)
	}
	return out
}

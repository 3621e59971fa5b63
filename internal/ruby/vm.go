package ruby

import "fmt"

// VMAddress returns the address of the process's rb_vm_t, for readers of
// VM state the walker does not interpret itself (rbscope alloc reads the
// object space's allocation counter through it).
func (p *Process) VMAddress() (uint64, error) { return p.w.currentVM() }

// Objspace returns the address of the process's rb_objspace (the GC's
// state: heap pages, size pools) and where it came from (Info.GCSource),
// for readers of the object heap (rbscope heap). It fails, saying why,
// when neither DWARF nor the shape search of 3.0-3.3 located it.
func (p *Process) Objspace() (uint64, string, error) {
	if p.act.objspace == 0 {
		return 0, p.act.gcSource, fmt.Errorf("rb_objspace not located (%s)", p.act.gcSource)
	}
	return p.act.objspace, p.act.gcSource, nil
}

// VersionNumber is the Ruby version as major*10000+minor*100+patch
// (30102 for 3.1.2), for callers that compare versions.
func (p *Process) VersionNumber() int { return p.rt.ver }

// Symbol returns the run-time address of a symbol of the Ruby binaries
// (from a hint, .symtab or .dynsym), for readers of VM globals the walker
// does not read itself (rbscope heap reads rb_shape_tree_ptr).
func (p *Process) Symbol(name string) (uint64, bool) { return p.symbol(name) }

// DataRegions returns the address ranges [start, end) of the Ruby
// binaries' writable data (their writable mappings and the .bss right
// after each), where the VM's globals live, for readers that search them
// (rbscope heap finds rb_shape_tree_ptr there in stripped builds).
func (p *Process) DataRegions() ([][2]uint64, error) {
	maps, err := p.t.Mappings()
	if err != nil {
		return nil, fmt.Errorf("list mappings: %w", err)
	}
	var out [][2]uint64
	for _, r := range dataRegions(maps, p.info.Binaries) {
		out = append(out, [2]uint64{r.Start, r.End})
	}
	return out, nil
}

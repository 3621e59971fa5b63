package ruby

// VMAddress returns the address of the process's rb_vm_t, for readers of
// VM state the walker does not interpret itself (rbscope alloc reads the
// object space's allocation counter through it).
func (p *Process) VMAddress() (uint64, error) { return p.currentVM() }

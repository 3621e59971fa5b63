package target

import (
	"encoding/binary"
	"testing"
)

// TestRegisterOffsets: the offsets are those of the kernel's x86_64
// struct pt_regs (arch/x86/include/uapi/asm/ptrace.h), which uprobe BPF
// programs read, for every register a USDT argument can name.
func TestRegisterOffsets(t *testing.T) {
	ptRegs := []string{"r15", "r14", "r13", "r12", "rbp", "rbx", "r11", "r10", "r9", "r8",
		"rax", "rcx", "rdx", "rsi", "rdi", "orig_rax", "rip", "cs", "eflags", "rsp", "ss"}
	for i, r := range ptRegs {
		if off, ok := RegisterOffset(r); !ok || off != 8*i {
			t.Errorf("RegisterOffset(%q) = %d, %v; want %d", r, off, ok, 8*i)
		}
	}
	if _, ok := RegisterOffset("xmm0"); ok {
		t.Error("xmm0 has an offset")
	}
	b := make([]byte, 27*8)
	for i := 0; i < 27; i++ {
		binary.LittleEndian.PutUint64(b[8*i:], uint64(i+1))
	}
	r, ok := DecodeRegisters(b)
	if !ok || r.R15 != 1 || r.Rip != 17 || r.Rsp != 20 || r.Fs_base != 22 || r.Gs != 27 {
		t.Errorf("DecodeRegisters = %+v, %v", r, ok)
	}
	if _, ok := DecodeRegisters(b[:100]); ok {
		t.Error("DecodeRegisters accepted 100 bytes")
	}
}

package target

import (
	"encoding/binary"
	"reflect"
	"strings"

	"golang.org/x/sys/unix"
)

// Registers are a thread's general registers: x86_64 user_regs_struct,
// the layout of PTRACE_GETREGS and of a core's NT_PRSTATUS pr_reg. Its
// first 21 registers (R15 to Ss) are also laid out as the kernel's struct
// pt_regs, which uprobe BPF programs read. Fs_base is the thread pointer,
// the base of the thread's static TLS block.
type Registers = unix.PtraceRegs

// registerOffsets maps each register's lower-case name ("rax", "rip",
// "fs_base") to its byte offset in Registers.
var registerOffsets = func() map[string]int {
	m := map[string]int{}
	t := reflect.TypeOf(Registers{})
	for i := 0; i < t.NumField(); i++ {
		m[strings.ToLower(t.Field(i).Name)] = int(t.Field(i).Offset)
	}
	return m
}()

// RegisterOffset returns the byte offset of the 64-bit register name
// ("rax", "r13", "rsp") in Registers, and so in struct pt_regs.
func RegisterOffset(name string) (int, bool) {
	off, ok := registerOffsets[name]
	return off, ok
}

// DecodeRegisters decodes a little-endian user_regs_struct.
func DecodeRegisters(b []byte) (Registers, bool) {
	var r Registers
	_, err := binary.Decode(b, binary.LittleEndian, &r)
	return r, err == nil
}

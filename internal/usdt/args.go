package usdt

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/rbscope/rbscope/internal/target"
)

// ArgKind says how an argument's value is obtained.
type ArgKind uint8

// Argument kinds. The numeric values are shared with the eBPF program.
const (
	ArgNone  ArgKind = 0 // no argument
	ArgConst ArgKind = 1 // $imm: the value is Disp
	ArgReg   ArgKind = 2 // %reg: the value is the register
	ArgMem   ArgKind = 3 // disp(%reg): the value is in memory at reg+Disp
)

func (k ArgKind) String() string {
	switch k {
	case ArgNone:
		return "none"
	case ArgConst:
		return "const"
	case ArgReg:
		return "reg"
	case ArgMem:
		return "mem"
	}
	return fmt.Sprintf("ArgKind(%d)", uint8(k))
}

// Arg is one decoded probe argument.
type Arg struct {
	Kind ArgKind
	// Size is the argument's size in bytes (1, 2, 4 or 8).
	Size int
	// Signed is set for "-N@..." arguments: the value is sign-extended.
	Signed bool
	// Reg is the canonical 64-bit register name ("rax"); "" for constants.
	Reg string
	// RegOffset is the register's byte offset in x86_64 struct pt_regs.
	RegOffset int
	// Disp is the memory displacement (ArgMem) or the constant (ArgConst).
	Disp int64
}

// regName is a 64-bit register and the width of the name that denotes it.
type regName struct {
	reg   string
	width int
}

// regAlias maps every x86_64 register name USDT arguments use (64, 32,
// 16 and low 8-bit forms) to its 64-bit register and width.
var regAlias = func() map[string]regName {
	m := map[string]regName{}
	add := func(r64, r32, r16, r8 string) {
		m[r64] = regName{r64, 8}
		m[r32] = regName{r64, 4}
		m[r16] = regName{r64, 2}
		m[r8] = regName{r64, 1}
	}
	add("rax", "eax", "ax", "al")
	add("rbx", "ebx", "bx", "bl")
	add("rcx", "ecx", "cx", "cl")
	add("rdx", "edx", "dx", "dl")
	add("rsi", "esi", "si", "sil")
	add("rdi", "edi", "di", "dil")
	add("rbp", "ebp", "bp", "bpl")
	add("rsp", "esp", "sp", "spl")
	for i := 8; i <= 15; i++ {
		r := fmt.Sprintf("r%d", i)
		add(r, r+"d", r+"w", r+"b")
	}
	m["rip"] = regName{"rip", 8}
	return m
}()

// ParseArgs decodes a probe's space-separated argument specification.
func ParseArgs(spec string) ([]Arg, error) {
	fields := strings.Fields(spec)
	if len(fields) == 0 {
		return nil, nil
	}
	if len(fields) > 12 {
		return nil, fmt.Errorf("%d arguments (at most 12)", len(fields))
	}
	out := make([]Arg, 0, len(fields))
	for i, f := range fields {
		a, err := ParseArg(f)
		if err != nil {
			return nil, fmt.Errorf("argument %d %q: %w", i+1, f, err)
		}
		out = append(out, a)
	}
	return out, nil
}

// ParseArg decodes one argument: "[-]N@OPERAND" where OPERAND is $imm,
// %reg, disp(%reg) or (%reg). Without the "N@" prefix the size is the
// register's width (8 for constants and memory).
func ParseArg(s string) (Arg, error) {
	var a Arg
	op := s
	if at := strings.IndexByte(s, '@'); at >= 0 {
		sz := s[:at]
		op = s[at+1:]
		if strings.HasPrefix(sz, "-") {
			a.Signed = true
			sz = sz[1:]
		}
		n, err := strconv.Atoi(sz)
		if err != nil {
			return a, fmt.Errorf("bad size %q", s[:at])
		}
		switch n {
		case 1, 2, 4, 8:
			a.Size = n
		default:
			return a, fmt.Errorf("unsupported size %d", n)
		}
	}
	switch {
	case op == "":
		return a, fmt.Errorf("empty operand")
	case op[0] == '$':
		v, err := strconv.ParseInt(op[1:], 0, 64)
		if err != nil {
			return a, fmt.Errorf("bad constant %q", op)
		}
		a.Kind, a.Disp = ArgConst, v
		if a.Size == 0 {
			a.Size = 8
		}
	case op[0] == '%':
		reg, width, err := register(op[1:])
		if err != nil {
			return a, err
		}
		if reg == "rip" {
			return a, fmt.Errorf("%%rip as a value is not supported")
		}
		a.Kind, a.Reg, a.RegOffset = ArgReg, reg, regOffset(reg)
		if a.Size == 0 {
			a.Size = width
		}
	default:
		open := strings.IndexByte(op, '(')
		if open < 0 || !strings.HasSuffix(op, ")") {
			return a, fmt.Errorf("unsupported operand %q", op)
		}
		inner := op[open+1 : len(op)-1]
		if strings.ContainsRune(inner, ',') {
			return a, fmt.Errorf("indexed addressing %q is not supported", op)
		}
		if !strings.HasPrefix(inner, "%") {
			return a, fmt.Errorf("bad base register in %q", op)
		}
		reg, _, err := register(inner[1:])
		if err != nil {
			return a, err
		}
		if reg == "rip" {
			// The displacement is relative to the next instruction, which
			// the probe note does not describe.
			return a, fmt.Errorf("%%rip-relative operand %q is not supported", op)
		}
		var disp int64
		if d := op[:open]; d != "" {
			disp, err = strconv.ParseInt(d, 0, 64)
			if err != nil {
				return a, fmt.Errorf("bad displacement %q (symbolic displacements are not supported)", d)
			}
		}
		a.Kind, a.Reg, a.RegOffset, a.Disp = ArgMem, reg, regOffset(reg), disp
		if a.Size == 0 {
			a.Size = 8
		}
	}
	return a, nil
}

// regOffset is register reg's byte offset in struct pt_regs (laid out as
// user_regs_struct for the registers arguments use).
func regOffset(reg string) int {
	off, _ := target.RegisterOffset(reg)
	return off
}

func register(name string) (string, int, error) {
	r, ok := regAlias[name]
	if !ok {
		return "", 0, fmt.Errorf("unknown register %%%s", name)
	}
	return r.reg, r.width, nil
}

package usdt

import (
	"bufio"
	"bytes"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/rbscope/rbscope/internal/target"
	"github.com/rbscope/rbscope/internal/testutil"
)

const libruby = "/usr/lib/x86_64-linux-gnu/libruby-3.1.so.3.1"

// readelfProbe is one probe as `readelf -n` prints it.
type readelfProbe struct {
	provider, name            string
	location, base, semaphore uint64
	args                      string
}

// readelfNotes runs readelf -n on path and parses its stapsdt entries.
func readelfNotes(t *testing.T, path string) []readelfProbe {
	t.Helper()
	if _, err := exec.LookPath("readelf"); err != nil {
		testutil.Missing(t, "readelf not installed (binutils)")
	}
	out, err := exec.Command("readelf", "-n", path).Output()
	if err != nil {
		t.Fatalf("readelf -n %s: %v", path, err)
	}
	var probes []readelfProbe
	var cur *readelfProbe
	sc := bufio.NewScanner(bytes.NewReader(out))
	hex := func(s string) uint64 {
		v, err := strconv.ParseUint(strings.TrimPrefix(strings.TrimSpace(s), "0x"), 16, 64)
		if err != nil {
			t.Fatalf("readelf output: bad number %q", s)
		}
		return v
	}
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, "Provider: "):
			probes = append(probes, readelfProbe{provider: strings.TrimPrefix(line, "Provider: ")})
			cur = &probes[len(probes)-1]
		case cur == nil:
		case strings.HasPrefix(line, "Name: "):
			cur.name = strings.TrimPrefix(line, "Name: ")
		case strings.HasPrefix(line, "Location: "):
			// Location: 0x..., Base: 0x..., Semaphore: 0x...
			for _, part := range strings.Split(line, ",") {
				k, v, _ := strings.Cut(strings.TrimSpace(part), ": ")
				switch k {
				case "Location":
					cur.location = hex(v)
				case "Base":
					cur.base = hex(v)
				case "Semaphore":
					cur.semaphore = hex(v)
				}
			}
		case strings.HasPrefix(line, "Arguments:"):
			cur.args = strings.TrimSpace(strings.TrimPrefix(line, "Arguments:"))
		}
	}
	return probes
}

// sectionOffset converts vaddr to a file offset through the section that
// holds it: an independent check of VaddrToOffset's segment arithmetic.
func sectionOffset(t *testing.T, f *elf.File, vaddr uint64) uint64 {
	t.Helper()
	for _, s := range f.Sections {
		if s.Flags&elf.SHF_ALLOC != 0 && s.Type != elf.SHT_NOBITS && vaddr >= s.Addr && vaddr < s.Addr+s.Size {
			return vaddr - s.Addr + s.Offset
		}
	}
	t.Fatalf("no section holds 0x%x", vaddr)
	return 0
}

func compareWithReadelf(t *testing.T, path string) []Probe {
	t.Helper()
	want := readelfNotes(t, path)
	f, err := os.Open(path)
	if err != nil {
		testutil.Missing(t, "open %s: %v", path, err)
	}
	defer f.Close()
	got, err := Read(f)
	if err != nil {
		t.Fatalf("Read(%s): %v", path, err)
	}
	if len(got) != len(want) || len(got) == 0 {
		t.Fatalf("%s: %d probes, readelf says %d", path, len(got), len(want))
	}
	ef, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ef.Close()
	for i, w := range want {
		g := got[i]
		if g.Provider != w.provider || g.Name != w.name || g.PC != w.location || g.Base != w.base ||
			g.Semaphore != w.semaphore || g.ArgSpec != w.args {
			t.Errorf("probe %d: got %s:%s pc=%#x base=%#x sem=%#x args=%q; readelf: %s:%s pc=%#x base=%#x sem=%#x args=%q",
				i, g.Provider, g.Name, g.PC, g.Base, g.Semaphore, g.ArgSpec,
				w.provider, w.name, w.location, w.base, w.semaphore, w.args)
		}
		if off := sectionOffset(t, ef, g.PC); g.Offset != off {
			t.Errorf("probe %s: offset %#x, section arithmetic says %#x", g.Name, g.Offset, off)
		}
		if g.Semaphore != 0 {
			if off := sectionOffset(t, ef, g.Semaphore); g.SemaphoreOffset != off {
				t.Errorf("probe %s: semaphore offset %#x, section arithmetic says %#x", g.Name, g.SemaphoreOffset, off)
			}
		}
		if g.ArgErr != nil {
			t.Errorf("probe %s: arguments %q: %v", g.Name, g.ArgSpec, g.ArgErr)
		}
		if n := len(strings.Fields(w.args)); len(g.Args) != n {
			t.Errorf("probe %s: %d arguments decoded, readelf shows %d", g.Name, len(g.Args), n)
		}
	}
	return got
}

func TestLibruby(t *testing.T) {
	if _, err := os.Stat(libruby); err != nil {
		testutil.Missing(t, "Debian's libruby 3.1 is not installed: %v", err)
	}
	probes := compareWithReadelf(t, libruby)
	var obj *Probe
	names := map[string]int{}
	for i := range probes {
		names[probes[i].Name]++
		if probes[i].Name == "object__create" {
			obj = &probes[i]
		}
	}
	for _, n := range []string{"object__create", "array__create", "string__create", "hash__create", "symbol__create", "gc__mark__begin", "gc__sweep__end"} {
		if names[n] == 0 {
			t.Errorf("no %s probe in %s", n, libruby)
		}
	}
	if obj == nil {
		t.Fatal("no object__create")
	}
	if obj.Provider != "ruby" || obj.Semaphore == 0 {
		t.Errorf("object__create: provider %q semaphore %#x", obj.Provider, obj.Semaphore)
	}
	// object__create(const char *classname, const char *filename, int line)
	// is "8@%rax 8@%r13 -4@4(%rsp)" in Debian's 3.1.2 build.
	want := []Arg{
		{Kind: ArgReg, Size: 8, Reg: "rax", RegOffset: 80},
		{Kind: ArgReg, Size: 8, Reg: "r13", RegOffset: 16},
		{Kind: ArgMem, Size: 4, Signed: true, Reg: "rsp", RegOffset: 152, Disp: 4},
	}
	if obj.ArgSpec == "8@%rax 8@%r13 -4@4(%rsp)" && !reflect.DeepEqual(obj.Args, want) {
		t.Errorf("object__create args = %+v, want %+v", obj.Args, want)
	}
}

// buildFixture compiles testdata/probes.c, whose data segment's virtual
// addresses differ from its file offsets (as with most PIEs).
func buildFixture(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		testutil.Missing(t, "gcc not installed")
	}
	out := filepath.Join(t.TempDir(), "probes")
	cmd := exec.Command("gcc", "-O2", "-o", out, "testdata/probes.c")
	if b, err := cmd.CombinedOutput(); err != nil {
		if strings.Contains(string(b), "sdt.h") {
			testutil.Missing(t, "sys/sdt.h missing (install systemtap-sdt-dev): %s", b)
		}
		t.Fatalf("gcc: %v\n%s", err, b)
	}
	return out
}

func TestCompiledFixture(t *testing.T) {
	path := buildFixture(t)
	probes := compareWithReadelf(t, path)
	byName := map[string]Probe{}
	for _, p := range probes {
		byName[p.Name] = p
	}
	hit, ok := byName["hit"]
	if !ok || hit.Provider != "rbtest" {
		t.Fatalf("no rbtest:hit probe: %+v", probes)
	}
	if hit.Semaphore == hit.SemaphoreOffset {
		t.Errorf("semaphore vaddr %#x equals its offset: the fixture no longer exercises the conversion", hit.Semaphore)
	}
	if len(hit.Args) != 3 {
		t.Fatalf("hit args %+v", hit.Args)
	}
	if a := hit.Args[0]; a.Size != 8 || !a.Signed {
		t.Errorf("hit arg 1 %+v: want signed 8 bytes", a)
	}
	if a := hit.Args[1]; a.Size != 4 || !a.Signed {
		t.Errorf("hit arg 2 %+v: want signed 4 bytes", a)
	}
	other := byName["other"]
	if len(other.Args) != 2 || other.Args[1] != (Arg{Kind: ArgConst, Size: 4, Signed: true, Disp: -5}) {
		t.Errorf("other args %+v: want a signed 4-byte constant -5 second", other.Args)
	}
	if other.Args[0].Size != 2 || !other.Args[0].Signed {
		t.Errorf("other arg 1 %+v: want signed 2 bytes", other.Args[0])
	}
	if e := byName["empty"]; len(e.Args) != 0 || e.ArgErr != nil {
		t.Errorf("empty probe args %+v err %v", e.Args, e.ArgErr)
	}
}

func TestParseArg(t *testing.T) {
	tests := []struct {
		in   string
		want Arg
		err  bool
	}{
		{in: "8@%rax", want: Arg{Kind: ArgReg, Size: 8, Reg: "rax", RegOffset: 80}},
		{in: "-4@%eax", want: Arg{Kind: ArgReg, Size: 4, Signed: true, Reg: "rax", RegOffset: 80}},
		{in: "-2@%di", want: Arg{Kind: ArgReg, Size: 2, Signed: true, Reg: "rdi", RegOffset: 112}},
		{in: "1@%sil", want: Arg{Kind: ArgReg, Size: 1, Reg: "rsi", RegOffset: 104}},
		{in: "1@%r11b", want: Arg{Kind: ArgReg, Size: 1, Reg: "r11", RegOffset: 48}},
		{in: "-4@%r12d", want: Arg{Kind: ArgReg, Size: 4, Signed: true, Reg: "r12", RegOffset: 24}},
		{in: "2@%r9w", want: Arg{Kind: ArgReg, Size: 2, Reg: "r9", RegOffset: 64}},
		{in: "%rbx", want: Arg{Kind: ArgReg, Size: 8, Reg: "rbx", RegOffset: 40}},
		{in: "%ecx", want: Arg{Kind: ArgReg, Size: 4, Reg: "rcx", RegOffset: 88}},
		{in: "-4@4(%rsp)", want: Arg{Kind: ArgMem, Size: 4, Signed: true, Reg: "rsp", RegOffset: 152, Disp: 4}},
		{in: "8@-16(%rbp)", want: Arg{Kind: ArgMem, Size: 8, Reg: "rbp", RegOffset: 32, Disp: -16}},
		{in: "8@(%rsi)", want: Arg{Kind: ArgMem, Size: 8, Reg: "rsi", RegOffset: 104}},
		{in: "4@0x10(%r15)", want: Arg{Kind: ArgMem, Size: 4, Reg: "r15", RegOffset: 0, Disp: 16}},
		{in: "-4@$0", want: Arg{Kind: ArgConst, Size: 4, Signed: true}},
		{in: "-4@$-5", want: Arg{Kind: ArgConst, Size: 4, Signed: true, Disp: -5}},
		{in: "8@$0x20", want: Arg{Kind: ArgConst, Size: 8, Disp: 32}},
		{in: "$7", want: Arg{Kind: ArgConst, Size: 8, Disp: 7}},
		{in: "3@%rax", err: true},
		{in: "x@%rax", err: true},
		{in: "8@%xmm0", err: true},
		{in: "8@%ah", err: true},
		{in: "8@sym(%rip)", err: true},
		{in: "8@8(%rip)", err: true},
		{in: "8@(%rax,%rbx,8)", err: true},
		{in: "8@", err: true},
		{in: "8@$zz", err: true},
		{in: "8@%rip", err: true},
		{in: "8@16", err: true},
	}
	for _, tt := range tests {
		got, err := ParseArg(tt.in)
		if tt.err {
			if err == nil {
				t.Errorf("ParseArg(%q) = %+v, want an error", tt.in, got)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ParseArg(%q) = %+v, %v; want %+v", tt.in, got, err, tt.want)
		}
	}
	if args, err := ParseArgs("  8@%rax   -4@4(%rsp) "); err != nil || len(args) != 2 {
		t.Errorf("ParseArgs with extra spaces: %+v, %v", args, err)
	}
	if _, err := ParseArgs("8@%rax 8@%bogus"); err == nil || !strings.Contains(err.Error(), "argument 2") {
		t.Errorf("ParseArgs should name the failing argument, got %v", err)
	}
}

// note builds one raw note with namesz/descsz/type and padding.
func note(order binary.ByteOrder, name string, typ uint32, desc []byte) []byte {
	var b bytes.Buffer
	nm := append([]byte(name), 0)
	var hdr [12]byte
	order.PutUint32(hdr[0:], uint32(len(nm)))
	order.PutUint32(hdr[4:], uint32(len(desc)))
	order.PutUint32(hdr[8:], typ)
	b.Write(hdr[:])
	b.Write(nm)
	for b.Len()%4 != 0 {
		b.WriteByte(0)
	}
	b.Write(desc)
	for b.Len()%4 != 0 {
		b.WriteByte(0)
	}
	return b.Bytes()
}

func stapDesc(order binary.ByteOrder, addrSize int, pc, base, sem uint64, provider, name, args string) []byte {
	var b bytes.Buffer
	for _, v := range []uint64{pc, base, sem} {
		if addrSize == 8 {
			_ = binary.Write(&b, order, v)
		} else {
			_ = binary.Write(&b, order, uint32(v))
		}
	}
	fmt.Fprintf(&b, "%s\x00%s\x00%s\x00", provider, name, args)
	return b.Bytes()
}

func TestParseNotesCrafted(t *testing.T) {
	le := binary.LittleEndian
	be := binary.BigEndian
	var sec []byte
	sec = append(sec, note(le, "stapsdt", ntStapsdt, stapDesc(le, 8, 0x1234, 0x2000, 0x4010, "ruby", "object__create", "8@%rax 8@%r13 -4@4(%rsp)"))...)
	sec = append(sec, note(le, "GNU", 3, []byte{1, 2, 3, 4})...) // a build-id-like note: skipped
	sec = append(sec, note(le, "stapsdt", 99, []byte{0})...)     // other type: skipped
	sec = append(sec, note(le, "stapsdt", ntStapsdt, stapDesc(le, 8, 0x99, 0x2000, 0, "p", "n", ""))...)
	notes, err := ParseNotes(sec, le, 8)
	if err != nil {
		t.Fatal(err)
	}
	want := []Note{
		{PC: 0x1234, Base: 0x2000, Semaphore: 0x4010, Provider: "ruby", Name: "object__create", Args: "8@%rax 8@%r13 -4@4(%rsp)"},
		{PC: 0x99, Base: 0x2000, Provider: "p", Name: "n"},
	}
	if !reflect.DeepEqual(notes, want) {
		t.Errorf("got %+v\nwant %+v", notes, want)
	}

	// 32-bit big-endian notes.
	sec32 := note(be, "stapsdt", ntStapsdt, stapDesc(be, 4, 0x10, 0x20, 0x30, "a", "b", "4@%eax"))
	notes, err = ParseNotes(sec32, be, 4)
	if err != nil || len(notes) != 1 || notes[0].PC != 0x10 || notes[0].Semaphore != 0x30 || notes[0].Name != "b" {
		t.Errorf("32-bit BE: %+v, %v", notes, err)
	}

	// Truncated and corrupt input: errors, never panics.
	for i := 0; i < len(sec); i++ {
		_, _ = ParseNotes(sec[:i], le, 8)
	}
	bad := note(le, "stapsdt", ntStapsdt, []byte("short"))
	if _, err := ParseNotes(bad, le, 8); err == nil {
		t.Error("short descriptor accepted")
	}
	huge := note(le, "stapsdt", ntStapsdt, nil)
	le.PutUint32(huge[4:], 0xffffffff)
	if _, err := ParseNotes(huge, le, 8); err == nil {
		t.Error("overrunning descsz accepted")
	}
	noName := note(le, "stapsdt", ntStapsdt, stapDesc(le, 8, 1, 2, 3, "", "x", ""))
	if _, err := ParseNotes(noName, le, 8); err == nil {
		t.Error("empty provider accepted")
	}
	if _, err := ParseNotes(sec, le, 3); err == nil {
		t.Error("address size 3 accepted")
	}
}

func TestPrelinkAdjust(t *testing.T) {
	// A note written at base 0x2000; the binary was later moved so that
	// .stapsdt.base is at 0x3000: PC and semaphore move by 0x1000.
	n := Note{PC: 0x1500, Base: 0x2000, Semaphore: 0x5000}
	pc, sem := adjust(n, 0x3000, true)
	if pc != 0x2500 || sem != 0x6000 {
		t.Errorf("adjust = %#x, %#x; want 0x2500, 0x6000", pc, sem)
	}
	n.Semaphore = 0
	if pc, sem = adjust(n, 0x3000, true); pc != 0x2500 || sem != 0 {
		t.Errorf("adjust without semaphore = %#x, %#x", pc, sem)
	}
	if pc, _ = adjust(n, 0, false); pc != 0x1500 {
		t.Errorf("adjust without .stapsdt.base moved pc to %#x", pc)
	}
}

func FuzzParseNotes(f *testing.F) {
	le := binary.LittleEndian
	f.Add(note(le, "stapsdt", ntStapsdt, stapDesc(le, 8, 0x1234, 0x2000, 0x4010, "ruby", "object__create", "8@%rax 8@%r13 -4@4(%rsp)")), 8)
	f.Add(note(le, "stapsdt", ntStapsdt, stapDesc(le, 4, 1, 2, 3, "a", "b", "-4@$0")), 4)
	f.Fuzz(func(t *testing.T, data []byte, addrSize int) {
		if addrSize != 4 {
			addrSize = 8
		}
		notes, err := ParseNotes(data, le, addrSize)
		if len(notes) > len(data)/12+1 {
			t.Fatalf("%d notes from %d bytes", len(notes), len(data))
		}
		for _, n := range notes {
			if len(n.Provider)+len(n.Name)+len(n.Args) > len(data) {
				t.Fatalf("strings longer than the input")
			}
			// The argument decoder must not panic either.
			_, _ = ParseArgs(n.Args)
		}
		_ = err
	})
}

func FuzzParseArgs(f *testing.F) {
	for _, s := range []string{"8@%rax 8@%r13 -4@4(%rsp)", "-4@$0", "8@(%rsi)", "-2@%di -4@$-5", "%eax", "8@0x10(%r15)"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		args, err := ParseArgs(s)
		if err != nil {
			return
		}
		for _, a := range args {
			if a.Size != 1 && a.Size != 2 && a.Size != 4 && a.Size != 8 {
				t.Fatalf("%q: size %d", s, a.Size)
			}
			if a.Kind == ArgReg || a.Kind == ArgMem {
				if off, ok := target.RegisterOffset(a.Reg); !ok || a.RegOffset != off {
					t.Fatalf("%q: register %q offset %d", s, a.Reg, a.RegOffset)
				}
			}
		}
	})
}

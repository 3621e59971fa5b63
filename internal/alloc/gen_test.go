package alloc

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/rbscope/rbscope/internal/testutil"
)

// generateArgs returns bpf2go's arguments from gen.go's go:generate line,
// so that the test builds exactly what `go generate` builds.
func generateArgs(t *testing.T) []string {
	t.Helper()
	src, err := os.ReadFile("gen.go")
	if err != nil {
		t.Fatal(err)
	}
	const prefix = "//go:generate go tool bpf2go "
	for _, line := range strings.Split(string(src), "\n") {
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		wd, _ := os.Getwd()
		line = os.Expand(strings.TrimPrefix(line, prefix), func(k string) string {
			if k == "PWD" {
				return wd
			}
			return os.Getenv(k)
		})
		// Split on spaces outside double quotes; quotes are kept out.
		var args []string
		var cur strings.Builder
		inQ := false
		for _, r := range line {
			switch {
			case r == '"':
				inQ = !inQ
			case r == ' ' && !inQ:
				if cur.Len() > 0 {
					args = append(args, cur.String())
					cur.Reset()
				}
			default:
				cur.WriteRune(r)
			}
		}
		if cur.Len() > 0 {
			args = append(args, cur.String())
		}
		return args
	}
	t.Fatal("no go:generate line in gen.go")
	return nil
}

// TestGeneratedUpToDate recompiles bpf/alloc.bpf.c with bpf2go into a
// temporary directory and compares the result with the committed files:
// the Go file byte for byte, the object by its programs' instructions and
// its maps (clang may lay out the ELF differently without changing them).
func TestGeneratedUpToDate(t *testing.T) {
	if testing.Short() {
		testutil.Missing(t, "compiles the eBPF program")
	}
	if _, err := exec.LookPath("clang"); err != nil {
		testutil.Missing(t, "clang (scripts/install-deps.sh): regenerates the eBPF object")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		testutil.Missing(t, "go on PATH")
	}
	dir := t.TempDir()
	args := append([]string{"tool", "bpf2go", "-output-dir", dir}, generateArgs(t)...)
	cmd := exec.Command(goBin, args...)
	cmd.Env = append(os.Environ(), "GOPACKAGE=alloc", "GOFILE=gen.go")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("bpf2go: %v\n%s", err, out)
	}
	ver, _ := exec.Command("clang", "--version").Output()
	hint := fmt.Sprintf("run `go generate ./internal/alloc` and commit (clang here: %s)", strings.SplitN(string(ver), "\n", 2)[0])

	for _, name := range []string{"alloc_x86_bpfel.go"} {
		fresh, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		committed, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(fresh, committed) {
			t.Errorf("%s differs from the source: %s", name, hint)
		}
	}
	fresh, err := ebpf.LoadCollectionSpec(filepath.Join(dir, "alloc_x86_bpfel.o"))
	if err != nil {
		t.Fatal(err)
	}
	committed, err := loadAlloc()
	if err != nil {
		t.Fatal(err)
	}
	if len(fresh.Programs) != len(committed.Programs) {
		t.Fatalf("%d programs fresh, %d committed: %s", len(fresh.Programs), len(committed.Programs), hint)
	}
	for name, fp := range fresh.Programs {
		cp := committed.Programs[name]
		if cp == nil {
			t.Errorf("program %s is not in the committed object: %s", name, hint)
			continue
		}
		if fs, cs := fmt.Sprint(fp.Instructions), fmt.Sprint(cp.Instructions); fs != cs {
			t.Errorf("program %s: instructions differ: %s", name, hint)
		}
		if fp.SectionName != cp.SectionName || fp.Type != cp.Type || fp.AttachType != cp.AttachType || fp.License != cp.License {
			t.Errorf("program %s: section/type/license differ: %s", name, hint)
		}
	}
	for name, fm := range fresh.Maps {
		cm := committed.Maps[name]
		if cm == nil {
			t.Errorf("map %s is not in the committed object: %s", name, hint)
			continue
		}
		type shape struct {
			T                ebpf.MapType
			K, V, Max, Flags uint32
		}
		fs := shape{fm.Type, fm.KeySize, fm.ValueSize, fm.MaxEntries, fm.Flags}
		cs := shape{cm.Type, cm.KeySize, cm.ValueSize, cm.MaxEntries, cm.Flags}
		if !reflect.DeepEqual(fs, cs) {
			t.Errorf("map %s: %+v fresh, %+v committed: %s", name, fs, cs, hint)
		}
	}
}

// privStackMin is the stack depth from which Linux (6.13+) runs a
// tracing program's function on a private per-CPU stack
// (BPF_PRIV_STACK_MIN_SIZE in kernel/bpf/verifier.c, compared with the
// depth rounded up to 16 bytes).
const privStackMin = 64

// TestHotPathOffPrivateStack keeps the programs' own frames (what every
// allocation event runs) below privStackMin: on a private stack the line
// read's destination is per-CPU memory, which hardened usercopy checks as
// a heap object, ~40 ns more per event (bench-alloc: prog 236 -> 197 ns
// on the array loop). The rare paths (a new site, a stack copy) are
// functions of their own, whose frames do not count.
func TestHotPathOffPrivateStack(t *testing.T) {
	spec, err := loadAlloc()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"ruby_alloc_multi", "ruby_alloc"} {
		p := spec.Programs[name]
		if p == nil {
			t.Fatalf("no program %s", name)
		}
		depth := int16(0)
		for i, ins := range p.Instructions {
			if sym := ins.Symbol(); i > 0 && sym != "" && sym != name {
				break // the first subprogram: the main function ends here
			}
			if ins.Src == asm.R10 && ins.Offset < depth {
				depth = ins.Offset
			}
			if ins.Dst == asm.R10 && ins.OpCode.Class().IsStore() && ins.Offset < depth {
				depth = ins.Offset
			}
		}
		rounded := (int(-depth) + 15) &^ 15
		t.Logf("%s: %d bytes of stack (%d rounded)", name, -depth, rounded)
		if rounded >= privStackMin {
			t.Errorf("%s uses %d bytes of stack (%d rounded): at %d or more, the kernel gives it a private stack and every user read pays a heap check; move what needs the room into a noinline function", name, -depth, rounded, privStackMin)
		}
	}
}

// TestMapReplacementsCoverProgram: every map of the program is one of the
// tracker's own, which outlive each load of the program (mapReplacements):
// one left out is a fresh map the tracker never sees (the window mark,
// left out at first, was never armed: the program wrote to a map of its
// own).
func TestMapReplacementsCoverProgram(t *testing.T) {
	spec, err := loadAlloc()
	if err != nil {
		t.Fatal(err)
	}
	repl := (&Tracker{}).mapReplacements()
	for name := range spec.Maps {
		if strings.HasPrefix(name, ".") {
			continue // .rodata, .bss: the program's variables
		}
		if _, ok := repl[name]; !ok {
			t.Errorf("map %s is not in mapReplacements", name)
		}
	}
}

package dwarfstruct_test

import (
	"bufio"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/rbscope/rbscope/internal/cstruct"
	"github.com/rbscope/rbscope/internal/dwarfstruct"
	"github.com/rbscope/rbscope/internal/layout"
	"github.com/rbscope/rbscope/internal/testutil"
)

// shapesStructs are the structs testdata/shapes.c defines.
var shapesStructs = []string{"RBasic", "RString", "rb_control_frame_struct", "rb_thread_struct",
	"rb_symbols_t", "rb_method_definition_struct", "matrix"}

func needTool(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		testutil.Missing(t, "%s not installed (scripts/install-deps.sh installs it)", name)
	}
	return p
}

func run(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// compileC compiles src (a path) to an object file with gcc and flags.
func compileC(t testing.TB, src, out string, flags ...string) string {
	t.Helper()
	needTool(t, "gcc")
	args := append([]string{"-c", "-o", out}, flags...)
	run(t, "gcc", append(args, src)...)
	return out
}

// paholeField is one member as pahole prints it. For a bitfield, off is
// the storage unit's byte offset and bit the bit within it.
type paholeField struct {
	off, size, bit, bits uint64
}

type paholeStruct struct {
	size   uint64
	fields map[string]paholeField
}

var (
	paholeMember = regexp.MustCompile(`^\s*(.*?);\s*/\*\s*(\d+)(?::\s*(\d+))?\s+(\d+)\s*\*/`)
	paholeOpen   = regexp.MustCompile(`^\s*(?:(struct|union)\s*(\S*)\s*)\{\s*$`)
	paholeSize   = regexp.MustCompile(`/\* size: (\d+),`)
	funcPtrName  = regexp.MustCompile(`\(\s*\*\s*(\w+)\s*\)`)
	bitWidth     = regexp.MustCompile(`:(\d+)$`)
	arrayDims    = regexp.MustCompile(`(\[\d*\])+$`)
)

// parsePahole reads `pahole -F dwarf` output: each top-level struct with
// its members, nested anonymous aggregates as dotted paths (anonymous ones
// adding no component), as the layout schema names them.
func parsePahole(t testing.TB, out string) map[string]paholeStruct {
	t.Helper()
	res := map[string]paholeStruct{}
	var (
		cur   string
		size  uint64
		stack []map[string]paholeField // members of each open aggregate; [0] is the struct
	)
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if cur == "" {
			if m := paholeOpen.FindStringSubmatch(line); m != nil && !strings.HasPrefix(line, "\t") {
				cur, size = m[2], 0
				stack = []map[string]paholeField{{}}
			}
			continue
		}
		if line == "};" {
			res[cur] = paholeStruct{size: size, fields: stack[0]}
			cur = ""
			continue
		}
		if m := paholeSize.FindStringSubmatch(line); m != nil && len(stack) == 1 {
			size, _ = strconv.ParseUint(m[1], 10, 64)
			continue
		}
		if paholeOpen.MatchString(line) {
			stack = append(stack, map[string]paholeField{})
			continue
		}
		m := paholeMember.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		decl := strings.TrimSpace(m[1])
		off, _ := strconv.ParseUint(m[2], 10, 64)
		fsize, _ := strconv.ParseUint(m[4], 10, 64)
		f := paholeField{off: off, size: fsize}
		if strings.HasPrefix(decl, "}") {
			name := strings.TrimSpace(strings.TrimPrefix(decl, "}"))
			inner := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			parent := stack[len(stack)-1]
			prefix := ""
			if name != "" {
				prefix = name + "."
				parent[name] = f
			}
			for k, v := range inner {
				parent[prefix+k] = v
			}
			continue
		}
		if m[3] != "" {
			f.bit, _ = strconv.ParseUint(m[3], 10, 64)
			bm := bitWidth.FindStringSubmatch(decl)
			if bm == nil {
				t.Fatalf("pahole bitfield without width: %q", line)
			}
			f.bits, _ = strconv.ParseUint(bm[1], 10, 64)
			decl = strings.TrimSuffix(decl, bm[0])
		}
		var name string
		if fm := funcPtrName.FindStringSubmatch(decl); fm != nil {
			name = fm[1]
		} else {
			decl = arrayDims.ReplaceAllString(decl, "")
			fs := strings.FieldsFunc(decl, func(r rune) bool { return r == ' ' || r == '*' || r == '\t' })
			if len(fs) == 0 {
				continue
			}
			name = fs[len(fs)-1]
		}
		stack[len(stack)-1][name] = f
	}
	return res
}

// checkAgainstPahole checks that every member pahole reports for the
// structs of obj has the same offset and size (bit position and width for
// bitfields) in l.
func checkAgainstPahole(t *testing.T, l *dwarfstruct.Result, paholeOut string) {
	t.Helper()
	ph := parsePahole(t, paholeOut)
	checked := 0
	for sname, ps := range ph {
		st, ok := l.Structs[sname]
		if !ok {
			t.Errorf("struct %s: pahole has it, extracted layout does not", sname)
			continue
		}
		if st.Size != ps.size {
			t.Errorf("struct %s: size %d, pahole %d", sname, st.Size, ps.size)
		}
		for fname, pf := range ps.fields {
			fl, ok := st.Fields[fname]
			if !ok {
				t.Errorf("%s.%s: missing (pahole: %+v)", sname, fname, pf)
				continue
			}
			checked++
			if pf.bits > 0 {
				if fl.Bitfield == nil {
					t.Errorf("%s.%s: not a bitfield, pahole says %d bits", sname, fname, pf.bits)
					continue
				}
				abs := pf.off*8 + pf.bit
				got := fl.Offset*8 + uint64(fl.Bitfield.BitOffset)
				if got != abs || uint64(fl.Bitfield.BitWidth) != pf.bits {
					t.Errorf("%s.%s: bit %d width %d, pahole bit %d width %d", sname, fname, got, fl.Bitfield.BitWidth, abs, pf.bits)
				}
				continue
			}
			if fl.Offset != pf.off || fl.Size != pf.size {
				t.Errorf("%s.%s: offset %d size %d, pahole %d %d", sname, fname, fl.Offset, fl.Size, pf.off, pf.size)
			}
		}
	}
	if checked < 40 {
		t.Errorf("only %d fields compared with pahole; parser broken?", checked)
	}
}

func TestExtractMatchesPahole(t *testing.T) {
	needTool(t, "pahole")
	src := filepath.Join("testdata", "shapes.c")
	dir := t.TempDir()
	base := compileC(t, src, filepath.Join(dir, "base.o"), "-g")
	d4 := compileC(t, src, filepath.Join(dir, "d4.o"), "-g", "-gdwarf-4")
	d2 := compileC(t, src, filepath.Join(dir, "d2.o"), "-g", "-gdwarf-2", "-gstrict-dwarf")
	variants := []struct {
		name  string
		obj   string
		plain string // the uncompressed object pahole reads
	}{
		{"dwarf5", compileC(t, src, filepath.Join(dir, "d5.o"), "-g", "-gdwarf-5"), ""},
		{"dwarf4", d4, ""},
		{"dwarf2", d2, ""},
		{"gz-zlib", compileC(t, src, filepath.Join(dir, "gz.o"), "-g", "-gz=zlib"), base},
		{"dwarf4-gz-zlib", compileC(t, src, filepath.Join(dir, "d4gz.o"), "-g", "-gdwarf-4", "-gz=zlib"), d4},
	}
	if out, err := exec.Command("gcc", "-g", "-gz=zstd", "-c", "-o", filepath.Join(dir, "z.o"), src).CombinedOutput(); err == nil {
		variants = append(variants, struct{ name, obj, plain string }{"gz-zstd", filepath.Join(dir, "z.o"), base})
	} else {
		t.Logf("gcc -gz=zstd unsupported (%s); using objcopy for zstd", strings.TrimSpace(string(out)))
	}
	for _, v := range []struct{ name, flag string }{
		{"objcopy-zstd", "--compress-debug-sections=zstd"},
		{"objcopy-zlib-gnu", "--compress-debug-sections=zlib-gnu"},
	} {
		out := filepath.Join(dir, v.name+".o")
		if msg, err := exec.Command("objcopy", v.flag, base, out).CombinedOutput(); err != nil {
			t.Logf("skip %s: objcopy %s unsupported: %s", v.name, v.flag, msg)
			continue
		}
		variants = append(variants, struct{ name, obj, plain string }{v.name, out, base})
	}
	checkCompression(t, filepath.Join(dir, "objcopy-zstd.o"), ".debug_info", elf.COMPRESS_ZSTD)
	checkCompression(t, filepath.Join(dir, "gz.o"), ".debug_info", elf.COMPRESS_ZLIB)
	if _, err := exec.LookPath("clang"); err == nil {
		// pahole 1.24 misprints clang's nested type definitions, so
		// these are checked against the hand-verified values only.
		for _, v := range []string{"4", "5"} {
			out := filepath.Join(dir, "clang"+v+".o")
			run(t, "clang", "-g", "-gdwarf-"+v, "-c", "-o", out, src)
			variants = append(variants, struct{ name, obj, plain string }{"clang-dwarf" + v, out, "-"})
		}
	}
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			l, err := extractFile(v.obj, shapesStructs)
			if err != nil {
				t.Fatal(err)
			}
			if l.Arch != "x86_64" {
				t.Errorf("arch %q", l.Arch)
			}
			for _, s := range shapesStructs {
				if _, ok := l.Structs[s]; !ok {
					t.Errorf("struct %s not extracted", s)
				}
			}
			plain := v.plain
			if plain == "" {
				plain = v.obj
			}
			if plain != "-" {
				checkAgainstPahole(t, l, run(t, "pahole", "-F", "dwarf", plain))
			}
			checkShapesValues(t, l)
		})
	}
}

// checkShapesValues checks hand-verified values of testdata/shapes.c: the
// cases pahole does not print (typedef'd anonymous structs, nested named
// struct types) and the schema's naming rules.
func checkShapesValues(t *testing.T, l *dwarfstruct.Result) {
	t.Helper()
	want := map[string]map[string]cstruct.Field{
		"RString": {
			"basic.klass":       {Offset: 8, Size: 8},
			"as.heap.aux.capa":  {Offset: 32, Size: 8},
			"as.embed.ary":      {Offset: 16, Size: 24},
			"as":                {Offset: 16, Size: 24},
			"as.heap.ptr":       {Offset: 24, Size: 8},
			"as.heap.aux.share": {},
		},
		"rb_thread_struct": {
			"status":                {Offset: 36, Size: 1, Bitfield: &cstruct.Bitfield{BitOffset: 0, BitWidth: 2}},
			"locking_native_thread": {Offset: 36, Size: 1, Bitfield: &cstruct.Bitfield{BitOffset: 2, BitWidth: 1}},
			"wide":                  {Offset: 36, Size: 4, Bitfield: &cstruct.Bitfield{BitOffset: 4, BitWidth: 27}},
			"across":                {Offset: 40, Size: 5, Bitfield: &cstruct.Bitfield{BitOffset: 0, BitWidth: 40}},
			"func":                  {Offset: 48, Size: 8},
			"argc":                  {Offset: 56, Size: 4},
			"proc":                  {Offset: 48, Size: 8},
			"nested.a":              {Offset: 64, Size: 8},
			"nested.s":              {Offset: 72, Size: 1, Bitfield: &cstruct.Bitfield{BitOffset: 0, BitWidth: 3}},
			"interrupt_flag":        {Offset: 80, Size: 8},
			"ractor":                {Offset: 24, Size: 8},
			"flex":                  {Offset: 96, Size: 0},
		},
		"rb_symbols_t": {
			"last_id":           {Offset: 0, Size: 8},
			"dsymbol_fstr_hash": {Offset: 24, Size: 8},
		},
		"rb_method_definition_struct": {
			"type":                 {Offset: 0, Size: 1, Bitfield: &cstruct.Bitfield{BitOffset: 0, BitWidth: 4}},
			"alias_count":          {Offset: 0, Size: 4, Bitfield: &cstruct.Bitfield{BitOffset: 4, BitWidth: 27}},
			"complemented_count":   {Offset: 4, Size: 4, Bitfield: &cstruct.Bitfield{BitOffset: 0, BitWidth: 28}},
			"no_redef_warning":     {Offset: 7, Size: 1, Bitfield: &cstruct.Bitfield{BitOffset: 4, BitWidth: 1}},
			"body.cfunc.func":      {Offset: 8, Size: 8},
			"body.iseq.iseqptr":    {Offset: 8, Size: 8},
			"body.cfunc.argc":      {Offset: 24, Size: 4},
			"original_id":          {Offset: 32, Size: 8},
			"body":                 {Offset: 8, Size: 24},
			"body.cfunc.invoker":   {Offset: 16, Size: 8},
			"body.iseq.cref":       {Offset: 16, Size: 8},
			"method_serial":        {Offset: 40, Size: 8},
			"body.cfunc":           {Offset: 8, Size: 24},
			"body.iseq":            {Offset: 8, Size: 16},
			"complemented_countX":  {},
			"no_redef_warning_bad": {},
		},
	}
	for sname, fields := range want {
		for fname, w := range fields {
			got, err := field(l, sname, fname)
			if w.Size == 0 && w.Offset == 0 && fname != "flex" {
				if err == nil {
					t.Errorf("%s.%s: present, want absent", sname, fname)
				}
				continue
			}
			if err != nil {
				t.Error(err)
				continue
			}
			if got.Offset != w.Offset || got.Size != w.Size || (got.Bitfield == nil) != (w.Bitfield == nil) ||
				(w.Bitfield != nil && *got.Bitfield != *w.Bitfield) {
				t.Errorf("%s.%s = %+v %+v, want %+v %+v", sname, fname, got, got.Bitfield, w, w.Bitfield)
			}
		}
	}
	if sz := l.Structs["rb_symbols_t"].Size; sz != 32 {
		t.Errorf("rb_symbols_t size %d, want 32", sz)
	}
	if f, _ := field(l, "matrix", "cells"); f.Size != 48 || f.Type != "int[3][4]" {
		t.Errorf("matrix.cells = %+v, want 48 bytes of int[3][4]", f)
	}
	if f, _ := field(l, "rb_control_frame_struct", "iseq"); f.Type != "const rb_iseq_t *" || f.Offset != 16 {
		t.Errorf("rb_control_frame_struct.iseq = %+v", f)
	}
	if f, _ := field(l, "rb_thread_struct", "interrupt_flag"); f.Type != "rb_atomic_t" {
		t.Errorf("interrupt_flag type %q, want the typedef name rb_atomic_t", f.Type)
	}
	if s := l.Structs["rb_thread_struct"]; s.Align != 8 {
		t.Errorf("rb_thread_struct align %d, want 8", s.Align)
	}
}

// TestWalksOnlyWhatIsNeeded checks that extraction stops at the unit that
// completes the wanted set, and hands to debug/dwarf only units that
// define a wanted struct (the others are only pre-scanned).
func TestWalksOnlyWhatIsNeeded(t *testing.T) {
	dir := t.TempDir()
	other := filepath.Join(dir, "other.c")
	if err := os.WriteFile(other, []byte("struct other { int x; struct RString *p; };\nstatic struct other g_other;\nstruct RBasic; static struct RBasic *g_decl;\nstatic int f(int a) { struct RBasic { int local; } l = {a}; return l.local; }\nint (*use_other(void))(int) { (void)g_other; (void)g_decl; return f; }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	shapes, err := filepath.Abs(filepath.Join("testdata", "shapes.c"))
	if err != nil {
		t.Fatal(err)
	}
	type compiler struct {
		name string
		cc   string
		args []string
	}
	compilers := []compiler{
		{"gcc-dwarf5", "gcc", []string{"-gdwarf-5"}},
		{"gcc-dwarf4", "gcc", []string{"-gdwarf-4"}},
		{"gcc-zlib", "gcc", []string{"-gz=zlib"}},
	}
	if _, err := exec.LookPath("clang"); err == nil {
		compilers = append(compilers, compiler{"clang-dwarf5", "clang", []string{"-gdwarf-5"}})
	}
	needTool(t, "gcc")
	for _, c := range compilers {
		t.Run(c.name, func(t *testing.T) {
			var objs []string
			for i, src := range []string{other, other, shapes, other, other} {
				obj := filepath.Join(dir, fmt.Sprintf("%s-%d.o", c.name, i))
				run(t, c.cc, append(append([]string{"-g", "-fPIC", "-c", "-o", obj, fmt.Sprintf("-Duse_other=use_other_%d", i)}, c.args...), src)...)
				objs = append(objs, obj)
			}
			so := filepath.Join(dir, c.name+".so")
			run(t, c.cc, append([]string{"-shared", "-o", so}, objs...)...)
			f, err := os.Open(so)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			l, st, err := dwarfstruct.ExtractWith(f, shapesStructs, dwarfstruct.DefaultLimits, false)
			if err != nil {
				t.Fatal(err)
			}
			checkShapesValues(t, l)
			if st.Units != 3 || st.Decoded != 1 {
				t.Errorf("all found in unit 3: read %d units, decoded %d; want 3 and 1", st.Units, st.Decoded)
			}
			_, st, err = dwarfstruct.ExtractWith(f, append([]string{"absent_struct"}, shapesStructs...), dwarfstruct.DefaultLimits, false)
			if err != nil {
				t.Fatal(err)
			}
			if st.Units != 5 || st.Decoded != 1 {
				t.Errorf("one struct absent: read %d units, decoded %d; want 5 and 1", st.Units, st.Decoded)
			}
		})
	}
}

// TestDwz checks DWARF rewritten by dwz, as distributions ship it: shared
// types moved into partial units that other units reference with
// DW_FORM_ref_addr (read whole). The dwz supplementary file (dwz -m) is
// layout's to find: see its TestDwzMultifile.
func TestDwz(t *testing.T) {
	needTool(t, "dwz")
	needTool(t, "gcc")
	dir := t.TempDir()
	src, err := os.ReadFile(filepath.Join("testdata", "shapes.c"))
	if err != nil {
		t.Fatal(err)
	}
	// Two units with the same types, so dwz has something to share.
	var objs []string
	for _, p := range []string{"a", "b"} {
		c := filepath.Join(dir, p+".c")
		if err := os.WriteFile(c, []byte(regexp.MustCompile(`\bg_`).ReplaceAllString(string(src), p+"_")), 0o644); err != nil {
			t.Fatal(err)
		}
		objs = append(objs, compileC(t, c, filepath.Join(dir, p+".o"), "-g", "-fPIC"))
	}
	so := filepath.Join(dir, "libpu.so")
	run(t, "gcc", append([]string{"-shared", "-o", so}, objs...)...)
	run(t, "dwz", so)
	f, err := os.Open(so)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	l, st, err := dwarfstruct.ExtractWith(f, shapesStructs, dwarfstruct.DefaultLimits, false)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Whole {
		t.Error("dwz output not read whole: are there no partial units?")
	}
	checkShapesValues(t, l)
	checkAgainstPahole(t, l, run(t, "pahole", "-F", "dwarf", objs[0]))
}

// checkCompression checks that section name of the object at path is
// SHF_COMPRESSED with the given algorithm, so a variant tests what it says.
func checkCompression(t *testing.T, path, name string, want elf.CompressionType) {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s := f.Section(name)
	if s == nil || s.Flags&elf.SHF_COMPRESSED == 0 {
		t.Fatalf("%s: %s not compressed", path, name)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := elf.CompressionType(binary.LittleEndian.Uint32(raw[s.Offset:])); got != want {
		t.Errorf("%s: %s compressed with %v, want %v", path, name, got, want)
	}
}

// TestCompactStringsMatchWhole checks that extraction without .debug_str
// in memory (strings.go) gives exactly the layout the whole-section
// path gives, on shared libraries from each compiler, with a wanted name
// that the linker stored only as the tail of a longer string, and on the
// real libruby of the Rubies under test that carry DWARF.
func TestCompactStringsMatchWhole(t *testing.T) {
	needTool(t, "gcc")
	dir := t.TempDir()
	other := filepath.Join(dir, "other.c")
	// "MyRString" makes the linker keep "RString" only as its tail.
	if err := os.WriteFile(other, []byte("static int MyRString = 1;\nstruct other { int x; struct RString *p; };\nstatic struct other g_other;\nvoid *use_other(void) { return MyRString ? &g_other : 0; }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	shapes, err := filepath.Abs(filepath.Join("testdata", "shapes.c"))
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	for _, c := range []struct {
		name, cc string
		args     []string
	}{
		{"gcc-dwarf5", "gcc", []string{"-gdwarf-5"}},
		{"gcc-dwarf4", "gcc", []string{"-gdwarf-4"}},
		{"gcc-zlib", "gcc", []string{"-gz=zlib"}},
		{"clang-dwarf5", "clang", []string{"-gdwarf-5"}},
	} {
		if _, err := exec.LookPath(c.cc); err != nil {
			continue
		}
		var objs []string
		for i, src := range []string{other, shapes, other} {
			obj := filepath.Join(dir, fmt.Sprintf("%s-%d.o", c.name, i))
			run(t, c.cc, append(append([]string{"-g", "-fPIC", "-c", "-o", obj, fmt.Sprintf("-Duse_other=use_other_%d", i)}, c.args...), src)...)
			objs = append(objs, obj)
		}
		so := filepath.Join(dir, c.name+".so")
		run(t, c.cc, append([]string{"-shared", "-o", so}, objs...)...)
		files[c.name] = so
		if c.name == "gcc-dwarf5" {
			if out := run(t, "readelf", "-p", ".debug_str", so); regexp.MustCompile(`\]  RString\n`).MatchString(out) ||
				!strings.Contains(out, "MyRString") {
				t.Errorf("the linker kept RString on its own: the suffix case is not tested\n%s", out)
			}
		}
	}
	want := shapesStructs
	if testing.Short() {
		t.Log("-short: the real libruby is not read")
	} else {
		for _, rb := range testutil.Rubies(t) {
			if rb.HasDWARF && rb.Shared {
				files["libruby-"+rb.Version] = rb.LibRuby(t)
			}
		}
	}
	for name, path := range files {
		t.Run(name, func(t *testing.T) {
			f, err := os.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			w := want
			if strings.HasPrefix(name, "libruby-") {
				w = layout.NeededStructs(strings.TrimPrefix(name, "libruby-"))
			}
			whole, wst, err := dwarfstruct.ExtractWith(f, w, dwarfstruct.DefaultLimits, true)
			if err != nil {
				t.Fatal(err)
			}
			compact, cst, err := dwarfstruct.ExtractWith(f, w, dwarfstruct.DefaultLimits, false)
			if err != nil {
				t.Fatal(err)
			}
			// String indexes (clang's DWARF 5) need the whole section.
			ef, err := elf.NewFile(f)
			if err != nil {
				t.Fatal(err)
			}
			wantCompact := ef.Section(".debug_str_offsets") == nil
			if cst.Compact != wantCompact || wst.Compact {
				t.Errorf("compact path used: %v (want %v), whole path: %v (want false)", cst.Compact, wantCompact, wst.Compact)
			}
			if !reflect.DeepEqual(whole, compact) {
				t.Errorf("layouts differ:\nwhole   %v\ncompact %v", structNames(whole), structNames(compact))
			}
			if len(compact.Structs) != len(w) {
				t.Errorf("%d of %d structs found", len(compact.Structs), len(w))
			}
			if !strings.HasPrefix(name, "libruby-") {
				checkShapesValues(t, compact)
			}
		})
	}
}

// extractFile is Extract of the file at path.
func extractFile(path string, want []string) (*dwarfstruct.Result, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return dwarfstruct.Extract(f, want)
}

// field returns field f of struct s of l.
func field(l *dwarfstruct.Result, s, f string) (cstruct.Field, error) {
	st, ok := l.Structs[s]
	if !ok {
		return cstruct.Field{}, fmt.Errorf("no struct %s", s)
	}
	fl, ok := st.Fields[f]
	if !ok {
		return cstruct.Field{}, fmt.Errorf("struct %s has no field %s", s, f)
	}
	return fl, nil
}

// structNames returns the names of l's structs, sorted.
func structNames(l *dwarfstruct.Result) []string {
	names := make([]string, 0, len(l.Structs))
	for n := range l.Structs {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

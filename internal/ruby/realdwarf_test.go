package ruby

import (
	"debug/elf"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/rbscope/rbscope/internal/layout"
	"github.com/rbscope/rbscope/internal/testutil"
)

// vmBinary returns the file that holds rb's VM: libruby for a shared
// build, the executable for a static one.
func vmBinary(t *testing.T, rb testutil.RubyUnderTest) string {
	t.Helper()
	if rb.Shared {
		return rb.LibRuby(t)
	}
	return rb.Exe
}

// rawDWARF returns the layout in the DWARF of rb's own build, as found
// where Resolve looks (the binary, else its debug file by build id or
// .gnu_debuglink under rb.DebugRoot), NOT completed from the built-in
// table: every field in it was read from DWARF.
func rawDWARF(t *testing.T, rb testutil.RubyUnderTest) (*layout.Layout, string) {
	t.Helper()
	bin := vmBinary(t, rb)
	var roots []string
	if rb.DebugRoot != "" {
		roots = []string{rb.DebugRoot}
	}
	l, err := layout.FromBinaryFile(bin, layout.NeededStructs(rb.Version), roots)
	if err != nil {
		t.Fatalf("%s: DWARF of %s: %v", rb.Name, bin, err)
	}
	return l, bin
}

// compareOffsets checks that every field and size the walker resolves
// from the built-in table resolves to the same value from DWARF. It
// walks the walker's own offsets struct, so a field the walker starts
// reading is checked without changing this test.
func compareOffsets(t *testing.T, fromDWARF, fromTable offsets) (checked int) {
	t.Helper()
	d, b := reflect.ValueOf(fromDWARF), reflect.ValueOf(fromTable)
	typ := d.Type()
	fo := reflect.TypeOf(fieldOff{})
	for i := 0; i < typ.NumField(); i++ {
		name := typ.Field(i).Name
		dv, bv := d.Field(i), b.Field(i)
		switch {
		case typ.Field(i).Type == fo:
			dw, tb := asFieldOff(dv), asFieldOff(bv)
			if !tb.ok {
				continue
			}
			checked++
			if !dw.ok {
				t.Errorf("%s: in the built-in table (offset %d) but not in DWARF", name, tb.off)
				continue
			}
			if dw.off != tb.off || dw.size != tb.size || !reflect.DeepEqual(dw.bf, tb.bf) {
				t.Errorf("%s: DWARF offset %d size %d bitfield %+v, table offset %d size %d bitfield %+v",
					name, dw.off, dw.size, dw.bf, tb.off, tb.size, tb.bf)
			}
		case dv.Kind() == reflect.Uint64:
			if bv.Uint() == 0 {
				continue
			}
			checked++
			if dv.Uint() != bv.Uint() {
				t.Errorf("%s: DWARF %d, table %d", name, dv.Uint(), bv.Uint())
			}
		case dv.Kind() == reflect.String:
			checked++
			if dv.String() != bv.String() {
				t.Errorf("%s: DWARF %q, table %q", name, dv.String(), bv.String())
			}
		default:
			t.Fatalf("offsets.%s has type %s: teach this test to compare it", name, dv.Type())
		}
	}
	return checked
}

// asFieldOff copies an unexported fieldOff out of a reflect.Value.
func asFieldOff(v reflect.Value) fieldOff {
	f := fieldOff{off: v.FieldByName("off").Uint(), size: v.FieldByName("size").Uint(), ok: v.FieldByName("ok").Bool()}
	if bf := v.FieldByName("bf"); !bf.IsNil() {
		e := bf.Elem()
		f.bf = &layout.Bitfield{BitOffset: int(e.FieldByName("BitOffset").Int()), BitWidth: int(e.FieldByName("BitWidth").Int())}
	}
	return f
}

// TestRealDWARFMatchesTable reads each Ruby's layout from its own DWARF
// (3.3.8's libruby, the static build's separate debug file) and checks it
// against the built-in table for every field and size the walker reads;
// then that Open takes the DWARF layout and that the stacks are the same
// with the table forced. A Ruby without DWARF (Debian's, the static build
// without its debug file) must say builtin: and still give Ruby's own
// stacks, also when its symbols are ignored and the VM is found by
// scanning memory.
func TestRealDWARFMatchesTable(t *testing.T) {
	testutil.NeedRoot(t)
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		rb.SetProfilerEnv(t)
		builtin, err := layout.Builtin(rb.Version)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(builtin.Source, "nearest") {
			t.Logf("no exact table for %s: %s", rb.Version, builtin.Source)
		}
		fromTable, err := resolveOffsets(builtin)
		if err != nil {
			t.Fatal(err)
		}
		if rb.HasDWARF {
			raw, bin := rawDWARF(t, rb)
			t.Logf("%s: DWARF from %s (binary %s)", rb.Name, raw.Source, bin)
			if !rb.Shared && raw.Source == "dwarf:"+bin {
				t.Errorf("static build: DWARF read from the stripped executable itself")
			}
			fromDWARF, err := resolveOffsets(raw)
			if err != nil {
				t.Fatalf("walker offsets from DWARF alone: %v", err)
			}
			n := compareOffsets(t, fromDWARF, fromTable)
			t.Logf("%d walker fields and sizes equal in DWARF and %s", n, builtin.Source)
			if n < 40 {
				t.Errorf("only %d walker fields compared", n)
			}
		}

		proc := rb.Start(t, "stacks.rb", "nested")
		want := reports(t, proc)
		before := layout.DWARFExtractions()
		got, p := snapshotWith(t, proc.Pid, Options{})
		if p == nil {
			t.Fatal("open failed")
		}
		if rb.HasDWARF {
			// The private cache SetProfilerEnv gave this test was
			// empty: DWARF was read once, and a second Open reads
			// none, served by build id from the cache.
			if n := layout.DWARFExtractions() - before; n != 1 {
				t.Errorf("first open read DWARF %d times, want 1", n)
			}
			before = layout.DWARFExtractions()
			_, again := snapshotWith(t, proc.Pid, Options{})
			if again == nil || again.LayoutSource() != p.LayoutSource() {
				t.Fatalf("second open: %v", again)
			}
			if n := layout.DWARFExtractions() - before; n != 0 {
				t.Errorf("second open read DWARF %d times: the cache did not serve it", n)
			}
		}
		src := p.LayoutSource()
		if rb.HasDWARF != strings.HasPrefix(src, "dwarf:") {
			t.Errorf("layout source %q (DWARF available: %v)", src, rb.HasDWARF)
		}
		if !rb.HasDWARF && !strings.HasPrefix(src, "builtin:"+rb.Version) {
			t.Errorf("layout source %q, want builtin:%s", src, rb.Version)
		}
		checkWorker(t, "default layout", got, want)
		if !rb.Shared {
			// The static executable is stripped of .symtab and its
			// .dynsym exports no VM pointer: the VM is found by
			// scanning memory, the offsets come from the table (or
			// the debug file).
			ef, err := elf.Open(rb.Exe)
			if err != nil {
				t.Fatal(err)
			}
			syms, _ := ef.DynamicSymbols()
			ef.Close()
			for _, s := range syms {
				if s.Name == "ruby_current_vm_ptr" {
					t.Logf("%s exports ruby_current_vm_ptr in .dynsym: the memory scan is not exercised here", rb.Exe)
				}
			}
			for _, b := range p.Info().Binaries {
				if b.Path == rb.Exe && b.HasSymtab {
					t.Errorf("%s has a .symtab: the static build is meant to be stripped", rb.Exe)
				}
			}
			if src := p.Info().AddressSources["ruby_current_vm_ptr"]; src != "memory scan" {
				t.Errorf("ruby_current_vm_ptr from %q, want the memory scan", src)
			}
		}
		forced, pt := snapshotWith(t, proc.Pid, Options{NoDWARF: true})
		if pt == nil || !strings.HasPrefix(pt.LayoutSource(), "builtin:") {
			t.Fatalf("NoDWARF: %v", pt)
		}
		if !reflect.DeepEqual(got, forced) {
			t.Errorf("stacks differ between %s and %s:\n%v\n%v", src, pt.LayoutSource(), got, forced)
		}
		// Symbols ignored: the VM is found by scanning memory.
		scanned, ps := snapshotWith(t, proc.Pid, Options{NoSymbols: true, NoDWARF: !rb.HasDWARF})
		if ps == nil {
			t.Fatal("open without symbols failed")
		}
		if !reflect.DeepEqual(got, scanned) {
			t.Errorf("stacks differ when the VM is found by a memory scan:\n%v\n%v", got, scanned)
		}
	})
}

// TestStaticDebugFileLookups finds the static build's separate debug file
// the three ways rbscope looks: by build id under a debug root, and by
// .gnu_debuglink next to the executable and in .debug/ beside it (the
// CRC checked), each giving the same DWARF layout.
func TestStaticDebugFileLookups(t *testing.T) {
	var static *testutil.RubyUnderTest
	for _, rb := range testutil.Rubies(t) {
		if !rb.Shared && rb.HasDWARF {
			rb := rb
			static = &rb
		}
	}
	if static == nil {
		testutil.Missing(t, "the 3.3.8-static Ruby with its debug file (scripts/rubies.sh build 3.3.8-static)")
	}
	exe := static.Exe
	f, err := os.Open(exe)
	if err != nil {
		t.Fatal(err)
	}
	q, err := layout.QueryFromELF(f, exe, exe)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	if q.BuildID == "" || q.DebugLink == "" {
		t.Fatalf("static executable: build id %q, .gnu_debuglink %q: want both", q.BuildID, q.DebugLink)
	}
	if q.BuildID != testutil.FileBuildID(t, exe) {
		t.Fatalf("build id %s, debug/elf says %s", q.BuildID, testutil.FileBuildID(t, exe))
	}
	byID, tried := layout.FindDebugFile(q, []string{static.DebugRoot})
	if byID == "" {
		t.Fatalf("no debug file by build id under %s: %v", static.DebugRoot, tried)
	}
	if !strings.Contains(byID, filepath.Join(".build-id", q.BuildID[:2], q.BuildID[2:])) {
		t.Errorf("debug file %s is not the build-id path", byID)
	}
	want, err := layout.FromDWARFFile(byID, layout.NeededStructs(static.Version))
	if err != nil {
		t.Fatal(err)
	}

	// .gnu_debuglink: a copy of the executable with the debug file under
	// the linked name beside it, then in .debug/, and no debug root.
	for _, sub := range []string{"", ".debug"} {
		dir := t.TempDir()
		exeCopy := filepath.Join(dir, "ruby")
		copyTo(t, exe, exeCopy)
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			t.Fatal(err)
		}
		copyTo(t, byID, filepath.Join(dir, sub, q.DebugLink))
		cq := q
		cq.Path, cq.HostPath, cq.BuildID = exeCopy, exeCopy, ""
		got, tried := layout.FindDebugFile(cq, nil)
		if got != filepath.Join(dir, sub, q.DebugLink) {
			t.Fatalf("debuglink in %q: found %q, tried %v", sub, got, tried)
		}
		l, err := layout.FromDWARFFile(got, layout.NeededStructs(static.Version))
		if err != nil {
			t.Fatal(err)
		}
		l.Source = want.Source
		if !reflect.DeepEqual(l, want) {
			t.Errorf("layout through .gnu_debuglink differs from the one by build id")
		}
		// Any other file under that name fails the CRC check.
		copyTo(t, exe, filepath.Join(dir, sub, q.DebugLink))
		if got, tried := layout.FindDebugFile(cq, nil); got != "" {
			t.Errorf("a file with another CRC was accepted as the debug file: %s (%v)", got, tried)
		}
	}

	// Resolve, as the profiler calls it, with the debug root: the layout
	// comes from the build-id file.
	l, err := layout.Resolve([]layout.BinaryInfo{{Path: exe}}, static.Version,
		layout.ResolveOptions{DebugRoots: []string{static.DebugRoot}, NoCache: true})
	if err != nil || l.Source != "dwarf:"+byID {
		t.Errorf("Resolve: source %v, err %v; want dwarf:%s", l, err, byID)
	}
}

func copyTo(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o755); err != nil {
		t.Fatal(err)
	}
}

package layoutgen

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rbscope/rbscope/internal/layout"
	"github.com/rbscope/rbscope/internal/testutil"
)

// TestTablesMatchDWARF declares every struct of each built-in table in C
// with CSource, compiles it with gcc -g and checks that the DWARF reader
// gives back every field of the table: offset, size and bitfield. It
// checks the generator, the DWARF reader and the tables' internal
// consistency (fields inside their parents, bitfields decodable) at once.
func TestTablesMatchDWARF(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		testutil.Missing(t, "gcc not installed (scripts/install-deps.sh installs it)")
	}
	versions := layout.BuiltinVersions()
	if len(versions) < 100 {
		t.Fatalf("only %d built-in versions", len(versions))
	}
	dir := t.TempDir()
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			t.Parallel()
			tab, err := layout.Builtin(v)
			if err != nil {
				t.Fatal(err)
			}
			l := dwarfOf(t, dir, v, tab, "-gdwarf-5")
			compareWithTable(t, tab, l)
		})
	}
}

// TestTablesMatchDWARF4 repeats the check for one release with DWARF 4,
// whose bitfields use DW_AT_bit_offset.
func TestTablesMatchDWARF4(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		testutil.Missing(t, "gcc not installed (scripts/install-deps.sh installs it)")
	}
	for _, v := range []string{"2.3.0", "3.1.2"} {
		tab, err := layout.Builtin(v)
		if err != nil {
			t.Fatal(err)
		}
		compareWithTable(t, tab, dwarfOf(t, t.TempDir(), v, tab, "-gdwarf-4"))
	}
}

func dwarfOf(t *testing.T, dir, v string, tab *layout.Layout, flag string) *layout.Layout {
	t.Helper()
	src := filepath.Join(dir, v+flag+".c")
	obj := strings.TrimSuffix(src, ".c") + ".o"
	if err := os.WriteFile(src, []byte(CSource(tab, nil)), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("gcc", "-g", flag, "-c", "-o", obj, src).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	l, err := layout.FromDWARFFile(obj, tab.StructNames())
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func compareWithTable(t *testing.T, tab, l *layout.Layout) {
	t.Helper()
	n := 0
	for _, sname := range tab.StructNames() {
		ts := tab.Structs[sname]
		ds, ok := l.Structs[sname]
		if !ok {
			t.Errorf("%s: struct missing from DWARF", sname)
			continue
		}
		if ds.Size != ts.Size {
			t.Errorf("%s: size %d, table %d", sname, ds.Size, ts.Size)
		}
		for fname, tf := range ts.Fields {
			df, ok := ds.Fields[fname]
			if !ok {
				t.Errorf("%s.%s: missing from DWARF", sname, fname)
				continue
			}
			n++
			if df.Offset != tf.Offset || df.Size != tf.Size {
				t.Errorf("%s.%s: offset %d size %d, table %d %d", sname, fname, df.Offset, df.Size, tf.Offset, tf.Size)
			}
			if (df.Bitfield == nil) != (tf.Bitfield == nil) || (tf.Bitfield != nil && *df.Bitfield != *tf.Bitfield) {
				t.Errorf("%s.%s: bitfield %+v, table %+v", sname, fname, df.Bitfield, tf.Bitfield)
			}
		}
	}
	if n < 50 {
		t.Errorf("only %d fields compared", n)
	}
}

// TestDebugFileForSystemRuby makes a debug file for Debian's libruby
// (which ships none) from the 3.1.2 table, under a build-id root, and
// checks that Resolve finds it and reads the table's offsets from it: the
// setup of the walker's end-to-end DWARF test.
func TestDebugFileForSystemRuby(t *testing.T) {
	const lib = "/usr/lib/x86_64-linux-gnu/libruby-3.1.so.3.1"
	if _, err := os.Stat(lib); err != nil {
		testutil.Missing(t, "Debian's libruby 3.1 not installed (scripts/install-deps.sh installs ruby)")
	}
	if _, err := exec.LookPath("gcc"); err != nil {
		testutil.Missing(t, "gcc not installed (scripts/install-deps.sh installs it)")
	}
	f, err := os.Open(lib)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	q, err := layout.QueryFromELF(f, lib, lib)
	if err != nil {
		t.Fatal(err)
	}
	tab, err := layout.Builtin("3.1.2")
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	dbg := BuildIDPath(root, q.BuildID)
	if err := DebugFile(tab, nil, q.BuildID, dbg); err != nil {
		t.Fatal(err)
	}
	t.Setenv("RBSCOPE_DEBUG_ROOT", root)
	l, err := layout.Resolve([]layout.BinaryInfo{{Path: lib}}, "3.1.2", layout.ResolveOptions{NoCache: true})
	if err != nil {
		t.Fatal(err)
	}
	if l.Source != "dwarf:"+dbg {
		t.Fatalf("source %q, want dwarf:%s", l.Source, dbg)
	}
	compareWithTable(t, tab, l)
	for _, s := range tab.Structs {
		for name, fl := range s.Fields {
			if fl.Source != "" {
				t.Errorf("%s taken from %s, want DWARF", name, fl.Source)
			}
		}
	}
}

package layout

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rbscope/rbscope/internal/testutil"
)

func sharedLayouts(t *testing.T) string {
	t.Helper()
	return filepath.Join(testutil.SharedDir(t), "ruby-layouts", "x86_64")
}

// TestTablesMatchShared checks that the embedded copy of the layout tables
// is byte for byte the shared data, with no file missing or extra.
func TestTablesMatchShared(t *testing.T) {
	dir := sharedLayouts(t)
	shared, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil || len(shared) == 0 {
		t.Fatalf("no shared tables in %s: %v", dir, err)
	}
	ents, err := tables.ReadDir("tables/x86_64")
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != len(shared) {
		t.Errorf("embedded %d tables, shared has %d", len(ents), len(shared))
	}
	for _, f := range shared {
		want, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		got, err := tables.ReadFile("tables/x86_64/" + filepath.Base(f))
		if err != nil {
			t.Errorf("embedded copy lacks %s", filepath.Base(f))
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("embedded %s differs from the shared file", filepath.Base(f))
		}
	}
}

func TestBuiltinExactAndNearest(t *testing.T) {
	l, err := Builtin("3.1.2")
	if err != nil {
		t.Fatal(err)
	}
	if l.Source != "builtin:3.1.2" {
		t.Errorf("source %q", l.Source)
	}
	if off, err := l.Offset("rb_thread_struct", "ec"); err != nil || off != 40 {
		t.Errorf("3.1.2 rb_thread_struct.ec = %d, %v; the table says 40", off, err)
	}
	// A patch release newer than the tables: the newest of its series.
	l, err = Builtin("3.1.99")
	if err != nil {
		t.Fatal(err)
	}
	if l.RubyVersion != "3.1.7" || !strings.Contains(l.Source, "nearest to 3.1.99") {
		t.Errorf("3.1.99 -> %s (%s)", l.RubyVersion, l.Source)
	}
	// 1.9.x tables carry patchlevels; -p0 stands for the series.
	l, err = Builtin("1.9.3")
	if err != nil {
		t.Fatal(err)
	}
	if l.Source != "builtin:1.9.3" {
		t.Errorf("1.9.3 source %q", l.Source)
	}
	if _, err := Builtin("9.9.9"); err == nil || !strings.Contains(err.Error(), "DWARF") {
		t.Errorf("unknown series: %v (want an error saying what to do)", err)
	}
	st, _ := l.Structs["rb_thread_struct"]
	if st.Size == 0 {
		t.Error("1.9.3 has no rb_thread_struct size")
	}
}

func TestBitfieldDecode(t *testing.T) {
	l, err := Builtin("2.7.2")
	if err != nil {
		t.Fatal(err)
	}
	f, err := l.Field("rb_thread_struct", "status")
	if err != nil {
		t.Fatal(err)
	}
	if f.Bitfield == nil || f.Bitfield.BitWidth != 2 {
		t.Fatalf("2.7.2 status is not a 2-bit bitfield: %+v", f)
	}
	buf := make([]byte, 600)
	buf[f.Offset] = 0xfe // status bits 0-1 = 2, the others set
	v, err := f.Decode(buf)
	if err != nil || v != 2 {
		t.Errorf("decode = %d, %v; want 2", v, err)
	}
	if _, err := f.Decode(buf[:f.Offset]); err == nil {
		t.Error("decode of a short buffer succeeded")
	}
}

package layout_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/rbscope/rbscope/internal/layout"
	"github.com/rbscope/rbscope/internal/testutil"
)

// shapes is the C source of the dwarfstruct tests, whose structs they
// check against pahole and by hand.
var (
	shapes        = filepath.Join("..", "dwarfstruct", "testdata", "shapes.c")
	shapesStructs = []string{"RBasic", "RString", "rb_control_frame_struct", "rb_thread_struct",
		"rb_symbols_t", "rb_method_definition_struct", "matrix"}
)

// TestDwzMultifile checks DWARF that dwz -m split between two libraries
// and a supplementary file named by .gnu_debugaltlink: FromBinaryFile
// finds that file and reads from both exactly what the object compiled
// from the same source holds, and without it says where it looked.
func TestDwzMultifile(t *testing.T) {
	for _, tool := range []string{"dwz", "gcc"} {
		if _, err := exec.LookPath(tool); err != nil {
			testutil.Missing(t, "%s not installed (scripts/install-deps.sh installs it)", tool)
		}
	}
	dir := t.TempDir()
	src, err := os.ReadFile(shapes)
	if err != nil {
		t.Fatal(err)
	}
	// Units with the same types, so dwz has something to share.
	var objs []string
	for _, p := range []string{"a", "b", "c"} {
		c := filepath.Join(dir, p+".c")
		if err := os.WriteFile(c, []byte(regexp.MustCompile(`\bg_`).ReplaceAllString(string(src), p+"_")), 0o644); err != nil {
			t.Fatal(err)
		}
		obj := filepath.Join(dir, p+".o")
		mustRun(t, "gcc", "-g", "-fPIC", "-c", "-o", obj, c)
		objs = append(objs, obj)
	}
	link := func(name string, objs ...string) string {
		out := filepath.Join(dir, name)
		mustRun(t, "gcc", append([]string{"-shared", "-o", out}, objs...)...)
		return out
	}
	// The truth: the structs as the object holds them before dwz.
	want, err := layout.FromDWARFFile(objs[0], shapesStructs)
	if err != nil {
		t.Fatal(err)
	}
	if len(want.Structs) != len(shapesStructs) {
		t.Fatalf("%d of %d structs in %s", len(want.Structs), len(shapesStructs), objs[0])
	}
	s1, s2 := link("lib1.so", objs[0], objs[1]), link("lib2.so", objs[0], objs[2])
	common := filepath.Join(dir, "common.debug")
	mustRun(t, "dwz", "-m", common, "-M", common, s1, s2)
	// The main file alone lacks the shared types.
	if l, err := layout.FromDWARFFile(s1, shapesStructs); err == nil && len(l.Structs) == len(shapesStructs) {
		t.Fatal("dwz -m left every struct in the main file; the test shows nothing")
	}
	l, err := layout.FromBinaryFile(s1, shapesStructs, []string{t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if l.Source != "dwarf:"+s1 || l.Arch != "x86_64" {
		t.Errorf("source %q arch %q", l.Source, l.Arch)
	}
	if !reflect.DeepEqual(l.Structs, want.Structs) {
		t.Errorf("structs differ from the object's:\ngot  %+v\nwant %+v", l.Structs, want.Structs)
	}
	// Without the supplementary file, the error says where it looked.
	if err := os.Rename(common, common+".gone"); err != nil {
		t.Fatal(err)
	}
	_, err = layout.FromBinaryFile(s1, shapesStructs, []string{dir})
	if err == nil || !strings.Contains(err.Error(), "dwz file was not found: looked for "+common) {
		t.Errorf("error %v", err)
	}
}

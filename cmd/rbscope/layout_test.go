package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rbscope/rbscope/internal/layout"
	"github.com/rbscope/rbscope/internal/layout/layoutgen"
	"github.com/rbscope/rbscope/internal/testutil"
)

// runCLI runs rbscope in-process with args and returns its stdout.
func runCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	layoutFlags.structs, layoutFlags.debugRoots = nil, nil
	var out bytes.Buffer
	rootCmd.SetOut(&out)
	rootCmd.SetArgs(args)
	t.Cleanup(func() {
		rootCmd.SetOut(nil)
		rootCmd.SetArgs(nil)
		layoutFlags.structs, layoutFlags.debugRoots = nil, nil
	})
	err := rootCmd.Execute()
	return out.String(), err
}

func TestLayoutCommand(t *testing.T) {
	for _, tool := range []string{"gcc", "objcopy"} {
		if _, err := exec.LookPath(tool); err != nil {
			testutil.Missing(t, "%s (scripts/install-deps.sh installs it)", tool)
		}
	}
	dir := t.TempDir()
	obj := filepath.Join(dir, "shapes.o")
	if out, err := exec.Command("gcc", "-g", "-gz=zlib", "-c", "-o", obj, "../../internal/dwarfstruct/testdata/shapes.c").CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	out, err := runCLI(t, "layout", "--struct", "rb_thread_struct", "--struct", "RString", obj)
	if err != nil {
		t.Fatal(err)
	}
	var l layout.Layout
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		t.Fatalf("output is not a layout: %v\n%s", err, out)
	}
	if l.Source != "dwarf:"+obj || l.Arch != "x86_64" || len(l.Structs) != 2 {
		t.Errorf("source %q arch %q structs %v", l.Source, l.Arch, l.StructNames())
	}
	if f, err := l.Field("rb_thread_struct", "status"); err != nil || f.Offset != 36 || f.Bitfield == nil || *f.Bitfield != (layout.Bitfield{BitOffset: 0, BitWidth: 2}) {
		t.Errorf("status = %+v, %v", f, err)
	}
	if f, err := l.Field("RString", "as.heap.ptr"); err != nil || f.Offset != 24 || f.Size != 8 || f.Type != "char *" {
		t.Errorf("as.heap.ptr = %+v, %v", f, err)
	}
	if !strings.HasPrefix(out, "{\n  \"ruby_version\": \"\",\n  \"arch\": \"x86_64\",\n  \"source\": ") {
		t.Errorf("not in the schema's key order:\n%.200s", out)
	}

	// Stripped: the error says where it looked.
	so, stripped := filepath.Join(dir, "shapes.so"), filepath.Join(dir, "stripped.so")
	if out, err := exec.Command("gcc", "-shared", "-Wl,--build-id", "-o", so, obj).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	if out, err := exec.Command("objcopy", "--strip-debug", so, stripped).CombinedOutput(); err != nil {
		t.Fatalf("objcopy: %v\n%s", err, out)
	}
	root := filepath.Join(dir, "dbg")
	_, err = runCLI(t, "layout", "--debug-root", root, stripped)
	var ee exitError
	if err == nil || !errorsAs(err, &ee) || ee.code != 2 {
		t.Fatalf("stripped file: err %v, want exit code 2", err)
	}
	if !strings.Contains(err.Error(), stripped+": no DWARF and no debug file (looked for "+root+"/.build-id/") {
		t.Errorf("error %q does not say what is missing", err)
	}
}

func errorsAs(err error, ee *exitError) bool {
	e, ok := err.(exitError)
	if ok {
		*ee = e
	}
	return ok
}

// TestLayoutCommandDebugFile runs `rbscope layout` on Debian's libruby
// (no DWARF) with a debug file for its build id under --debug-root, made
// from its version's table by layoutgen: the output names the debug file and
// the Ruby version read from libruby.
func TestLayoutCommandDebugFile(t *testing.T) {
	rb := testutil.SystemRuby(t)
	lib := rb.LibRuby(t)
	if _, err := exec.LookPath("gcc"); err != nil {
		testutil.Missing(t, "gcc (scripts/install-deps.sh installs it)")
	}
	f, err := os.Open(lib)
	if err != nil {
		t.Fatal(err)
	}
	q, err := layout.QueryFromELF(f, lib, lib)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	tab, err := layout.Builtin(rb.Version)
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	dbg := layoutgen.BuildIDPath(root, q.BuildID)
	if err := layoutgen.DebugFile(tab, nil, q.BuildID, dbg); err != nil {
		t.Fatal(err)
	}
	out, err := runCLI(t, "layout", "--debug-root", root, "--struct", "rb_control_frame_struct", lib)
	if err != nil {
		t.Fatal(err)
	}
	var l layout.Layout
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if l.RubyVersion != rb.Version || l.Source != "dwarf:"+dbg {
		t.Errorf("ruby_version %q source %q", l.RubyVersion, l.Source)
	}
	if f, err := l.Field("rb_control_frame_struct", "iseq"); err != nil || f.Offset != 16 {
		t.Errorf("iseq = %+v %v", f, err)
	}
	if sz, _ := l.Size("rb_control_frame_struct"); sz != 64 {
		t.Errorf("rb_control_frame_struct size %d, want 64", sz)
	}
}

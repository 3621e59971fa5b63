package layout_test

import (
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rbscope/rbscope/internal/layout"
	"github.com/rbscope/rbscope/internal/layout/layoutgen"
	"github.com/rbscope/rbscope/internal/testutil"
)

// fakeRuby builds a shared library whose DWARF declares l's structs, the
// way a Ruby built with -g would, then splits it like a distribution:
// stripped library with a .gnu_debuglink, and the debug file. It returns
// the full library, the stripped one and the debug file.
func fakeRuby(t *testing.T, dir string, l *layout.Layout, extra ...string) (full, stripped, debug string) {
	t.Helper()
	for _, tool := range []string{"gcc", "objcopy"} {
		if _, err := exec.LookPath(tool); err != nil {
			testutil.Missing(t, "%s not installed (scripts/install-deps.sh installs it)", tool)
		}
	}
	src := filepath.Join(dir, "fake.c")
	if err := os.WriteFile(src, []byte(layoutgen.CSource(l, nil)), 0o644); err != nil {
		t.Fatal(err)
	}
	full = filepath.Join(dir, "libfake.so")
	stripped = filepath.Join(dir, "bin", "libfake.so")
	debug = filepath.Join(dir, "libfake.so.debug")
	if err := os.MkdirAll(filepath.Dir(stripped), 0o755); err != nil {
		t.Fatal(err)
	}
	mustRun(t, "gcc", append([]string{"-g", "-shared", "-fPIC", "-Wl,--build-id", "-o", full, src}, extra...)...)
	mustRun(t, "objcopy", "--only-keep-debug", full, debug)
	mustRun(t, "objcopy", "--strip-debug", "--add-gnu-debuglink="+debug, full, stripped)
	return full, stripped, debug
}

func mustRun(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func buildID(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	q, err := layout.QueryFromELF(f, path, path)
	if err != nil {
		t.Fatal(err)
	}
	if len(q.BuildID) != 40 {
		t.Fatalf("build id %q", q.BuildID)
	}
	return q.BuildID
}

func table(t *testing.T, v string) *layout.Layout {
	t.Helper()
	l, err := layout.Builtin(v)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestFindDebugFile(t *testing.T) {
	dir := t.TempDir()
	_, stripped, debug := fakeRuby(t, dir, table(t, "3.1.2"))
	f, err := os.Open(stripped)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	q, err := layout.QueryFromELF(f, "/usr/lib/libfake.so", stripped)
	if err != nil {
		t.Fatal(err)
	}
	if q.DebugLink != "libfake.so.debug" || q.DebugLinkCRC == 0 {
		t.Fatalf("debuglink %q %08x", q.DebugLink, q.DebugLinkCRC)
	}
	data, err := os.ReadFile(debug)
	if err != nil {
		t.Fatal(err)
	}
	put := func(p string, b []byte) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	root := filepath.Join(dir, "root")
	id := q.BuildID

	// Nothing anywhere: every place is listed.
	got, tried := layout.FindDebugFile(q, []string{root})
	if got != "" {
		t.Fatalf("found %s in an empty tree", got)
	}
	wantTried := []string{
		filepath.Join(root, ".build-id", id[:2], id[2:]+".debug"),
		filepath.Join(dir, "bin", "libfake.so.debug"),
		filepath.Join(dir, "bin", ".debug", "libfake.so.debug"),
		filepath.Join(root, "usr/lib", "libfake.so.debug"),
	}
	if strings.Join(tried, "|") != strings.Join(wantTried, "|") {
		t.Errorf("tried %q\nwant %q", tried, wantTried)
	}

	// By debuglink under <root>/<dir of Path>.
	put(filepath.Join(root, "usr/lib/libfake.so.debug"), data)
	if got, _ := layout.FindDebugFile(q, []string{root}); got != filepath.Join(root, "usr/lib/libfake.so.debug") {
		t.Errorf("debuglink under root: got %q", got)
	}
	// In .debug/ beside the binary, which comes first.
	put(filepath.Join(dir, "bin", ".debug", "libfake.so.debug"), data)
	if got, _ := layout.FindDebugFile(q, []string{root}); got != filepath.Join(dir, "bin", ".debug", "libfake.so.debug") {
		t.Errorf("debuglink in .debug/: got %q", got)
	}
	// A file with the right name but the wrong CRC is rejected.
	bad := append([]byte(nil), data...)
	bad[len(bad)-1] ^= 0xff
	put(filepath.Join(dir, "bin", "libfake.so.debug"), bad)
	got, tried = layout.FindDebugFile(q, []string{root})
	if got != filepath.Join(dir, "bin", ".debug", "libfake.so.debug") {
		t.Errorf("wrong-CRC file not skipped: got %q", got)
	}
	if !strings.Contains(strings.Join(tried, "|"), "libfake.so.debug (CRC ") {
		t.Errorf("CRC rejection not reported: %q", tried)
	}
	// By build id, which comes before any debuglink.
	bid := filepath.Join(root, ".build-id", id[:2], id[2:]+".debug")
	put(bid, data)
	if got, _ := layout.FindDebugFile(q, []string{root}); got != bid {
		t.Errorf("build id: got %q, want %q", got, bid)
	}
	// A build-id file of another build is rejected.
	q2 := q
	q2.BuildID = strings.Repeat("ab", 20)
	put(filepath.Join(root, ".build-id", "ab", strings.Repeat("ab", 19)+".debug"), data)
	_, tried = layout.FindDebugFile(q2, []string{root})
	if !strings.Contains(tried[0], "(build id "+id+")") {
		t.Errorf("mismatched build id not reported: %q", tried)
	}
}

func TestResolveFromDebugFile(t *testing.T) {
	dir := t.TempDir()
	tab := table(t, "3.1.2")
	// Drop a field and a struct from what the DWARF will hold, to see
	// them completed from the table.
	gen := &layout.Layout{Source: "test", Structs: map[string]layout.Struct{}}
	for name, s := range tab.Structs {
		if name == "RBasic" {
			continue
		}
		fs := map[string]layout.Field{}
		for k, v := range s.Fields {
			if name == "rb_thread_struct" && k == "name" {
				continue
			}
			fs[k] = v
		}
		gen.Structs[name] = layout.Struct{Size: s.Size, Align: s.Align, Fields: fs}
	}
	_, stripped, debug := fakeRuby(t, dir, gen)
	id := buildID(t, stripped)
	root := filepath.Join(dir, "root")
	bid := filepath.Join(root, ".build-id", id[:2], id[2:]+".debug")
	if err := os.MkdirAll(filepath.Dir(bid), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(debug, bid); err != nil {
		t.Fatal(err)
	}
	t.Setenv("RBSCOPE_DEBUG_ROOT", root)
	cache := filepath.Join(dir, "cache")
	// DebugRoots come first, then $RBSCOPE_DEBUG_ROOT, which has it.
	opts := layout.ResolveOptions{CacheDir: cache, DebugRoots: []string{filepath.Join(dir, "elsewhere")}}
	bins := []layout.BinaryInfo{{Path: "/usr/lib/libruby.so.3.1", HostPath: stripped}}

	l, err := layout.Resolve(bins, "3.1.2", opts)
	if err != nil {
		t.Fatal(err)
	}
	if l.Source != "dwarf:"+bid || l.RubyVersion != "3.1.2" {
		t.Fatalf("source %q version %q", l.Source, l.RubyVersion)
	}
	for sname, ts := range tab.Structs {
		for fname, tf := range ts.Fields {
			f, err := l.Field(sname, fname)
			if err != nil {
				t.Error(err)
				continue
			}
			if f.Offset != tf.Offset || f.Size != tf.Size {
				t.Errorf("%s.%s = %d+%d, table %d+%d", sname, fname, f.Offset, f.Size, tf.Offset, tf.Size)
			}
			fromTable := sname == "RBasic" || (sname == "rb_thread_struct" && fname == "name")
			if fromTable && f.Source != "builtin:3.1.2" {
				t.Errorf("%s.%s source %q, want builtin:3.1.2", sname, fname, f.Source)
			}
			if !fromTable && f.Source != "" {
				t.Errorf("%s.%s source %q, want the layout's (DWARF)", sname, fname, f.Source)
			}
		}
	}

	// Cached by build id: the next run reads no DWARF, even with the
	// debug file gone.
	cached := filepath.Join(cache, id+".json")
	if _, err := os.Stat(cached); err != nil {
		t.Fatalf("not cached: %v", err)
	}
	if err := os.Remove(bid); err != nil {
		t.Fatal(err)
	}
	before := layout.DWARFExtractions()
	l2, err := layout.Resolve(bins, "3.1.2", opts)
	if err != nil {
		t.Fatal(err)
	}
	if n := layout.DWARFExtractions() - before; n != 0 {
		t.Errorf("%d DWARF extractions with a warm cache", n)
	}
	if l2.Source != l.Source {
		t.Errorf("cached source %q, want %q", l2.Source, l.Source)
	}
	if f, _ := l2.Field("rb_control_frame_struct", "iseq"); f.Offset != 16 {
		t.Errorf("cached rb_control_frame_struct.iseq at %d", f.Offset)
	}

	// NoCache ignores it; without the debug file that means the table.
	l3, err := layout.Resolve(bins, "3.1.2", layout.ResolveOptions{CacheDir: cache, NoCache: true})
	if err != nil {
		t.Fatal(err)
	}
	if l3.Source != "builtin:3.1.2" {
		t.Errorf("NoCache source %q, want builtin:3.1.2", l3.Source)
	}

	// A corrupt cache file is ignored and rewritten.
	if err := os.WriteFile(cached, []byte(`{"format":1,"layout":{"structs":{"x":`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(bid), 0o755); err != nil {
		t.Fatal(err)
	}
	mustRun(t, "objcopy", "--only-keep-debug", filepath.Join(dir, "libfake.so"), bid)
	before = layout.DWARFExtractions()
	l4, err := layout.Resolve(bins, "3.1.2", opts)
	if err != nil {
		t.Fatal(err)
	}
	if l4.Source != "dwarf:"+bid || layout.DWARFExtractions()-before != 1 {
		t.Errorf("after corrupt cache: source %q, %d extractions", l4.Source, layout.DWARFExtractions()-before)
	}
	var cf struct {
		BuildID string         `json:"build_id"`
		Layout  *layout.Layout `json:"layout"`
	}
	data, _ := os.ReadFile(cached)
	if err := json.Unmarshal(data, &cf); err != nil || cf.BuildID != id || cf.Layout == nil {
		t.Errorf("cache not rewritten: %v %q", err, data[:min(len(data), 80)])
	}

	// NoDWARF: the table, whatever the binary.
	l5, err := layout.Resolve(bins, "3.1.2", layout.ResolveOptions{NoDWARF: true})
	if err != nil || l5.Source != "builtin:3.1.2" {
		t.Errorf("NoDWARF: %v %v", l5, err)
	}
}

func TestResolveOwnDWARFAndOrder(t *testing.T) {
	dir := t.TempDir()
	full, stripped, _ := fakeRuby(t, dir, table(t, "3.4.1"))
	opts := layout.ResolveOptions{DebugRoots: []string{}, NoCache: true}
	// The stripped library has no DWARF and its debug file is not next
	// to it; the executable (second) has DWARF in itself.
	l, err := layout.Resolve([]layout.BinaryInfo{
		{Path: "/lib/libruby.so", HostPath: stripped},
		{Path: "/usr/bin/ruby", HostPath: full},
	}, "3.4.1", opts)
	if err != nil {
		t.Fatal(err)
	}
	if l.Source != "dwarf:/usr/bin/ruby" {
		t.Errorf("source %q, want dwarf:/usr/bin/ruby", l.Source)
	}
	if f, err := l.Field("rb_thread_struct", "status"); err != nil || f.Offset != 240 || f.Bitfield == nil || f.Bitfield.BitWidth != 2 {
		t.Errorf("rb_thread_struct.status = %+v %v", f, err)
	}
	// Via Open instead of a path.
	l, err = layout.Resolve([]layout.BinaryInfo{{Path: "/usr/bin/ruby", Open: func() (io.ReaderAt, io.Closer, error) {
		f, err := os.Open(full)
		return f, f, err
	}}}, "3.4.1", opts)
	if err != nil || l.Source != "dwarf:/usr/bin/ruby" {
		t.Errorf("via Open: %v %v", l, err)
	}
}

func TestResolveSystemRubyFallsBack(t *testing.T) {
	const lib = "/usr/lib/x86_64-linux-gnu/libruby-3.1.so.3.1"
	if _, err := os.Stat(lib); err != nil {
		testutil.Missing(t, "Debian's libruby 3.1 not installed (scripts/install-deps.sh installs ruby)")
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
	if dbg, _ := layout.FindDebugFile(q, layout.DefaultDebugRoots()); dbg != "" {
		t.Skipf("libruby's debug symbols are installed (%s): no fallback to test", dbg)
	}
	empty := t.TempDir()
	l, err := layout.Resolve([]layout.BinaryInfo{{Path: lib}}, "3.1.2",
		layout.ResolveOptions{DebugRoots: []string{empty}, CacheDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if l.Source != "builtin:3.1.2" {
		t.Errorf("source %q, want builtin:3.1.2 (Debian's libruby has no DWARF)", l.Source)
	}
	// And the unknown-version error says what was tried.
	_, err = layout.Resolve([]layout.BinaryInfo{{Path: lib}}, "9.9.9", layout.ResolveOptions{DebugRoots: []string{empty}, NoCache: true})
	if err == nil || !strings.Contains(err.Error(), lib+": no DWARF and no debug file (looked for "+empty+"/.build-id/") {
		t.Errorf("error %v", err)
	}
}

// TestWantedStructsCoverTables checks that WantedStructs names every
// struct of every built-in table, so DWARF can replace any of them.
func TestWantedStructsCoverTables(t *testing.T) {
	want := map[string]bool{}
	for _, s := range layout.WantedStructs {
		want[s] = true
	}
	read := 0
	for _, v := range layout.BuiltinVersions() {
		l, err := layout.Builtin(v)
		if err != nil {
			t.Errorf("%s: %v", v, err)
			continue
		}
		read++
		for _, s := range l.StructNames() {
			if !want[s] {
				t.Errorf("%s: struct %s not in WantedStructs", v, s)
			}
		}
	}
	if read < 100 {
		t.Errorf("only %d tables read", read)
	}
	for _, s := range []string{"RClass", "rb_classext_struct", "rb_symbols_t", "st_table", "st_table_entry", "rb_native_thread", "rb_id_table", "succ_index_table", "succ_dict_block"} {
		if !want[s] {
			t.Errorf("%s not in WantedStructs", s)
		}
	}
}

// TestRealRubyHeaders compiles Ruby's own public headers (ruby-dev) with
// gcc -g and checks the structs they declare against the built-in table
// of the installed Ruby: real DWARF from real declarations, not from
// layoutgen.
func TestRealRubyHeaders(t *testing.T) {
	for _, tool := range []string{"gcc", "ruby"} {
		if _, err := exec.LookPath(tool); err != nil {
			testutil.Missing(t, "%s not installed (scripts/install-deps.sh installs it)", tool)
		}
	}
	out := mustRun(t, "ruby", "-e", `print RUBY_VERSION, "\n", RbConfig::CONFIG["rubyhdrdir"], "\n", RbConfig::CONFIG["rubyarchhdrdir"]`)
	parts := strings.Split(out, "\n")
	if len(parts) != 3 {
		t.Fatalf("ruby said %q", out)
	}
	version, hdr, archHdr := parts[0], parts[1], parts[2]
	if _, err := os.Stat(filepath.Join(hdr, "ruby.h")); err != nil {
		testutil.Missing(t, "Ruby headers not installed (%v; scripts/install-deps.sh installs ruby-dev)", err)
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "rh.c")
	if err := os.WriteFile(src, []byte("#include <ruby.h>\nstruct RString g_str; struct RArray g_ary; struct RBasic g_basic; st_table g_st;\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	obj := filepath.Join(dir, "rh.o")
	mustRun(t, "gcc", "-g", "-c", "-I"+hdr, "-I"+archHdr, "-o", obj, src)
	l, err := layout.FromDWARFFile(obj, layout.WantedStructs)
	if err != nil {
		t.Fatal(err)
	}
	tab := table(t, version)
	n := 0
	for _, s := range []string{"RBasic", "RString", "RArray"} {
		ts, ds := tab.Structs[s], l.Structs[s]
		if ds.Size != ts.Size || ds.Size == 0 {
			t.Errorf("%s: size %d, table %d", s, ds.Size, ts.Size)
		}
		for name, tf := range ts.Fields {
			df, ok := ds.Fields[name]
			if !ok || df.Offset != tf.Offset || df.Size != tf.Size {
				t.Errorf("%s.%s: DWARF %+v (present %v), table %d+%d", s, name, df, ok, tf.Offset, tf.Size)
			}
			n++
		}
	}
	if n < 20 {
		t.Errorf("only %d fields compared", n)
	}
	if !l.Has("st_table", "num_entries") {
		t.Errorf("st_table.num_entries missing: %v", l.Structs["st_table"])
	}
}

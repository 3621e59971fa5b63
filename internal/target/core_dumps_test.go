package target_test

import (
	"compress/gzip"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/rbscope/rbscope/internal/elfx"
	"github.com/rbscope/rbscope/internal/target"
	"github.com/rbscope/rbscope/internal/testutil"
)

// dumpManifest is ../shared/testdata/coredumps/manifest.json.
type dumpManifest struct {
	Dumps []struct {
		File              string `json:"file"`
		RubyVersion       string `json:"ruby_version"`
		CurrentThreadPtr  string `json:"current_thread_ptr_addr"`
		CurrentVMPtr      string `json:"ruby_current_vm_ptr_addr"`
		GlobalSymbolsAddr string `json:"ruby_global_symbols_addr"`
	} `json:"dumps"`
}

// coredumpDir returns the shared core dumps' directory (the repository
// root's ../shared/testdata/coredumps), skipping the test when absent.
func coredumpDir(t testing.TB) string {
	t.Helper()
	d := filepath.Join(testutil.RepoRoot(t), "..", "shared", "testdata", "coredumps")
	if _, err := os.Stat(filepath.Join(d, "manifest.json")); err != nil {
		testutil.Missing(t, "shared core dumps not available: %v", err)
	}
	return d
}

func loadManifest(t testing.TB) (string, dumpManifest) {
	dir := coredumpDir(t)
	b, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m dumpManifest
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("parse manifest: %v", err)
	}
	if len(m.Dumps) == 0 {
		t.Fatal("manifest lists no dumps")
	}
	return dir, m
}

func hexAddr(t testing.TB, s string) uint64 {
	t.Helper()
	if s == "" {
		return 0
	}
	v, err := strconv.ParseUint(strings.TrimPrefix(s, "0x"), 16, 64)
	if err != nil {
		t.Fatalf("bad address %q: %v", s, err)
	}
	return v
}

// rubyImage returns the mapping of file offset 0 of libruby, else of the
// executable, and whether the core holds it.
func rubyImage(t testing.TB, tg target.Target) (target.Mapping, bool) {
	maps, err := tg.Mappings()
	if err != nil {
		t.Fatal(err)
	}
	var exe *target.Mapping
	for i, m := range maps {
		if m.Offset != 0 {
			continue
		}
		if strings.Contains(filepath.Base(m.Path), "libruby") {
			return m, true
		}
		if m.Path == tg.Executable() && exe == nil {
			exe = &maps[i]
		}
	}
	if exe != nil {
		return *exe, true
	}
	return target.Mapping{}, false
}

// dynsymWant says what the dynamic symbol table found in each dump's
// memory holds. The dumps of Ruby < 2.7 hold no ELF header of the ruby
// executable (gcore left out its read-only first pages), so their symbols
// cannot be read from memory at all.
var dynsymWant = map[string]struct {
	noImage bool
	present []string // found, with the manifest's address where it gives one
	absent  []string
}{
	"1.9.3": {noImage: true},
	"2.1.6": {noImage: true},
	"2.4.0": {noImage: true},
	"2.5.0": {noImage: true},
	"2.7.2": {
		present: []string{"ruby_current_vm_ptr", "ruby_current_execution_context_ptr", "ruby_version", "ruby_description"},
		absent:  []string{"ruby_current_thread", "ruby_global_symbols", "ruby_current_ec"},
	},
	"3.0.0": {
		present: []string{"ruby_current_vm_ptr", "ruby_current_ec", "ruby_version", "ruby_description"},
		absent:  []string{"ruby_current_thread", "ruby_global_symbols", "ruby_current_execution_context_ptr"},
	},
	"3.1.0": {
		present: []string{"ruby_current_vm_ptr", "ruby_current_ec", "ruby_version", "ruby_description"},
		absent:  []string{"ruby_current_thread", "ruby_global_symbols", "ruby_current_execution_context_ptr"},
	},
	"3.3.0": {
		present: []string{"ruby_version", "ruby_description"},
		absent:  []string{"ruby_current_vm_ptr", "ruby_current_ec", "ruby_global_symbols", "ruby_current_execution_context_ptr"},
	},
}

func readPtr(t *testing.T, tg target.Target, addr uint64) uint64 {
	t.Helper()
	var b [8]byte
	if err := tg.ReadAt(b[:], addr); err != nil {
		t.Fatalf("read pointer at 0x%x: %v", addr, err)
	}
	return binary.LittleEndian.Uint64(b[:])
}

func readCString(t *testing.T, tg target.Target, addr uint64) string {
	t.Helper()
	b := make([]byte, 16)
	if err := tg.ReadAt(b, addr); err != nil {
		t.Fatalf("read string at 0x%x: %v", addr, err)
	}
	if i := strings.IndexByte(string(b), 0); i >= 0 {
		return string(b[:i])
	}
	return string(b)
}

func TestCoreDumps(t *testing.T) {
	dir, man := loadManifest(t)
	for _, d := range man.Dumps {
		t.Run(d.File, func(t *testing.T) {
			tg, err := target.OpenCore(filepath.Join(dir, d.File), target.CoreOptions{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if err := tg.Close(); err != nil {
					t.Error(err)
				}
			})

			threads, err := tg.Threads()
			if err != nil || len(threads) == 0 {
				t.Fatalf("Threads() = %v, %v; want some", threads, err)
			}
			mainFound := false
			for _, th := range threads {
				mainFound = mainFound || th.TID == tg.Pid()
				if th.Name != "ruby" {
					t.Errorf("thread %d name %q, want ruby", th.TID, th.Name)
				}
			}
			if tg.Pid() <= 0 || !mainFound {
				t.Errorf("pid %d is none of the threads %v", tg.Pid(), threads)
			}
			if !strings.HasSuffix(tg.Executable(), "/bin/ruby") {
				t.Errorf("Executable() = %q, want a .../bin/ruby", tg.Executable())
			}

			maps, err := tg.Mappings()
			if err != nil {
				t.Fatal(err)
			}
			sawRuby := false
			for i, m := range maps {
				if m.End <= m.Start || (i > 0 && m.Start < maps[i-1].End) {
					t.Fatalf("mapping %d %x-%x unsorted or overlapping", i, m.Start, m.End)
				}
				base := filepath.Base(m.Path)
				sawRuby = sawRuby || base == "ruby" || strings.HasPrefix(base, "libruby")
			}
			if !sawRuby {
				t.Errorf("no mapping of ruby or libruby in %d mappings", len(maps))
			}

			// The walker's starting point, and what it points to.
			hint := hexAddr(t, d.CurrentVMPtr)
			if hint == 0 {
				hint = hexAddr(t, d.CurrentThreadPtr)
			}
			p := readPtr(t, tg, hint)
			if p == 0 {
				t.Fatalf("pointer at hint 0x%x is 0", hint)
			}
			if q := readPtr(t, tg, p); q == 0 && p == 0 {
				t.Errorf("0x%x not readable", p)
			}
			if gs := hexAddr(t, d.GlobalSymbolsAddr); gs != 0 {
				readPtr(t, tg, gs)
			}

			want, ok := dynsymWant[d.RubyVersion]
			if !ok {
				t.Fatalf("no expectation for Ruby %s: add one to dynsymWant", d.RubyVersion)
			}
			img, ok := rubyImage(t, tg)
			if want.noImage {
				if ok {
					t.Errorf("found an ELF image %s at 0x%x; the expectation says the dump holds none", img.Path, img.Start)
				}
				return
			}
			if !ok {
				t.Fatal("no mapping of file offset 0 of libruby or the executable")
			}
			mi, err := elfx.ReadMemoryImage(tg, img.Start)
			if err != nil {
				t.Fatalf("ReadMemoryImage(%s at 0x%x): %v", img.Path, img.Start, err)
			}
			if mi.Bias != img.Start || len(mi.BuildID) != 40 || !strings.HasPrefix(mi.Soname, "libruby.so.") {
				t.Errorf("image bias 0x%x build id %q soname %q; want bias 0x%x, a SHA-1 build id, libruby.so.*",
					mi.Bias, mi.BuildID, mi.Soname, img.Start)
			}
			manifestAddr := map[string]uint64{
				"ruby_current_vm_ptr": hexAddr(t, d.CurrentVMPtr),
				"ruby_global_symbols": hexAddr(t, d.GlobalSymbolsAddr),
			}
			if d.RubyVersion == "2.7.2" {
				// rbspy's "current thread" of 2.7 is the execution context.
				manifestAddr["ruby_current_execution_context_ptr"] = hexAddr(t, d.CurrentThreadPtr)
			}
			for _, name := range want.present {
				s, ok := mi.Lookup(name)
				if !ok {
					t.Errorf("%s not in the dynamic symbols", name)
					continue
				}
				if a := manifestAddr[name]; a != 0 && s.Value != a {
					t.Errorf("%s = 0x%x, manifest says 0x%x", name, s.Value, a)
				}
				if name == "ruby_current_ec" && !s.TLS {
					t.Errorf("ruby_current_ec is not a TLS symbol")
				}
			}
			for _, name := range want.absent {
				if s, ok := mi.Lookup(name); ok {
					t.Errorf("%s found at 0x%x; the expectation says it is absent", name, s.Value)
				}
			}
			// ruby_version and ruby_description live in libruby's .rodata,
			// which gcore left out of every dump: reading them must fail
			// as unmapped (naming the file where NT_FILE lists the mapping),
			// not return bytes. The version is in the mapped file's path.
			for _, name := range []string{"ruby_version", "ruby_description"} {
				s, _ := mi.Lookup(name)
				var b [16]byte
				err := tg.ReadAt(b[:], s.Value)
				var unmapped target.UnmappedError
				if !errors.As(err, &unmapped) || unmapped.Addr != s.Value {
					t.Errorf("read %s at 0x%x: %v; want UnmappedError at that address", name, s.Value, err)
				}
				if d.RubyVersion == "3.3.0" && (err == nil || !strings.Contains(err.Error(), img.Path)) {
					t.Errorf("read %s: error %v does not name %s", name, err, img.Path)
				}
			}
			if !strings.Contains(img.Path, "/"+d.RubyVersion+"/") {
				t.Errorf("libruby path %s does not hold the version %s", img.Path, d.RubyVersion)
			}
		})
	}
}

// decompressDump writes the plain core of a shared dump to a test
// directory.
func decompressDump(t *testing.T, dir, file string) string {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, file))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), strings.TrimSuffix(file, ".gz"))
	out, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	if _, err := io.Copy(out, zr); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestCoreDumpSysRoot gives the 3.3.0 dump a sysroot holding a stand-in
// for libruby with known bytes where ruby_version is: the core reads them
// from there, at the file offset NT_FILE gives, once the stand-in's first
// page is the one the core holds.
func TestCoreDumpSysRoot(t *testing.T) {
	dir, _ := loadManifest(t)
	const file = "ruby-coredump-with-classes-3.3.0.gz"
	tg, err := target.OpenCore(filepath.Join(dir, file), target.CoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	img, _ := rubyImage(t, tg)
	mi, err := elfx.ReadMemoryImage(tg, img.Start)
	if err != nil {
		t.Fatal(err)
	}
	v, _ := mi.Lookup("ruby_version")
	firstPage := make([]byte, 4096)
	if err := tg.ReadAt(firstPage, img.Start); err != nil {
		t.Fatal(err)
	}
	maps, _ := tg.Mappings()
	var off int64 = -1
	for _, m := range maps {
		if m.Path == img.Path && m.Contains(v.Value) {
			off = int64(m.Offset + v.Value - m.Start)
		}
	}
	tg.Close()
	if off < 0 {
		t.Fatalf("ruby_version 0x%x is in no mapping of %s", v.Value, img.Path)
	}
	root := t.TempDir()
	p := filepath.Join(root, img.Path)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	stand, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	stand.WriteAt([]byte("3.3.0\x00"), off)
	stand.Truncate(off + 4096)

	// Without the first page the core holds, it is another file.
	tg, err = target.OpenCore(filepath.Join(dir, file), target.CoreOptions{SysRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	var b [8]byte
	if err := tg.ReadAt(b[:], v.Value); err == nil || !strings.Contains(err.Error(), "not the file the process mapped") {
		t.Errorf("read through a stand-in with another first page: %v", err)
	}
	tg.Close()

	stand.WriteAt(firstPage, 0)
	stand.Close()
	tg, err = target.OpenCore(filepath.Join(dir, file), target.CoreOptions{SysRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	if got := readCString(t, tg, v.Value); got != "3.3.0" {
		t.Errorf("ruby_version through the sysroot = %q, want 3.3.0", got)
	}
}

// TestCoreDumpTruncated cuts real dumps: 2.1.6 (notes before memory, as
// the kernel writes them) reads up to the cut; 3.1.0 (gcore writes its
// notes last) says it is truncated.
func TestCoreDumpTruncated(t *testing.T) {
	dir, man := loadManifest(t)
	hints := map[string]uint64{}
	for _, d := range man.Dumps {
		hints[d.File] = hexAddr(t, d.CurrentThreadPtr+d.CurrentVMPtr)
	}
	for _, file := range []string{"ruby-coredump-2.1.6.gz", "ruby-coredump-3.1.0.gz"} {
		plain := decompressDump(t, dir, file)
		full, err := target.OpenCore(plain, target.CoreOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var want [8]byte
		if err := full.ReadAt(want[:], hints[file]); err != nil {
			t.Fatal(err)
		}
		full.Close()
		st, _ := os.Stat(plain)
		opened := 0
		// Cut ever shorter: each cut keeps a prefix of the real dump.
		for _, cut := range []int64{st.Size() - 1, st.Size() / 3, 4096, 100, 64, 63, 3} {
			if err := os.Truncate(plain, cut); err != nil {
				t.Fatal(err)
			}
			tg, err := target.OpenCore(plain, target.CoreOptions{})
			if err != nil {
				if !strings.Contains(err.Error(), "truncated") && !strings.Contains(err.Error(), "not an ELF") {
					t.Errorf("%s cut at %d: %v; want a truncation error", file, cut, err)
				}
				continue
			}
			if strings.Contains(file, "3.1.0") && cut != st.Size()-1 {
				// (Its last bytes are section headers, which it does without.)
				t.Errorf("%s cut at %d opened without its notes", file, cut)
			}
			var got [8]byte
			err = tg.ReadAt(got[:], hints[file])
			var u target.UnmappedError
			if err != nil && !errors.As(err, &u) {
				t.Errorf("%s cut at %d: read hint: %v, want the bytes or UnmappedError", file, cut, err)
			}
			if err == nil && got != want {
				t.Errorf("%s cut at %d: hint reads %x, uncut %x", file, cut, got, want)
			}
			if cut == st.Size()/3 {
				// The stack is in the last third of the 2.1.6 dump.
				regs, _ := tg.(target.CoreInfo).Registers(tg.Pid())
				if err := tg.ReadAt(got[:], regs.Rsp); !errors.As(err, &u) || !strings.Contains(err.Error(), "truncated") {
					t.Errorf("%s cut at %d: stack read: %v, want UnmappedError saying truncated", file, cut, err)
				}
			}
			opened++
			tg.Close()
		}
		if strings.Contains(file, "2.1.6") && opened != 2 {
			t.Errorf("%s: %d cuts opened, want 2 (a third and all but one byte)", file, opened)
		}
	}
}

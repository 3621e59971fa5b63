package target

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/testutil"
)

func openTiny(t *testing.T, tc tinyCore, opts CoreOptions) Target {
	t.Helper()
	tg, err := OpenCore(writeTiny(t, tc.bytes()), opts)
	if err != nil {
		t.Fatalf("OpenCore: %v", err)
	}
	t.Cleanup(func() {
		if err := tg.Close(); err != nil {
			t.Error(err)
		}
	})
	return tg
}

func checkPattern(t *testing.T, tg Target, addr uint64, n int) {
	t.Helper()
	b := make([]byte, n)
	if err := tg.ReadAt(b, addr); err != nil {
		t.Fatalf("ReadAt(%d bytes at 0x%x): %v", n, addr, err)
	}
	for i := range b {
		if b[i] != tinyByte(addr+uint64(i)) {
			t.Fatalf("byte at 0x%x = %#x, want %#x", addr+uint64(i), b[i], tinyByte(addr+uint64(i)))
		}
	}
}

func wantUnmapped(t *testing.T, err error, addr uint64, msg string) {
	t.Helper()
	var u UnmappedError
	if !errors.As(err, &u) {
		t.Fatalf("error %v, want UnmappedError", err)
	}
	if u.Addr != addr {
		t.Errorf("UnmappedError at 0x%x, want 0x%x", u.Addr, addr)
	}
	if !strings.Contains(err.Error(), msg) {
		t.Errorf("error %q does not say %q", err, msg)
	}
}

func TestCoreTinyProcess(t *testing.T) {
	for _, xnum := range []bool{false, true} {
		tc := defaultTinyCore()
		tc.xnum = xnum
		tg := openTiny(t, tc, CoreOptions{SysRoot: tinySysroot(t)})
		if tg.Pid() != 4242 {
			t.Errorf("Pid() = %d, want 4242", tg.Pid())
		}
		if tg.Executable() != tinyExe {
			t.Errorf("Executable() = %q, want %q", tg.Executable(), tinyExe)
		}
		threads, err := tg.Threads()
		want := []Thread{{TID: 4242, Name: "ruby"}, {TID: 4243, Name: "ruby"}}
		if err != nil || !reflect.DeepEqual(threads, want) {
			t.Errorf("Threads() = %v, %v; want %v", threads, err, want)
		}
		ci := tg.(CoreInfo)
		if r, ok := ci.Registers(4243); !ok || r.Rsp != 0x7ffc00001000 || r.Rip != 0x401234 || r.Fs_base != 0x7f0000005000+4243 {
			t.Errorf("Registers(4243) = %+v, %v", r, ok)
		}
		if _, ok := ci.Registers(1); ok {
			t.Error("Registers(1) found a thread the core does not have")
		}
		if ci.Args() != "ruby app.rb" || ci.Auxv()[atEntry] != 0x401000 {
			t.Errorf("Args() = %q, Auxv()[AT_ENTRY] = 0x%x", ci.Args(), ci.Auxv()[atEntry])
		}
		maps, err := tg.Mappings()
		wantMaps := []Mapping{
			{Start: 0x400000, End: 0x401000, Perms: "r--p", Path: tinyExe},
			{Start: 0x401000, End: 0x402000, Offset: 0x1000, Perms: "r-xp", Path: tinyExe}, // from the file's headers
			{Start: tinyLibBase, End: tinyLibBase + 0x2000, Perms: "r-xp", Path: tinyLib},
			{Start: tinyLibBase + 0x2000, End: tinyLibBase + 0x3000, Perms: "rw-p"},
			{Start: tinyLibBase + 0x3000, End: tinyLibBase + 0x4000, Perms: "rw-p"},
			{Start: 0x7ffc00000000, End: 0x7ffc00002000, Perms: "rw-p", Path: "[stack]"},
			{Start: tinyVDSO, End: tinyVDSO + 0x1000, Perms: "r-xp", Path: "[vdso]"},
		}
		if err != nil || !reflect.DeepEqual(maps, wantMaps) {
			t.Errorf("Mappings() = %+v, %v;\nwant %+v", maps, err, wantMaps)
		}
	}
}

func TestCoreTinyReads(t *testing.T) {
	tg := openTiny(t, defaultTinyCore(), CoreOptions{SysRoot: tinySysroot(t)})
	// Core segment, then the library's page only on disk, then two
	// adjacent anonymous segments: one read.
	checkPattern(t, tg, tinyLibBase+0x10, 0x4000-0x10)
	// From the executable's page in the core into its page only on disk.
	checkPattern(t, tg, 0x400ff0, 0x20)
	checkPattern(t, tg, 0x401ff8, 8)
	checkPattern(t, tg, tinyVDSO, 0x1000)

	var b [16]byte
	wantUnmapped(t, tg.ReadAt(b[:], 0x500000), 0x500000, "not mapped")
	wantUnmapped(t, tg.ReadAt(b[:], tinyLibBase+0x3ff8), tinyLibBase+0x4000, "not mapped")
	wantUnmapped(t, tg.ReadAt(b[:], 0x401ff8), 0x402000, "not mapped")
	wantUnmapped(t, tg.ReadAt(b[:], ^uint64(0)-4), ^uint64(0)-4, "not mapped")
	if err := tg.ReadAt(nil, 0x500000); err != nil {
		t.Errorf("empty read: %v", err)
	}

	reqs := []Read{{Addr: 0x400100, Buf: make([]byte, 8)}, {Addr: tinyLibBase + 0x1800, Buf: make([]byte, 64)}}
	if err := tg.ReadBatch(reqs); err != nil {
		t.Fatal(err)
	}
	for _, r := range reqs {
		for i, c := range r.Buf {
			if c != tinyByte(r.Addr+uint64(i)) {
				t.Fatalf("ReadBatch byte at 0x%x wrong", r.Addr+uint64(i))
			}
		}
	}
	reqs = append(reqs, Read{Addr: 0x10, Buf: make([]byte, 1)})
	wantUnmapped(t, tg.ReadBatch(reqs), 0x10, "not mapped")
}

func TestCoreMappedFiles(t *testing.T) {
	empty := t.TempDir()
	tg := openTiny(t, defaultTinyCore(), CoreOptions{SysRoot: empty})
	var b [8]byte
	// Pages held in the core read without the files.
	checkPattern(t, tg, tinyLibBase, 0x1000)
	wantUnmapped(t, tg.ReadAt(b[:], tinyLibBase+0x1000), tinyLibBase+0x1000, tinyLib)
	wantUnmapped(t, tg.ReadAt(b[:], 0x401000), 0x401000, tinyExe)
	if _, err := tg.OpenFile(tinyLib); err == nil || !strings.Contains(err.Error(), filepath.Join(empty, tinyLib)) {
		t.Errorf("OpenFile(%s) = %v, want an error naming where it looked", tinyLib, err)
	}

	// --exe stands in for the executable, under its original name.
	root := tinySysroot(t)
	exe := filepath.Join(root, tinyExe)
	tg = openTiny(t, defaultTinyCore(), CoreOptions{SysRoot: empty, Exe: exe})
	if tg.Executable() != tinyExe {
		t.Errorf("Executable() = %q, want the core's %q", tg.Executable(), tinyExe)
	}
	checkPattern(t, tg, 0x400ff0, 0x1010)
	f, err := tg.OpenFile(tinyExe)
	if err != nil {
		t.Fatal(err)
	}
	if f.Size() != 0x2000 {
		t.Errorf("OpenFile(exe).Size() = %d, want 0x2000", f.Size())
	}
	f.Close()

	// A file shorter here than the mapping says.
	short := t.TempDir()
	p := filepath.Join(short, tinyLib)
	os.MkdirAll(filepath.Dir(p), 0o755)
	lib := make([]byte, 0x1004)
	fillPattern(lib, tinyLibBase)
	os.WriteFile(p, lib, 0o644)
	tg = openTiny(t, defaultTinyCore(), CoreOptions{SysRoot: short})
	wantUnmapped(t, tg.ReadAt(b[:], tinyLibBase+0x1000), tinyLibBase+0x1000, "beyond the end")

	// Another build of the library: its first page is not the core's.
	other := t.TempDir()
	p = filepath.Join(other, tinyLib)
	os.MkdirAll(filepath.Dir(p), 0o755)
	lib = make([]byte, 0x2000)
	fillPattern(lib, tinyLibBase)
	lib[100]++
	os.WriteFile(p, lib, 0o644)
	tg = openTiny(t, defaultTinyCore(), CoreOptions{SysRoot: other})
	wantUnmapped(t, tg.ReadAt(b[:], tinyLibBase+0x1000), tinyLibBase+0x1000, "not the file the process mapped")
	checkPattern(t, tg, tinyLibBase, 0x1000) // what the core holds still reads
	// And a wrong --exe.
	tg = openTiny(t, defaultTinyCore(), CoreOptions{SysRoot: root, Exe: filepath.Join(root, tinyLib)})
	wantUnmapped(t, tg.ReadAt(b[:], 0x401000), 0x401000, "not the file the process mapped")
	if _, err := tg.OpenFile(tinyExe); err == nil || !strings.Contains(err.Error(), "not the file the process mapped") {
		t.Errorf("OpenFile(exe) with a wrong --exe: %v", err)
	}
}

func TestCoreExecutableFallbacks(t *testing.T) {
	// Without AT_PHDR/AT_ENTRY in a mapped file: AT_EXECFN names it.
	tc := defaultTinyCore()
	tc.auxv = [][2]uint64{{atExecfn, tinyExecfn}}
	if got := openTiny(t, tc, CoreOptions{}).Executable(); got != tinyExe {
		t.Errorf("by AT_EXECFN: %q, want %q", got, tinyExe)
	}
	// No auxv at all: the mapped file named like the process.
	tc.auxv = nil
	tc.name = "ruby"
	if got := openTiny(t, tc, CoreOptions{}).Executable(); got != tinyExe {
		t.Errorf("by process name: %q, want %q", got, tinyExe)
	}
	// Nothing to go on: --exe.
	tc.name = "other"
	if got := openTiny(t, tc, CoreOptions{Exe: "/x/ruby"}).Executable(); got != "/x/ruby" {
		t.Errorf("by --exe: %q, want /x/ruby", got)
	}
}

func TestCoreGzip(t *testing.T) {
	raw := defaultTinyCore().bytes()
	var z bytes.Buffer
	zw := gzip.NewWriter(&z)
	zw.Write(raw)
	zw.Close()
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	root := tinySysroot(t)

	tg, err := OpenCore(writeTiny(t, z.Bytes()), CoreOptions{SysRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(tmp); len(ents) != 0 {
		t.Errorf("decompressed core left %d files in TMPDIR", len(ents))
	}
	checkPattern(t, tg, tinyLibBase, 0x4000)
	plain := openTiny(t, defaultTinyCore(), CoreOptions{SysRoot: root})
	m1, _ := tg.Mappings()
	m2, _ := plain.Mappings()
	if !reflect.DeepEqual(m1, m2) {
		t.Errorf("gzip'd core's mappings differ from the plain core's")
	}
	tg.Close()

	if _, err := OpenCore(writeTiny(t, z.Bytes()), CoreOptions{MaxDecompressed: int64(len(raw) - 1)}); err == nil ||
		!strings.Contains(err.Error(), "decompresses to more than") || !strings.Contains(err.Error(), "gzip -dk ") {
		t.Errorf("over the cap: %v, want an error saying so and how to decompress it", err)
	}
	if tg, err := OpenCore(writeTiny(t, z.Bytes()), CoreOptions{MaxDecompressed: int64(len(raw))}); err != nil {
		t.Errorf("exactly at the cap: %v", err)
	} else {
		tg.Close()
	}
	// A gzip stream cut short: the bytes it held are a (partial) core.
	cut := z.Bytes()[:z.Len()*3/4]
	if tg, err := OpenCore(writeTiny(t, cut), CoreOptions{}); err == nil {
		tg.Close()
	} else if !strings.Contains(err.Error(), "truncated") {
		t.Errorf("cut gzip: %v, want a partial core or a truncation error", err)
	}
	if _, err := OpenCore(writeTiny(t, []byte{0x1f, 0x8b, 8, 0, 1, 2}), CoreOptions{}); err == nil {
		t.Error("damaged gzip header opened")
	}
}

func TestCoreBadInput(t *testing.T) {
	good := defaultTinyCore().bytes()
	patch := func(f func(b []byte)) []byte {
		b := append([]byte(nil), good...)
		f(b)
		return b
	}
	le := binary.LittleEndian
	exe, _ := os.Executable() // this test binary: an ELF executable
	exeBytes, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, "not an ELF core file"},
		{"text", []byte("hello, this is not a core\n"), "not an ELF core file"},
		{"zeroed header", patch(func(b []byte) { clear(b[:64]) }), "not an ELF core file"},
		{"header cut", good[:40], "ELF header is incomplete"},
		{"executable", exeBytes, "not a core file"},
		{"32-bit", patch(func(b []byte) { b[4] = 1 }), "x86_64 cores only"},
		{"big-endian", patch(func(b []byte) { b[5] = 2 }), "x86_64 cores only"},
		{"arm64", patch(func(b []byte) { le.PutUint16(b[18:], 183) }), "not x86_64"},
		{"no program headers", patch(func(b []byte) { le.PutUint16(b[56:], 0) }), "no program headers"},
		{"phentsize", patch(func(b []byte) { le.PutUint16(b[54:], 32) }), "program headers of 32 bytes"},
		{"phnum past EOF", patch(func(b []byte) { le.PutUint16(b[56:], 0xfffe) }), "truncated"},
		{"phoff past EOF", patch(func(b []byte) { le.PutUint64(b[32:], 1<<62) }), "truncated"},
		{"xnum past EOF", patch(func(b []byte) { le.PutUint16(b[56:], pnXNum); le.PutUint64(b[40:], 1<<40) }), "truncated"},
		{"zeroed program headers", patch(func(b []byte) { clear(b[64 : 64+7*progHeaderLen]) }), "no notes"},
		{"notes past EOF", patch(func(b []byte) { le.PutUint64(b[64+32:], 1<<20) }), "truncated"},
		{"note past its segment", patch(func(b []byte) { le.PutUint32(b[64+7*progHeaderLen+4:], 1<<30) }), "past the end of its segment"},
		{"segment wraps", patch(func(b []byte) { le.PutUint64(b[64+progHeaderLen+16:], ^uint64(0)-10) }), "wraps around"},
	}
	// NT_FILE claiming more files than it holds.
	nf := bytes.Index(good, append(le.AppendUint32(nil, ntFile), "CORE\x00\x00\x00\x00"...))
	if nf < 0 {
		t.Fatal("NT_FILE not found in the tiny core")
	}
	nf += 4
	cases = append(cases, struct {
		name string
		data []byte
		want string
	}{"NT_FILE count", patch(func(b []byte) { le.PutUint64(b[nf+8:], 1<<40) }), "lists 1099511627776 files"})
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tg, err := OpenCore(writeTiny(t, c.data), CoreOptions{})
			if err == nil {
				tg.Close()
				t.Fatalf("opened; want an error saying %q", c.want)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not say %q", err, c.want)
			}
		})
	}
	if _, err := OpenCore(filepath.Join(t.TempDir(), "missing"), CoreOptions{}); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing core: %v, want ErrNotExist", err)
	}
}

// TestCoreTruncated cuts the tiny core at many points: no cut panics;
// cuts in the headers or notes are errors; cuts in the memory leave what
// is before the cut readable and the rest UnmappedError.
func TestCoreTruncated(t *testing.T) {
	tc := defaultTinyCore()
	good := tc.bytes()
	dataOff := uint64(len(good))
	for _, s := range tc.segs {
		dataOff -= s.filesz
	}
	root := tinySysroot(t)
	dir := t.TempDir()
	for cut := 0; cut < len(good); cut += 1 + cut/64 {
		p := filepath.Join(dir, "cut")
		if err := os.WriteFile(p, good[:cut], 0o600); err != nil {
			t.Fatal(err)
		}
		tg, err := OpenCore(p, CoreOptions{SysRoot: root})
		if uint64(cut) < dataOff {
			if err == nil {
				tg.Close()
				t.Fatalf("cut at %d (in headers/notes) opened", cut)
			}
			continue
		}
		if err != nil {
			t.Fatalf("cut at %d (in memory): %v", cut, err)
		}
		off := dataOff
		for _, s := range tc.segs {
			present := min(s.filesz, uint64(max(0, int64(cut)-int64(off))))
			if n := present; n > 0 {
				if s.vaddr+n > tinyExecfn && s.vaddr <= tinyExecfn {
					n = tinyExecfn - s.vaddr // AT_EXECFN's string is not the pattern
				}
				checkPattern(t, tg, s.vaddr, int(n))
			}
			if present < s.filesz {
				var b [1]byte
				wantUnmapped(t, tg.ReadAt(b[:], s.vaddr+present), s.vaddr+present, "truncated")
			}
			off += s.filesz
		}
		tg.Close()
	}
}

// TestCoreMappedPathsStayInSysRoot: paths from the core that climb out of
// the sysroot or name devices are not opened there.
func TestCoreMappedPathsStayInSysRoot(t *testing.T) {
	tc := defaultTinyCore()
	tc.files[2].path = "/../../../../../../dev/zero"
	root := t.TempDir()
	tg := openTiny(t, tc, CoreOptions{SysRoot: root})
	var b [8]byte
	wantUnmapped(t, tg.ReadAt(b[:], tinyLibBase+0x1000), tinyLibBase+0x1000, filepath.Join(root, "dev/zero"))
	tg = openTiny(t, tc, CoreOptions{SysRoot: "/"})
	wantUnmapped(t, tg.ReadAt(b[:], tinyLibBase+0x1000), tinyLibBase+0x1000, "not a regular file")
	if _, err := tg.OpenFile("/dev/zero"); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("OpenFile(/dev/zero) = %v, want not a regular file", err)
	}
}

// TestCoreConcurrentReads reads from several goroutines at once, through
// the core and the mapped files (run with -race).
func TestCoreConcurrentReads(t *testing.T) {
	tg := openTiny(t, defaultTinyCore(), CoreOptions{SysRoot: tinySysroot(t)})
	errs := make(chan error, 8)
	for g := 0; g < 8; g++ {
		go func(g int) {
			b := make([]byte, 256)
			for i := 0; i < 200; i++ {
				addr := tinyLibBase + uint64((g*977+i*131)%(0x4000-256))
				if err := tg.ReadAt(b, addr); err != nil {
					errs <- err
					return
				}
				for k := range b {
					if b[k] != pattern(addr+uint64(k)) {
						errs <- fmt.Errorf("wrong byte at 0x%x", addr+uint64(k))
						return
					}
				}
			}
			errs <- nil
		}(g)
	}
	for g := 0; g < 8; g++ {
		if err := <-errs; err != nil {
			t.Fatalf("concurrent read: %v", err)
		}
	}
}

// TestCoreCompressed compresses the tiny core with the real tools: zstd
// (systemd-coredump's format), xz and lz4 (its formats before zstd) and
// bzip2 read like the plain core; over the size cap they are refused
// with the command that decompresses them; cut short they read as
// partial cores or say truncated.
func TestCoreCompressed(t *testing.T) {
	raw := defaultTinyCore().bytes()
	plainPath := writeTiny(t, raw)
	root := tinySysroot(t)
	plain := openTiny(t, defaultTinyCore(), CoreOptions{SysRoot: root})
	want, _ := plain.Mappings()
	for _, c := range compressors {
		t.Run(c.tool, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "core"+c.suffix)
			if err := os.WriteFile(out, compressWith(t, c.tool, raw), 0o600); err != nil {
				t.Fatal(err)
			}
			tg, err := OpenCore(out, CoreOptions{SysRoot: root})
			if err != nil {
				t.Fatal(err)
			}
			defer tg.Close()
			if got, _ := tg.Mappings(); !reflect.DeepEqual(got, want) {
				t.Errorf("mappings differ from the plain core's")
			}
			checkPattern(t, tg, tinyLibBase, 0x4000)
			if _, err := OpenCore(out, CoreOptions{MaxDecompressed: int64(len(raw) / 2)}); err == nil ||
				!strings.Contains(err.Error(), "decompresses to more than") || !strings.Contains(err.Error(), " -d") ||
				strings.Contains(err.Error(), "MaxDecompressed") {
				t.Errorf("over the cap: %v; want it said for a person, with the command that decompresses it", err)
			}
			// Cut short.
			b, _ := os.ReadFile(out)
			cut := filepath.Join(t.TempDir(), "cut"+c.suffix)
			os.WriteFile(cut, b[:len(b)*2/3], 0o600)
			if tg, err := OpenCore(cut, CoreOptions{}); err == nil {
				tg.Close()
			} else if !strings.Contains(err.Error(), c.kind+"-compressed core "+cut+" is truncated") {
				t.Errorf("cut %s: %v", c.tool, err)
			}
		})
	}
	_ = plainPath
}

// compressors are the compressions OpenCore reads, with the tool that
// makes each and its usual suffix.
var compressors = []struct{ tool, kind, suffix string }{
	{"gzip", "gzip", ".gz"}, {"zstd", "zstd", ".zst"}, {"xz", "xz", ".xz"}, {"bzip2", "bzip2", ".bz2"}, {"lz4", "lz4", ".lz4"},
}

// compressWith compresses data with the real tool (gzip, zstd, xz, bzip2,
// lz4), as a person or systemd-coredump would.
func compressWith(t testing.TB, tool string, data []byte) []byte {
	t.Helper()
	if _, err := exec.LookPath(tool); err != nil {
		testutil.Missing(t, "%s not installed (scripts/install-deps.sh installs it): %v", tool, err)
	}
	cmd := exec.Command(tool, "-c")
	cmd.Stdin = bytes.NewReader(data)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	return out
}

// TestCompressedNotACore: a compressed file whose first bytes are not an
// x86_64 core's ELF header (16 MiB of zeros, an ELF executable) is
// refused once they are decompressed, saying what it holds, before
// anything is written: TMPDIR names a missing directory, where writing
// would fail with another error. No time is measured.
func TestCompressedNotACore(t *testing.T) {
	zeros := make([]byte, 16<<20)
	exe, err := os.ReadFile("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	type files struct{ zeros, exe string }
	cores := map[string]files{}
	for _, c := range compressors {
		cores[c.tool] = files{write("zeros"+c.suffix, compressWith(t, c.tool, zeros)),
			write("exe"+c.suffix, compressWith(t, c.tool, exe[:1<<20]))}
	}
	t.Setenv("TMPDIR", filepath.Join(dir, "missing"))
	for _, c := range compressors {
		t.Run(c.tool, func(t *testing.T) {
			p := cores[c.tool].zeros
			progress := 0
			_, err := OpenCore(p, CoreOptions{ProgressEvery: time.Nanosecond,
				Progress: func(DecompressProgress) { progress++ }})
			want := p + " is " + c.kind + "-compressed, but what it holds is not an ELF core file (it starts with 00 00 00 00"
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("zeros: %v; want %q", err, want)
			}
			if progress != 0 {
				t.Errorf("progress shown %d times for a refused core", progress)
			}
			if _, err := OpenCore(cores[c.tool].exe, CoreOptions{}); err == nil || !strings.Contains(err.Error(), "not a core file") {
				t.Errorf("an executable: %v; want not a core file", err)
			}
		})
	}
}

// TestCompressedCorrupt: random bytes after a compression's magic are
// called corrupt (never "exceeds configured limit", nor a Go option's
// name), whatever the decoder complains of.
func TestCompressedCorrupt(t *testing.T) {
	magics := map[string][]byte{
		"zstd": {0x28, 0xb5, 0x2f, 0xfd}, "gzip": {0x1f, 0x8b}, "xz": {0xfd, '7', 'z', 'X', 'Z', 0},
		"bzip2": []byte("BZh9"), "lz4": {0x04, 0x22, 0x4d, 0x18},
	}
	rng := rand.New(rand.NewPCG(29, 5))
	for kind, magic := range magics {
		for i := 0; i < 50; i++ {
			b := append(slices.Clone(magic), make([]byte, 4096)...)
			for j := len(magic); j < len(b); j++ {
				b[j] = byte(rng.Uint32())
			}
			p := writeTiny(t, b)
			_, err := OpenCore(p, CoreOptions{})
			if err == nil || !strings.Contains(err.Error(), "the "+kind+"-compressed core "+p+" is corrupt") ||
				strings.Contains(err.Error(), "Options") || strings.Contains(err.Error(), "configured limit") {
				t.Errorf("%s, random bytes #%d (% x...): %v; want corrupt", kind, i, b[:8], err)
			}
		}
	}
}

// TestDecompressProgress: a decompression that takes longer than
// ProgressEvery (here at once) is reported on the way and once at its
// end, with the bytes of core and of compressed file so far.
func TestDecompressProgress(t *testing.T) {
	raw := defaultTinyCore().bytes()
	z := compressWith(t, "zstd", raw)
	p := writeTiny(t, z)
	var got []DecompressProgress
	tg, err := OpenCore(p, CoreOptions{SysRoot: tinySysroot(t), ProgressEvery: time.Nanosecond,
		Progress: func(dp DecompressProgress) { got = append(got, dp) }})
	if err != nil {
		t.Fatal(err)
	}
	tg.Close()
	if len(got) < 2 {
		t.Fatalf("progress %+v: want a report on the way and one at the end", got)
	}
	last := got[len(got)-1]
	if !last.Done || last.Out != int64(len(raw)) || last.InSize != int64(len(z)) || last.In == 0 ||
		last.Kind != "zstd" || last.Path != p || last.TempDir != os.TempDir() {
		t.Errorf("last progress %+v: want done, %d bytes of core, %d compressed", last, len(raw), len(z))
	}
	for _, dp := range got[:len(got)-1] {
		if dp.Done || dp.Out > last.Out {
			t.Errorf("progress on the way %+v", dp)
		}
	}
	if s := got[0].String(); !strings.Contains(s, "decompressing "+p+" (zstd) into "+os.TempDir()) || !strings.Contains(s, "of core so far") {
		t.Errorf("progress line %q", s)
	}
	if s := last.String(); !strings.HasPrefix(s, "decompressed "+p+" (zstd): ") {
		t.Errorf("last progress line %q", s)
	}
}

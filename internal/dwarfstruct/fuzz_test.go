package dwarfstruct_test

import (
	"bytes"
	"compress/zlib"
	"debug/elf"
	"encoding/binary"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/rbscope/rbscope/internal/dwarfstruct"
	"github.com/rbscope/rbscope/internal/layout"
	"github.com/rbscope/rbscope/internal/testutil"
)

// rawSection is one section of a hand-made ELF file.
type rawSection struct {
	name  string
	flags elf.SectionFlag
	data  []byte
}

// makeELF writes a little-endian ELF64 x86_64 shared object holding only
// the given sections (section headers at the end).
func makeELF(secs []rawSection) []byte {
	var b bytes.Buffer
	b.Write(make([]byte, 64))
	offs := make([]uint64, len(secs))
	for i, s := range secs {
		offs[i] = uint64(b.Len())
		b.Write(s.data)
	}
	shstr := []byte{0}
	names := make([]uint32, len(secs))
	for i, s := range secs {
		names[i] = uint32(len(shstr))
		shstr = append(append(shstr, s.name...), 0)
	}
	shstrName := uint32(len(shstr))
	shstr = append(append(shstr, ".shstrtab"...), 0)
	shstrOff := uint64(b.Len())
	b.Write(shstr)
	for b.Len()%8 != 0 {
		b.WriteByte(0)
	}
	shoff := uint64(b.Len())
	le := binary.LittleEndian
	sh := func(name, typ uint32, flags, off, size uint64) {
		var h [64]byte
		le.PutUint32(h[0:], name)
		le.PutUint32(h[4:], typ)
		le.PutUint64(h[8:], flags)
		le.PutUint64(h[24:], off)
		le.PutUint64(h[32:], size)
		le.PutUint64(h[48:], 1)
		b.Write(h[:])
	}
	sh(0, 0, 0, 0, 0)
	for i, s := range secs {
		sh(names[i], uint32(elf.SHT_PROGBITS), uint64(s.flags), offs[i], uint64(len(s.data)))
	}
	sh(shstrName, uint32(elf.SHT_STRTAB), 0, shstrOff, uint64(len(shstr)))
	out := b.Bytes()
	copy(out, []byte{0x7f, 'E', 'L', 'F', 2, 1, 1})
	le.PutUint16(out[16:], uint16(elf.ET_DYN))
	le.PutUint16(out[18:], uint16(elf.EM_X86_64))
	le.PutUint32(out[20:], 1)
	le.PutUint64(out[40:], shoff)
	le.PutUint16(out[52:], 64)
	le.PutUint16(out[58:], 64)
	le.PutUint16(out[60:], uint16(len(secs)+2))
	le.PutUint16(out[62:], uint16(len(secs)+1))
	return out
}

// gabiZlib returns an SHF_COMPRESSED section body declaring size bytes
// and holding the zlib stream of data.
func gabiZlib(declared uint64, data []byte) []byte {
	var b bytes.Buffer
	var h [24]byte
	binary.LittleEndian.PutUint32(h[0:], uint32(elf.COMPRESS_ZLIB))
	binary.LittleEndian.PutUint64(h[8:], declared)
	binary.LittleEndian.PutUint64(h[16:], 1)
	b.Write(h[:])
	zw, _ := zlib.NewWriterLevel(&b, zlib.BestCompression)
	zw.Write(data)
	zw.Close()
	return b.Bytes()
}

// gnuZlib returns a legacy .zdebug body declaring size bytes.
func gnuZlib(declared uint64, data []byte) []byte {
	var b bytes.Buffer
	b.WriteString("ZLIB")
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], declared)
	b.Write(n[:])
	zw, _ := zlib.NewWriterLevel(&b, zlib.BestCompression)
	zw.Write(data)
	zw.Close()
	return b.Bytes()
}

// plainDWARF returns the uncompressed DWARF sections of testdata/shapes.c
// built as a shared object (so no relocations), or skips without gcc.
func plainDWARF(t testing.TB) map[string][]byte {
	t.Helper()
	needTool(t, "gcc")
	so := filepath.Join(t.TempDir(), "shapes.so")
	run(t, "gcc", "-g", "-shared", "-fPIC", "-o", so, filepath.Join("testdata", "shapes.c"))
	f, err := elf.Open(so)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][]byte{}
	for _, s := range f.Sections {
		if strings.HasPrefix(s.Name, ".debug_") {
			d, err := s.Data()
			if err != nil {
				t.Fatal(err)
			}
			out[s.Name] = d
		}
	}
	return out
}

func TestHandMadeELFReadsLikeGCC(t *testing.T) {
	d := plainDWARF(t)
	for _, mode := range []string{"plain", "gabi", "gnu"} {
		var secs []rawSection
		for _, name := range []string{".debug_abbrev", ".debug_info", ".debug_str", ".debug_line_str"} {
			data := d[name]
			switch mode {
			case "plain":
				secs = append(secs, rawSection{name: name, data: data})
			case "gabi":
				secs = append(secs, rawSection{name: name, flags: elf.SHF_COMPRESSED, data: gabiZlib(uint64(len(data)), data)})
			case "gnu":
				secs = append(secs, rawSection{name: ".zdebug_" + strings.TrimPrefix(name, ".debug_"), data: gnuZlib(uint64(len(data)), data)})
			}
		}
		l, _, err := dwarfstruct.ExtractWith(bytes.NewReader(makeELF(secs)), shapesStructs, dwarfstruct.SmallLimits, false)
		if err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
		checkShapesValues(t, l)
	}
}

// allocDuring returns the bytes allocated while f runs.
func allocDuring(f func()) uint64 {
	var a, b runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&a)
	f()
	runtime.ReadMemStats(&b)
	return b.TotalAlloc - a.TotalAlloc
}

func TestMalformedSectionsBoundedMemory(t *testing.T) {
	d := plainDWARF(t)
	abbrev, info, str := d[".debug_abbrev"], d[".debug_info"], d[".debug_str"]
	zeros := make([]byte, 16<<20) // inflates 1000:1, 16 times the caps
	junk := bytes.Repeat([]byte{0xff, 0x13, 0x00, 0x7f}, 1<<10)
	cases := []struct {
		name    string
		secs    []rawSection
		wantErr string
	}{
		{"declared size over the cap", []rawSection{
			{name: ".debug_abbrev", flags: elf.SHF_COMPRESSED, data: gabiZlib(2<<30, zeros)},
			{name: ".debug_info", data: info},
		}, "exceeds the 1048576-byte cap"},
		{"legacy declared size over the cap", []rawSection{
			{name: ".zdebug_abbrev", data: gnuZlib(1<<40, zeros)},
			{name: ".debug_info", data: info},
		}, "exceeds the 1048576-byte cap"},
		{"bomb under a small declared size", []rawSection{
			{name: ".debug_abbrev", data: abbrev},
			{name: ".debug_str", flags: elf.SHF_COMPRESSED, data: gabiZlib(uint64(len(str)), append(append([]byte(nil), str...), zeros...))},
			{name: ".debug_line_str", data: d[".debug_line_str"]},
			{name: ".debug_info", data: info},
		}, ""}, // reads only what is declared: a valid file
		{"declared size larger than the data", []rawSection{
			{name: ".debug_abbrev", flags: elf.SHF_COMPRESSED, data: gabiZlib(1<<20, abbrev)},
			{name: ".debug_info", data: info},
		}, "data ends after"},
		{"debug_info bomb", []rawSection{
			{name: ".debug_abbrev", data: abbrev},
			{name: ".debug_info", flags: elf.SHF_COMPRESSED, data: gabiZlib(8<<20, zeros)},
		}, "declares only 0 bytes"},
		{"debug_info over the cap", []rawSection{
			{name: ".debug_abbrev", data: abbrev},
			{name: ".debug_info", flags: elf.SHF_COMPRESSED, data: gabiZlib(1<<40, zeros)},
		}, "exceeds the 8388608-byte cap"},
		{"unit longer than the section", []rawSection{
			{name: ".debug_abbrev", data: abbrev},
			{name: ".debug_info", data: append([]byte{0xf0, 0xff, 0x0f, 0x00}, info[4:]...)},
		}, "declares 1048560 bytes"},
		{"junk units", []rawSection{
			{name: ".debug_abbrev", data: junk},
			{name: ".debug_info", data: junk},
		}, "read DWARF"},
		{"junk abbrev", []rawSection{
			{name: ".debug_abbrev", data: junk},
			{name: ".debug_info", data: info},
			{name: ".debug_str", data: str},
		}, "read DWARF"},
		{"bad compression header", []rawSection{
			{name: ".debug_abbrev", flags: elf.SHF_COMPRESSED, data: []byte{9, 0, 0, 0}},
			{name: ".debug_info", data: info},
		}, "parse ELF"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			file := makeELF(c.secs)
			var err error
			alloc := allocDuring(func() {
				_, _, err = dwarfstruct.ExtractWith(bytes.NewReader(file), shapesStructs, dwarfstruct.SmallLimits, false)
			})
			if c.wantErr == "" && err != nil {
				t.Errorf("unexpected error %v", err)
			}
			if c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)) {
				t.Errorf("error %v, want one containing %q", err, c.wantErr)
			}
			// The caps are 1 MiB per loaded section and unit; allow for
			// the decompressor's window and the DWARF reader's tables.
			if alloc > 4<<20 {
				t.Errorf("allocated %d bytes", alloc)
			}
			t.Logf("err=%v alloc=%d", err, alloc)
		})
	}
}

// FuzzExtract feeds arbitrary files to the extractor: it must return a
// layout or an error, never panic, with bounded memory. The seed corpus
// holds gcc objects with plain, zlib, zstd and legacy .zdebug DWARF (see
// TestWriteFuzzSeeds) and hand-made malformed files.
func FuzzExtract(f *testing.F) {
	d := []byte("\x00")
	f.Add(makeELF([]rawSection{{name: ".debug_abbrev", data: d}, {name: ".debug_info", data: d}}))
	f.Add(makeELF([]rawSection{{name: ".debug_abbrev", flags: elf.SHF_COMPRESSED, data: gabiZlib(1<<40, make([]byte, 1<<16))}, {name: ".debug_info", data: d}}))
	f.Add(makeELF([]rawSection{{name: ".zdebug_abbrev", data: gnuZlib(3, []byte{1, 2})}, {name: ".zdebug_info", data: gnuZlib(1<<19, make([]byte, 1<<12))}}))
	want := append(append([]string(nil), shapesStructs...), layout.WantedStructs...)
	f.Fuzz(func(t *testing.T, data []byte) {
		l, _, err := dwarfstruct.ExtractWith(bytes.NewReader(data), want, dwarfstruct.SmallLimits, false)
		if err == nil && len(l.Structs) == 0 {
			t.Fatal("no error and no structs")
		}
	})
}

// TestWriteFuzzSeeds regenerates the committed seed corpus of
// FuzzExtract when RBSCOPE_WRITE_FUZZ_SEEDS=1.
func TestWriteFuzzSeeds(t *testing.T) {
	if os.Getenv("RBSCOPE_WRITE_FUZZ_SEEDS") != "1" {
		t.Skip("set RBSCOPE_WRITE_FUZZ_SEEDS=1 to regenerate testdata/fuzz/FuzzExtract")
	}
	dir := t.TempDir()
	src := filepath.Join("testdata", "shapes.c")
	base := compileC(t, src, filepath.Join(dir, "plain.o"), "-g")
	files := map[string]string{
		"gcc-plain":  base,
		"gcc-zlib":   compileC(t, src, filepath.Join(dir, "zlib.o"), "-g", "-gz=zlib"),
		"gcc-dwarf4": compileC(t, src, filepath.Join(dir, "d4.o"), "-g", "-gdwarf-4"),
	}
	for name, flag := range map[string]string{"objcopy-zstd": "zstd", "objcopy-zlib-gnu": "zlib-gnu"} {
		out := filepath.Join(dir, name+".o")
		run(t, "objcopy", "--compress-debug-sections="+flag, base, out)
		files[name] = out
	}
	// dwz partial units, read whole.
	needTool(t, "dwz")
	src2 := filepath.Join(dir, "b.c")
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(src2, []byte(regexp.MustCompile(`\bg_`).ReplaceAllString(string(data), "b_")), 0o644); err != nil {
		t.Fatal(err)
	}
	so := filepath.Join(dir, "dwz.so")
	run(t, "gcc", "-g", "-shared", "-fPIC", "-nostdlib", "-o", so, src, src2)
	run(t, "dwz", so)
	files["dwz-partial"] = so
	seedDir := filepath.Join("testdata", "fuzz", "FuzzExtract")
	if err := os.MkdirAll(seedDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, p := range files {
		run(t, "strip", "--strip-unneeded", "--keep-section=.debug_*", "--keep-section=.zdebug_*", "-R", ".comment", "-R", ".note.GNU-stack", p)
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(seedDir, name), testutil.EncodeFuzzSeed(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestFuzzSeedsAreDWARF checks that the committed seeds from real objects
// still hold the shapes' DWARF, so fuzzing starts from valid inputs.
func TestFuzzSeedsAreDWARF(t *testing.T) {
	seeds, err := filepath.Glob(filepath.Join("testdata", "fuzz", "FuzzExtract", "*"))
	if err != nil || len(seeds) < 5 {
		t.Fatalf("seeds: %v %v", seeds, err)
	}
	for _, p := range seeds {
		raw, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		data, err := testutil.DecodeFuzzSeed(raw)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		l, _, err := dwarfstruct.ExtractWith(bytes.NewReader(data), shapesStructs, dwarfstruct.SmallLimits, false)
		if err != nil {
			t.Errorf("%s: %v", p, err)
			continue
		}
		checkShapesValues(t, l)
	}
}

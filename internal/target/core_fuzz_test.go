package target

import (
	"bytes"
	"compress/gzip"
	"os"
	"path/filepath"
	"testing"

	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"
	"github.com/ulikunitz/xz"

	"github.com/rbscope/rbscope/internal/testutil"
)

// smallTinyCore is the default tiny core holding 64 bytes of each segment,
// small enough for a committed fuzz seed.
func smallTinyCore() tinyCore {
	tc := defaultTinyCore()
	for i := range tc.segs {
		tc.segs[i].filesz = 0x40
	}
	return tc
}

// fuzzSeeds are the inputs committed under testdata/fuzz/FuzzOpenCore.
func fuzzSeeds() map[string][]byte {
	small := smallTinyCore().bytes()
	xnum := smallTinyCore()
	xnum.xnum = true
	var z bytes.Buffer
	zw := gzip.NewWriter(&z)
	zw.Write(small)
	zw.Close()
	zs, _ := zstd.NewWriter(nil)
	zst := zs.EncodeAll(small, nil)
	zeros := zs.EncodeAll(make([]byte, 1<<20), nil)
	zs.Close()
	var x bytes.Buffer
	xw, _ := xz.NewWriter(&x)
	xw.Write(small)
	xw.Close()
	var l bytes.Buffer
	lw := lz4.NewWriter(&l)
	lw.Write(small)
	lw.Close()
	return map[string][]byte{
		"tiny-zstd":  zst,
		"tiny-xz":    x.Bytes(),
		"tiny-lz4":   l.Bytes(),
		"zeros-zstd": zeros, // not a core: refused after its first bytes
		"tiny":       small,
		"tiny-xnum":  xnum.bytes(),
		"tiny-gzip":  z.Bytes(),
		"truncated":  small[:len(small)/2],
	}
}

// FuzzOpenCore opens arbitrary bytes as a core and uses what opens: no
// panic, no unbounded allocation, errors only. Compressed seeds (gzip,
// zstd, xz, lz4) reach the decompress-and-check path.
func FuzzOpenCore(f *testing.F) {
	for _, s := range fuzzSeeds() {
		f.Add(s)
	}
	root := f.TempDir()
	// Each fuzzing process runs the target serially: one file will do.
	p := filepath.Join(f.TempDir(), "core")
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		tg, err := OpenCore(p, CoreOptions{SysRoot: root, MaxDecompressed: 1 << 20})
		if err != nil {
			return
		}
		defer tg.Close()
		tg.Pid()
		tg.Executable()
		if _, err := tg.Threads(); err != nil {
			t.Fatal(err)
		}
		maps, err := tg.Mappings()
		if err != nil {
			t.Fatal(err)
		}
		var b [64]byte
		for i, m := range maps {
			if i == 64 {
				break
			}
			if m.End <= m.Start {
				t.Fatalf("empty mapping %+v", m)
			}
			tg.ReadAt(b[:], m.Start)
			tg.ReadAt(b[:], m.End-1)
			tg.ReadBatch([]Read{{Addr: m.Start, Buf: b[:8]}, {Addr: m.End - 8, Buf: b[8:]}})
		}
	})
}

const seedDir = "testdata/fuzz/FuzzOpenCore"

// TestFuzzOpenCoreSeeds checks the committed seed corpus: every seed is
// there and well-formed, and the whole cores among them open (so that
// fuzzing starts from inputs that reach the deep code). With
// RBSCOPE_UPDATE_FUZZ_SEEDS=1 it rewrites them.
func TestFuzzOpenCoreSeeds(t *testing.T) {
	for name, data := range fuzzSeeds() {
		got := testutil.CommittedFuzzSeed(t, seedDir, name, data)
		if name == "truncated" || name == "zeros-zstd" {
			continue
		}
		tg, err := OpenCore(writeTiny(t, got), CoreOptions{})
		if err != nil {
			t.Errorf("seed %s does not open: %v", name, err)
			continue
		}
		if th, _ := tg.Threads(); len(th) != 2 {
			t.Errorf("seed %s: %d threads, want 2", name, len(th))
		}
		tg.Close()
	}
}

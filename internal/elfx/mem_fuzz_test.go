package elfx

import (
	"testing"

	"github.com/rbscope/rbscope/internal/testutil"
)

const fuzzBase = 0x10000

// memFuzzSeeds are the inputs committed under testdata/fuzz/FuzzReadMemoryImage.
func memFuzzSeeds() map[string][]byte {
	sysv := defaultTinyImage()
	sysv.hash, sysv.relocated = "sysv", true
	return map[string][]byte{
		"tiny-gnu":  defaultTinyImage().bytes(fuzzBase),
		"tiny-sysv": sysv.bytes(fuzzBase),
	}
}

// FuzzReadMemoryImage reads arbitrary bytes mapped at fuzzBase as an ELF
// image: no panic, bounded allocation (the caps), errors only.
func FuzzReadMemoryImage(f *testing.F) {
	for _, s := range memFuzzSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, mem []byte) {
		img, err := ReadMemoryImage(byteMem{fuzzBase, mem}, fuzzBase)
		if err != nil {
			return
		}
		if len(img.Symbols) > MaxMemSymbols {
			t.Fatalf("%d symbols", len(img.Symbols))
		}
		for name := range img.Symbols {
			if _, ok := img.Lookup(name); !ok {
				t.Fatalf("Lookup(%q) failed for a listed symbol", name)
			}
		}
	})
}

const memSeedDir = "testdata/fuzz/FuzzReadMemoryImage"

// TestFuzzReadMemoryImageSeeds checks the committed seed corpus is there
// and that its images read (so that fuzzing starts deep). With
// RBSCOPE_UPDATE_FUZZ_SEEDS=1 it rewrites them.
func TestFuzzReadMemoryImageSeeds(t *testing.T) {
	for name, data := range memFuzzSeeds() {
		got := testutil.CommittedFuzzSeed(t, memSeedDir, name, data)
		img, err := ReadMemoryImage(byteMem{fuzzBase, got}, fuzzBase)
		if err != nil || len(img.Symbols) != 4 {
			t.Errorf("seed %s: %v", name, err)
		}
	}
}

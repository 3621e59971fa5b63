package elfx

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
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
		p := filepath.Join(memSeedDir, name)
		if os.Getenv("RBSCOPE_UPDATE_FUZZ_SEEDS") == "1" {
			os.MkdirAll(memSeedDir, 0o755)
			if err := os.WriteFile(p, []byte(fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", data)), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatalf("seed %s: %v (regenerate with RBSCOPE_UPDATE_FUZZ_SEEDS=1)", name, err)
		}
		s := strings.TrimSpace(strings.TrimPrefix(string(b), "go test fuzz v1\n"))
		got, err := strconv.Unquote(strings.TrimSuffix(strings.TrimPrefix(s, "[]byte("), ")"))
		if err != nil {
			t.Fatalf("seed %s is not a fuzz corpus file: %v", name, err)
		}
		img, err := ReadMemoryImage(byteMem{fuzzBase, []byte(got)}, fuzzBase)
		if err != nil || len(img.Symbols) != 4 {
			t.Errorf("seed %s: %v", name, err)
		}
	}
}

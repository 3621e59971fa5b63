package testutil

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// fuzzHeader opens every file of a Go fuzz corpus.
const fuzzHeader = "go test fuzz v1\n"

// EncodeFuzzSeed is data as a Go fuzz corpus file for a fuzz target that
// takes one []byte.
func EncodeFuzzSeed(data []byte) []byte {
	return []byte(fmt.Sprintf("%s[]byte(%q)\n", fuzzHeader, data))
}

// DecodeFuzzSeed is the []byte a Go fuzz corpus file (EncodeFuzzSeed)
// holds.
func DecodeFuzzSeed(b []byte) ([]byte, error) {
	s := strings.TrimSpace(strings.TrimPrefix(string(b), fuzzHeader))
	if !strings.HasPrefix(s, "[]byte(") || !strings.HasSuffix(s, ")") {
		return nil, fmt.Errorf("not a []byte fuzz corpus file")
	}
	v, err := strconv.Unquote(strings.TrimSuffix(strings.TrimPrefix(s, "[]byte("), ")"))
	if err != nil {
		return nil, fmt.Errorf("not a []byte fuzz corpus file: %w", err)
	}
	return []byte(v), nil
}

// CommittedFuzzSeed returns the committed seed dir/name, decoded: the seed
// a fuzz target's corpus must hold, so that fuzzing starts deep. With
// RBSCOPE_UPDATE_FUZZ_SEEDS=1 it first rewrites the file from data.
func CommittedFuzzSeed(t testing.TB, dir, name string, data []byte) []byte {
	t.Helper()
	p := filepath.Join(dir, name)
	if os.Getenv("RBSCOPE_UPDATE_FUZZ_SEEDS") == "1" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, EncodeFuzzSeed(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("seed %s: %v (regenerate with RBSCOPE_UPDATE_FUZZ_SEEDS=1)", name, err)
	}
	got, err := DecodeFuzzSeed(b)
	if err != nil {
		t.Fatalf("seed %s: %v", name, err)
	}
	return got
}

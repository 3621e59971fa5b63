package target_test

import (
	"math/rand"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rbscope/rbscope/internal/target"
)

// readableAddrs picks n addresses at which 64 bytes read without error,
// spread over the target's mappings (uniformly by mapping, then offset).
func readableAddrs(b *testing.B, tg target.Target, n int) []uint64 {
	b.Helper()
	maps, err := tg.Mappings()
	if err != nil {
		b.Fatal(err)
	}
	var ok []target.Mapping
	for _, m := range maps {
		if m.End-m.Start >= 64 && strings.HasPrefix(m.Perms, "r") && m.Path != "[vvar]" && m.Path != "[vsyscall]" {
			ok = append(ok, m)
		}
	}
	rng := rand.New(rand.NewSource(1))
	var buf [64]byte
	var out []uint64
	for tries := 0; len(out) < n && tries < 100*n; tries++ {
		m := ok[rng.Intn(len(ok))]
		a := m.Start + uint64(rng.Int63n(int64(m.End-m.Start-64)))&^7
		if tg.ReadAt(buf[:], a) == nil {
			out = append(out, a)
		}
	}
	if len(out) < n {
		b.Fatalf("only %d readable addresses", len(out))
	}
	return out
}

func benchReads(b *testing.B, tg target.Target) {
	addrs := readableAddrs(b, tg, 4096)
	var buf [64]byte
	b.SetBytes(64)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := tg.ReadAt(buf[:], addrs[i&4095]); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCoreReadAt: 64-byte reads at random mapped addresses of a core
// (a gcore dump of a live Debian ruby, whose text comes from the files on
// disk, and the shared 3.1.0 dump). Compare with BenchmarkLiveReadAt in
// the same run.
func BenchmarkCoreReadAt(b *testing.B) {
	cmd := startRuby(b, twoThreads)
	core, err := target.OpenCore(gcoreOf(b, cmd.Process.Pid), target.CoreOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer core.Close()
	b.Run("gcore-3.1.2", func(b *testing.B) { benchReads(b, core) })

	dir := coredumpDir(b)
	shared, err := target.OpenCore(filepath.Join(dir, "ruby-coredump-3.1.0.gz"), target.CoreOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer shared.Close()
	b.Run("shared-3.1.0", func(b *testing.B) { benchReads(b, shared) })
}

// BenchmarkLiveReadAt: the same reads from a live Debian ruby
// (process_vm_readv).
func BenchmarkLiveReadAt(b *testing.B) {
	cmd := startRuby(b, twoThreads)
	live, err := target.OpenLive(cmd.Process.Pid)
	if err != nil {
		b.Fatal(err)
	}
	defer live.Close()
	b.Run("ruby-3.1.2", func(b *testing.B) { benchReads(b, live) })
}

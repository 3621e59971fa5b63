package ruby

import (
	"context"
	"encoding/binary"
	"testing"

	"github.com/rbscope/rbscope/internal/target"
	"github.com/rbscope/rbscope/internal/testutil"
)

// midIntern is a live target read as if Ruby's symbol table stood between
// taking a serial that starts a new chunk (++last_id) and storing that
// chunk: its last_id, at addr, reads as last.
type midIntern struct {
	target.Target
	addr uint64
	last uint32
}

func (m *midIntern) patch(b []byte, at uint64) {
	var v [4]byte
	binary.LittleEndian.PutUint32(v[:], m.last)
	for i := range v {
		if a := m.addr + uint64(i); a >= at && a < at+uint64(len(b)) {
			b[a-at] = v[i]
		}
	}
}

func (m *midIntern) ReadAt(b []byte, at uint64) error {
	err := m.Target.ReadAt(b, at)
	if err == nil {
		m.patch(b, at)
	}
	return err
}

func (m *midIntern) ReadBatch(reqs []target.Read) error {
	err := m.Target.ReadBatch(reqs)
	if err == nil {
		for _, r := range reqs {
			m.patch(r.Buf, r.Addr)
		}
	}
	return err
}

// TestSymbolScanMidIntern: the memory scan for ruby_global_symbols (a
// Ruby without symbols) finds the table while a symbol that starts a new
// chunk of it is being interned, when last_id already counts a serial
// whose chunk is not stored yet, and names C functions through it.
func TestSymbolScanMidIntern(t *testing.T) {
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		rb.SetProfilerEnv(t)
		proc := rb.Start(t, "stacks.rb", "nested")
		want := reports(t, proc)
		_, p := snapshotLive(t, proc.Pid)
		addr, ok := p.Info().Addresses["ruby_global_symbols"]
		if !ok {
			t.Fatalf("ruby_global_symbols not found: %v", p.Info().AddressSources)
		}
		last, err := p.r.u32(addr + symbolsLastID)
		if err != nil {
			t.Fatal(err)
		}
		tg, err := target.OpenLive(proc.Pid)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tg.Close() })
		mid := &midIntern{Target: tg, addr: addr, last: (last/idEntryUnit + 1) * idEntryUnit}
		q, err := Open(context.Background(), Spec{Target: mid, Consistency: Running, Options: Options{NoSymbols: true, Version: rb.Version}})
		if err != nil {
			t.Fatalf("open without symbols: %v", err)
		}
		ths, err := q.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		if src := q.Info().AddressSources["ruby_global_symbols"]; src != "memory scan" {
			t.Errorf("ruby_global_symbols (last_id %d read as %d) found by %q, want memory scan", last, mid.last, src)
		}
		for _, th := range ths {
			if th.Main {
				continue // the scenario's frames are on its other thread
			}
			checkAgainstRuby(t, th, want["main"])
			if len(th.Frames) == 0 || th.Frames[0].Name != "Kernel#sleep" {
				t.Errorf("innermost frame %+v, want Kernel#sleep (last_id %d read as %d)", th.Frames[:min(1, len(th.Frames))], last, mid.last)
			}
		}
	})
}

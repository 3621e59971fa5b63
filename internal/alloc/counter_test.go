package alloc

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/rbscope/rbscope/internal/ruby"
	"github.com/rbscope/rbscope/internal/target"
	"github.com/rbscope/rbscope/internal/testutil"
)

// memTarget is a process image in a map of 8-byte words, for the
// calibration and overlay tests (what they read is plain memory).
type memTarget struct {
	target.Target
	words map[uint64]uint64
	maps  []target.Mapping
}

func (m *memTarget) ReadAt(p []byte, addr uint64) error {
	for i := 0; i < len(p); i += 8 {
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], m.words[addr+uint64(i)])
		copy(p[i:], b[:])
	}
	return nil
}

func (m *memTarget) ReadBatch(reqs []target.Read) error {
	for _, r := range reqs {
		m.ReadAt(r.Buf, r.Addr)
	}
	return nil
}

func (m *memTarget) Mappings() ([]target.Mapping, error) { return m.maps, nil }

// TestCalibration: among the words the VM points to, calibration picks the
// one that grows by at least the counted events in every window by the
// least margin, not a faster clock, nor a counter that sometimes grows
// less (freed objects), nor a constant.
func TestCalibration(t *testing.T) {
	const vm, objspace, other = 0x10000, 0x20000, 0x30000
	m := &memTarget{words: map[uint64]uint64{}, maps: []target.Mapping{{Start: 0x10000, End: 0x40000, Perms: "rw-p"}}}
	m.words[vm+8] = objspace
	m.words[vm+16] = other
	m.words[vm+24] = 7 // not a pointer
	const counter = objspace + 0x18
	m.words[counter] = 1_000_000
	m.words[objspace+0x20] = 5 // constant
	m.words[other] = 1 << 30   // clock: grows by far more
	m.words[other+8] = 900_000 // freed: sometimes less than the events
	cal, err := newCalibration(m, vm, 64)
	if err != nil {
		t.Fatal(err)
	}
	if len(cal.regions) != 2 {
		t.Fatalf("%d regions, want 2", len(cal.regions))
	}
	cal.open()
	var found *rubyCounter
	var start, grown uint64
	windows := []struct{ events, internal, freed uint64 }{{1500, 20, 1600}, {1200, 10, 900}, {1300, 15, 1400}, {1400, 12, 1500},
		{1100, 9, 1200}, {1250, 11, 1300}, {1350, 14, 1450}, {1450, 16, 1550}, {1000, 8, 1100}}
	var want uint64
	for i, w := range windows {
		m.words[counter] += w.events + w.internal
		m.words[other] += 1 << 20
		m.words[other+8] += w.freed
		want += w.events + w.internal
		c, s, g, _ := cal.close(cal.read(), w.events, w.events)
		if c != nil {
			found, start, grown = c, s, g
			t.Logf("window %d: %s", i, c.source)
			break
		}
	}
	if found == nil {
		t.Fatal("no counter found")
	}
	if len(found.addrs) != 1 || found.addrs[0] != counter {
		t.Errorf("chose %x, want %x", found.addrs, counter)
	}
	if start != 1_000_000 || grown != want {
		t.Errorf("start %d grown %d, want 1000000 and %d", start, grown, want)
	}

	// A process whose counter grows less than the events (the probes
	// count something Ruby does not): no candidate is left.
	m.words[counter] = 1_000_000
	cal, _ = newCalibration(m, vm, 64)
	cal.open()
	for i := 0; i < 3 && !cal.failed(); i++ {
		m.words[counter] += 100
		m.words[other] += 1 << 20
		cal.close(cal.read(), 5000, 5000)
	}
	if !cal.failed() {
		t.Errorf("calibration kept %d candidates for a counter that cannot be there", len(cal.cands))
	}
}

// TestCalibrationSizePools: Ruby 3.2+ counts allocations per size pool
// (GC.stat(:total_allocated_objects) is the sum), so no single word grows
// by all the allocations. Calibration must find the pools' counters (same
// field of consecutive structs) and sum them, not a pool's freed counter
// (which sometimes grows less), a clock, or the pools that allocated while
// calibrating alone: the array of all five pools' counters, where the
// pools' slot sizes say it is.
func TestCalibrationSizePools(t *testing.T) {
	// Allocations per pool and window. The first window counts too few
	// to list candidates from; its growth still counts.
	cases := map[string][][5]uint64{
		// Pools 1 and 3 allocate nothing, pool 4 a few (within each
		// window's slack).
		"pools 0 2 4": {{30, 0, 10, 0, 0}, {900, 0, 300, 0, 5}, {700, 0, 200, 0, 9}, {800, 0, 250, 0, 3}, {1000, 0, 310, 0, 7}, {600, 0, 150, 0, 4},
			{650, 0, 180, 0, 6}, {720, 0, 210, 0, 2}, {880, 0, 260, 0, 8}, {910, 0, 290, 0, 5}},
		// Pool 0 alone: nothing but the slot sizes says the stride.
		"pool 0": {{30, 0, 0, 0, 0}, {900, 0, 0, 0, 0}, {700, 0, 0, 0, 0}, {800, 0, 0, 0, 0}, {1000, 0, 0, 0, 0}, {600, 0, 0, 0, 0},
			{650, 0, 0, 0, 0}, {720, 0, 0, 0, 0}},
	}
	for name, windows := range cases {
		t.Run(name, func(t *testing.T) { calibrateSizePools(t, windows) })
	}
}

func calibrateSizePools(t *testing.T, windows [][5]uint64) {
	const vm, objspace = 0x10000, 0x20000
	const poolWords, counterWord, freedWord = 28, 10, 11
	m := &memTarget{words: map[uint64]uint64{}, maps: []target.Mapping{{Start: 0x10000, End: 0x40000, Perms: "rw-p"}}}
	m.words[vm+8] = objspace
	pool := func(i, w int) uint64 { return objspace + uint64(8*(i*poolWords+w)) }
	for i := 0; i < 5; i++ {
		m.words[pool(i, counterWord)] = uint64(10_000 * (i + 1))
		m.words[pool(i, freedWord)] = uint64(9_000 * (i + 1))
	}
	m.words[objspace+8] = 1 << 30 // a clock
	// Each pool struct begins with its slot size (40, 80, ... bytes).
	// Words that look like counters (small, never decreasing) at a
	// shorter stride from pool 0's counter: a guess by stride alone
	// would take them.
	for i := 0; i < 5; i++ {
		m.words[pool(i, 0)] = 40 << i
	}
	for w := counterWord + 8; w < counterWord+5*8; w += 8 {
		m.words[pool(0, w)] = 7
	}
	cal, err := newCalibration(m, vm, 64)
	if err != nil {
		t.Fatal(err)
	}
	cal.pools = 5
	cal.open()
	var found *rubyCounter
	var start, grown, want uint64
	for i, w := range windows {
		var events uint64
		for p, n := range w {
			if n > 0 {
				m.words[pool(p, counterWord)] += n + 1 // and one internal object
				want += n + 1
				events += n
			}
			// Freed objects: the pool's allocations but late.
			if i%2 == 1 {
				m.words[pool(p, freedWord)] += 2 * n
			}
		}
		m.words[objspace+8] += 1 << 20
		c, s, g, _ := cal.close(cal.read(), events, events)
		if c != nil {
			found, start, grown = c, s, g
			t.Logf("window %d: %s", i, c.source)
			break
		}
	}
	if found == nil {
		t.Fatalf("no counter found (%d candidates left)", len(cal.cands))
	}
	// All five pools: not pools 0 and 2 alone, which grew by the events
	// but for pool 4's few, within each window's slack, nor 0, 2 and 4
	// at twice the pool stride.
	var sum, wantStart uint64
	for _, a := range found.addrs {
		sum += m.words[a]
	}
	for p := 0; p < 5; p++ {
		wantStart += uint64(10_000 * (p + 1))
	}
	if len(found.addrs) != 5 || found.addrs[0] != pool(0, counterWord) || found.addrs[4] != pool(4, counterWord) {
		t.Errorf("chose %x, want the counters of pools 0-4 (%x...%x)", found.addrs, pool(0, counterWord), pool(4, counterWord))
	}
	if start != wantStart || grown != want {
		t.Errorf("start %d grown %d, want %d and %d", start, grown, wantStart, want)
	}
	if v, err := found.read(); err != nil || v != wantStart+want || v != sum {
		t.Errorf("counter reads %d (%v), want %d", v, err, wantStart+want)
	}
}

// TestOverlay: reads inside a copied range come from the copy, reads
// across one are patched, the rest is live.
func TestOverlay(t *testing.T) {
	m := &memTarget{words: map[uint64]uint64{0x1000: 1, 0x1008: 2, 0x1010: 3, 0x1018: 4}}
	cp := make([]byte, 16)
	binary.LittleEndian.PutUint64(cp, 20)
	binary.LittleEndian.PutUint64(cp[8:], 30)
	ov := &overlay{Target: m, ranges: []ovRange{{0x1008, cp}}}
	read := func(addr uint64, n int) []uint64 {
		b := make([]byte, 8*n)
		if err := ov.ReadAt(b, addr); err != nil {
			t.Fatal(err)
		}
		out := make([]uint64, n)
		for i := range out {
			out[i] = binary.LittleEndian.Uint64(b[8*i:])
		}
		return out
	}
	for _, c := range []struct {
		addr uint64
		n    int
		want string
	}{
		{0x1008, 2, "[20 30]"},
		{0x1000, 4, "[1 20 30 4]"},
		{0x1018, 1, "[4]"},
	} {
		if got := fmt.Sprint(read(c.addr, c.n)); got != c.want {
			t.Errorf("read %x×%d = %s, want %s", c.addr, c.n, got, c.want)
		}
	}
	b1, b2 := make([]byte, 8), make([]byte, 16)
	if err := ov.ReadBatch([]target.Read{{Addr: 0x1010, Buf: b1}, {Addr: 0x1000, Buf: b2}}); err != nil {
		t.Fatal(err)
	}
	if binary.LittleEndian.Uint64(b1) != 30 || binary.LittleEndian.Uint64(b2[8:]) != 20 || binary.LittleEndian.Uint64(b2) != 1 {
		t.Errorf("batch: %v %v", b1, b2)
	}
}

// TestCalibrationQuietWindows: a bursty load leaves many windows with too
// few events to list candidates from (a burst now and then); calibration
// waits for a busy one however long, and the counter's growth in the
// quiet ones still counts.
func TestCalibrationQuietWindows(t *testing.T) {
	const vm, objspace = 0x10000, 0x20000
	m := &memTarget{words: map[uint64]uint64{}, maps: []target.Mapping{{Start: 0x10000, End: 0x40000, Perms: "rw-p"}}}
	m.words[vm+8] = objspace
	const counter = objspace + 0x18
	m.words[counter] = 1_000_000
	for w := uint64(0); w < 40; w++ {
		if objspace+8*w != counter {
			m.words[objspace+8*w] = 500 + w // counter-like words that wander up
		}
	}
	cal, err := newCalibration(m, vm, 64)
	if err != nil {
		t.Fatal(err)
	}
	cal.open()
	var want uint64
	var found *rubyCounter
	var grown uint64
	for i := 0; i < 40 && found == nil; i++ {
		// No allocation at all between bursts, a few in some windows.
		events, internal := uint64(0), uint64(0)
		if i%7 == 3 {
			events, internal = 5, 1
		}
		if i >= 30 {
			events, internal = 1500, 1 // the bursts
		}
		m.words[counter] += events + internal
		want += events + internal
		for w := uint64(0); w < 40; w++ {
			if objspace+8*w != counter && (i+int(w))%3 == 0 {
				m.words[objspace+8*w] += 2
			}
		}
		c, _, g, _ := cal.close(cal.read(), events, events)
		if c != nil {
			found, grown = c, g
		}
	}
	if found == nil {
		t.Fatalf("no counter found after 30 quiet windows (%d candidates)", len(cal.cands))
	}
	if len(found.addrs) != 1 || found.addrs[0] != counter || grown != want {
		t.Errorf("chose %x grown %d, want %x grown %d", found.addrs, grown, uint64(counter), want)
	}
}

// TestCounterFromHeaps: on Ruby 3.3 and 3.4, the counter found from the
// heaps' layout without DWARF (what stripped builds use) is the one DWARF says
// (the same words, where DWARF is), and reads what Ruby's own
// GC.stat(:total_allocated_objects) says while the script waits (the
// script allocates between its reads; it prints GC.stat's count and
// blocks in gets, which allocates nothing counted before the read).
// Other versions have no such layout: it refuses them.
func TestCounterFromHeaps(t *testing.T) {
	// What the script allocates between GC.stat and the read: the
	// printed line, puts' and gets' buffers (3 to 10 objects on 3.4.5;
	// the heaps' freed counter, the next word, is tens of thousands
	// behind, and one heap's counter alone thousands).
	const counterReadSlack = 32
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		p := startRuby(t, rb, "-e", `$stdout.sync = true
3.times do |i|
  keep = Array.new(20_000 * (i + 1)) { |j| "s#{j}" }
  n = GC.stat(:total_allocated_objects)
  puts "stat #{n}"
  STDIN.gets
end`)
		line := p.expectPrefix(t, "stat ")
		tg, err := target.OpenLive(p.cmd.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		defer tg.Close()
		rp, err := ruby.Open(context.Background(), ruby.Spec{Target: tg, Consistency: ruby.Running})
		if err != nil {
			t.Fatal(err)
		}
		c, err := counterFromHeaps(tg, rp)
		if heapsLayoutFor(rp.Version()) == nil {
			if err == nil {
				t.Fatalf("Ruby %s: counter %s from the heaps' layout, want a refusal", rp.Version(), c.source)
			}
			t.Logf("Ruby %s: %v", rp.Version(), err)
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %s", rb.Name, c.source)
		if rb.HasDWARF {
			vm, err := rp.VMAddress()
			if err != nil {
				t.Fatal(err)
			}
			d, err := counterFromDWARF(tg, rp, vm)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(c.addrs, d.addrs) {
				t.Errorf("heaps' layout says the counter is at %#x, DWARF (%s) at %#x", c.addrs, d.source, d.addrs)
			}
		}
		for i := 0; i < 3; i++ {
			if i > 0 {
				p.send(t)
				line = p.expectPrefix(t, "stat ")
			}
			truth, err := strconv.ParseUint(strings.TrimSpace(strings.TrimPrefix(line, "stat ")), 10, 64)
			if err != nil {
				t.Fatalf("%q: %v", line, err)
			}
			v, err := c.read()
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("read %d, GC.stat %d (%+d)", v, truth, int64(v-truth))
			if v < truth || v > truth+counterReadSlack {
				t.Errorf("counter read %d, GC.stat said %d just before", v, truth)
			}
		}
		p.send(t)
	})
}

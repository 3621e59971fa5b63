package ruby

import (
	"encoding/binary"
	"testing"
)

// TestSettle: which reads of a thread's cfp and copies of its frames give
// a consistent region, and from where.
func TestSettle(t *testing.T) {
	const sz, slots = 56, 6
	p := newProcess(nil, Options{})
	p.rt = &Runtime{}
	p.rt.o.cfpSize = sz
	p.rt.o.cfpPC = fieldOff{off: 0, size: 8, ok: true}
	p.rt.o.cfpSP = fieldOff{off: 8, size: 8, ok: true}
	const lo = 0x10000
	end := uint64(lo + sz*slots)
	frames := func(mark byte) []byte {
		b := make([]byte, sz*slots)
		for i := range b {
			b[i] = byte(i/sz) + mark
		}
		return b
	}
	cfps := func(c0, c1, c2 uint64) (c [3][8]byte) {
		for i, v := range []uint64{c0, c1, c2} {
			binary.LittleEndian.PutUint64(c[i][:], v)
		}
		return c
	}
	a, b := uint64(lo+sz), uint64(lo+2*sz)
	moved := frames(0)
	moved[2*sz+20]++ // slot 2 (beyond its pc and sp) differs between the copies
	innerPC := frames(0)
	innerPC[sz+3]++ // the pc of the frame at a
	for _, tc := range []struct {
		name   string
		c      [3][8]byte
		mid    bool
		second []byte
		wantOK bool
		wantAt uint64
	}{
		{"at rest", cfps(a, a, a), true, frames(0), true, a},
		{"rest around the first copy", cfps(a, a, b), true, frames(0), true, a},
		{"rest around the second copy", cfps(b, a, a), true, frames(0), true, a},
		{"moved and came back", cfps(a, b, a), true, frames(0), false, 0},
		{"moved all along", cfps(a, b, lo), true, frames(0), false, 0},
		{"copies differ", cfps(a, a, a), true, moved, false, 0},
		{"copies differ outside the region", cfps(b+sz, b+sz, b+sz), true, moved, true, b + sz},
		{"innermost pc moved", cfps(a, a, a), true, innerPC, true, a},
		{"a frame's pc moved under a callee", cfps(lo, lo, lo), true, innerPC, false, 0},
		{"no middle read: before and after agree", cfps(a, 0, a), false, frames(0), true, a},
		{"no middle read: before and after differ", cfps(a, 0, b), false, frames(0), false, 0},
		{"cfp outside the copies", cfps(lo-sz, lo-sz, lo-sz), true, frames(0), false, 0},
		{"cfp between two slots", cfps(a+8, a+8, a+8), true, frames(0), false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			region, at, ok := p.w.settle(lo, end, tc.c, tc.mid, frames(0), tc.second)
			if ok != tc.wantOK || (ok && at != tc.wantAt) {
				t.Fatalf("settle: ok %v at 0x%x, want ok %v at 0x%x", ok, at, tc.wantOK, tc.wantAt)
			}
			if ok && uint64(len(region)) != end-at {
				t.Errorf("region of %d bytes from 0x%x, want the %d to the stack's end", len(region), at, end-at)
			}
		})
	}
}

// TestStableOuter: which frames of two copies that did not settle held
// still: those outer to every cfp read and the same in both copies, from
// the innermost such slot to the end of the copies.
func TestStableOuter(t *testing.T) {
	const sz, slots = 56, 8
	p := newProcess(nil, Options{})
	p.rt = &Runtime{}
	p.rt.o.cfpSize = sz
	const lo = 0x20000
	end := uint64(lo + sz*slots)
	frames := func(diff ...int) []byte {
		b := make([]byte, sz*slots)
		for i := range b {
			b[i] = byte(i / sz)
		}
		for _, slot := range diff {
			b[slot*sz+30] ^= 0xff
		}
		return b
	}
	cfps := func(c0, c1, c2 uint64) (c [3][8]byte) {
		for i, v := range []uint64{c0, c1, c2} {
			binary.LittleEndian.PutUint64(c[i][:], v)
		}
		return c
	}
	at := func(slot int) uint64 { return lo + uint64(slot)*sz }
	for _, tc := range []struct {
		name      string
		c         [3][8]byte
		second    []byte
		wantStart int // first stable slot; -1: none
	}{
		{"outer to the outermost cfp", cfps(at(1), at(3), at(2)), frames(1, 2, 3), 4},
		{"a slot that differs beyond the cfps", cfps(at(1), at(1), at(2)), frames(5), 6},
		{"the outermost slot differs", cfps(at(1), at(1), at(1)), frames(slots - 1), -1},
		{"the cfp at the last slot", cfps(at(1), at(slots-1), at(1)), frames(), -1},
		{"a cfp outside the copies", cfps(at(1), end, at(1)), frames(), -1},
		{"a cfp between two slots", cfps(at(1), at(2)+8, at(1)), frames(), -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			region, start := p.w.stableOuter(lo, end, tc.c, frames(), tc.second)
			if tc.wantStart < 0 {
				if region != nil {
					t.Fatalf("stable region of %d bytes from 0x%x, want none", len(region), start)
				}
				return
			}
			if start != at(tc.wantStart) || uint64(len(region)) != end-start {
				t.Fatalf("stable region of %d bytes from 0x%x, want %d from 0x%x", len(region), start, end-at(tc.wantStart), at(tc.wantStart))
			}
			if string(region) != string(tc.second[tc.wantStart*sz:]) {
				t.Errorf("stable region is not the second copy's frames")
			}
		})
	}
}

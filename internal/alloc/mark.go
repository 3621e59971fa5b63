package alloc

import (
	"errors"
	"fmt"
	"time"

	"github.com/cilium/ebpf"
)

// States of the program's window mark (window_mark in bpf/alloc.bpf.c).
const (
	markOff   = 0 // no mark: windows end on time or at a quiet moment
	markFresh = 1 // the window's first counted event takes the signature
	markOpen  = 2 // the signature is taken
	markArmed = 3 // the next event like the signature's ends the window
	markEnded = 4 // the window ended: nothing more is counted
)

// resetMark readies the window mark for the next window, before the
// probes are attached, with the counter known or, in the default mode,
// being calibrated (the allocations past a calibrating window's mark are
// then counted apart: calPoint.past; retained mode marks only with the
// counter known): the window's first counted event and the one seen
// before it become its signature. A
// default-mode window whose first event has no predecessor seen (it
// opened while the target idled) learns one: the program counts the
// predecessors of that event's recurrences (first_preds), and armMark
// takes the rarest, the event that ends a burst where the first began
// one. Called with mu held.
func (tr *Tracker) resetMark() error {
	if tr.opts.Retained {
		tr.marking = !tr.opts.Exact && tr.counter != nil && tr.cal == nil
	} else {
		tr.marking = !tr.opts.Exact && (tr.counter != nil || tr.cal != nil)
	}
	tr.winAtIdle = false
	m := allocWindowMark{State: markOff}
	if tr.marking {
		m.State = markFresh
		if !tr.opts.Retained {
			m.Learn = 1
			if err := tr.clearFirstPreds(); err != nil {
				return err
			}
		}
	}
	if err := tr.maps.WindowMark.Put(uint32(0), m); err != nil {
		return fmt.Errorf("reset the window mark: %w", err)
	}
	return nil
}

// readFirstPreds reads first_preds: the count of each predecessor of the
// recurrences of the window's first events (the map holds 64 at most).
// Called with mu held.
func (tr *Tracker) readFirstPreds() (map[allocPredKey]uint64, error) {
	var k allocPredKey
	var v uint64
	preds := map[allocPredKey]uint64{}
	it := tr.maps.FirstPreds.Iterate()
	for it.Next(&k, &v) {
		preds[k] = v
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read the first events' predecessors: %w", err)
	}
	return preds, nil
}

// clearFirstPreds empties first_preds for the next window. Called with mu
// held.
func (tr *Tracker) clearFirstPreds() error {
	preds, err := tr.readFirstPreds()
	if err != nil {
		return err
	}
	for k := range preds {
		if err := tr.maps.FirstPreds.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("clear the first events' predecessors: %w", err)
		}
	}
	return nil
}

// armMark arms the window mark once the window's time is up: the program
// ends the window at the next event like its first (with the same event
// before it). It reports whether the mark was armed (a signature was
// taken). In the default mode only a window that opened while the target
// idled is marked (its first event began a burst), and one whose first
// event had no predecessor seen ends at the boundary (learnBoundary).
// Called with mu held.
func (tr *Tracker) armMark() bool {
	if !tr.marking || (!tr.opts.Retained && !tr.winAtIdle) {
		return false
	}
	m, ok := tr.readMark()
	if !ok || m.State != markOpen {
		return false
	}
	if m.SigPrev == 0 {
		b, ok := tr.learnBoundary(m)
		if !ok {
			return false
		}
		m.SigPrev, m.SigFirst = b.prev, b.first
	}
	m.State = markArmed
	return tr.maps.WindowMark.Put(uint32(0), m) == nil
}

// boundary is the pair of events that begins a burst of a default-mode
// target's allocations, learned in a window that opened before one
// (learnBoundary): prev ends a burst, first begins the next, and span is
// about how many events lie between two.
type boundary struct {
	prev, first, span uint64
}

// learnBoundary returns the pair of events at which a window that began
// with a burst ends: of the predecessors of the recurrences of one of its
// first events (first_preds), the one rarer than every other is the last
// event of a burst, the first event the first of the next (Tail and Head,
// where each step made 2,000 Head then 2,000 Tail: Head came after Head
// 1,999 times a step, after Tail once). The first of the window's first
// events with such a predecessor gives the pair: the very first may never
// recur (a line read before a loop). Else the boundary an earlier window
// learned, when one of the window's first events is its first; else
// ok is false. An event with a single predecessor gives none: a burst's
// boundary was not seen yet, or the event recurs only there. Called with
// mu held.
func (tr *Tracker) learnBoundary(m allocWindowMark) (b boundary, ok bool) {
	type rarest struct{ pred, n, kinds, ties uint64 }
	var per [len(m.Firsts)]rarest
	preds, err := tr.readFirstPreds()
	for k, v := range preds {
		if int(k.First) >= len(per) {
			continue
		}
		r := &per[k.First]
		r.kinds++
		switch {
		case r.ties == 0 || v < r.n:
			r.pred, r.n, r.ties = k.Pred, v, 1
		case v == r.n:
			r.ties++
		}
	}
	if err == nil {
		for i, r := range per {
			if r.kinds >= 2 && r.ties == 1 {
				ev, _ := tr.statSum(statObjects)
				tr.boundary = boundary{prev: r.pred, first: m.Firsts[i], span: (ev - tr.winOpenEvents) / r.n}
				return tr.boundary, true
			}
		}
	}
	for i := 0; i < int(min(m.Nfirsts, uint32(len(m.Firsts)))); i++ {
		if tr.boundary.prev != 0 && m.Firsts[i] == tr.boundary.first {
			return tr.boundary, true
		}
	}
	return boundary{}, false
}

// markEnded reports whether the program ended the current window at its
// start's recurrence. Called with mu held.
func (tr *Tracker) markEnded() bool {
	if !tr.marking {
		return false
	}
	m, ok := tr.readMark()
	return ok && m.State == markEnded
}

// readMark reads the window mark; ok is false when it could not be read.
// Called with mu held.
func (tr *Tracker) readMark() (m allocWindowMark, ok bool) {
	return m, tr.maps.WindowMark.Lookup(uint32(0), &m) == nil
}

// markPrev reports whether the program saw an event since the probes
// were attached: the window's first event will have a predecessor.
// Called with mu held.
func (tr *Tracker) markPrev() bool {
	m, ok := tr.readMark()
	return ok && m.Prev != 0
}

// dropMark turns the window mark off for the current window: it ends on
// time. Called with mu held.
func (tr *Tracker) dropMark() {
	if tr.marking && tr.maps.WindowMark.Put(uint32(0), allocWindowMark{State: markOff}) == nil {
		tr.marking = false
	}
}

// fullWindow is a window's full length: DutyCycle of DutyWindow.
func (tr *Tracker) fullWindow() time.Duration {
	return time.Duration(float64(tr.opts.DutyWindow) * tr.opts.DutyCycle)
}

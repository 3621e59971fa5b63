package alloc

import (
	"fmt"
	"time"
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
// probes are attached: in retained mode with the counter known (not
// calibrating: a calibration reads its candidates once the gate closes),
// the window's first counted event and the one seen before it become its
// signature; otherwise no mark. The default mode's windows (3 ms) are
// not marked: waiting for a burst before each one delayed the first
// counted window of a 0.3 s job past its end on Ruby 3.4.5 (estimated 0,
// TestAllocJobExits). Without it, a default-mode target that the probes
// slow past its own period leans to the heads of its bursts
// (TestDefaultModeBursts on Debian's Ruby, on a VM with slow traps:
// within 0.5 % on a quiet machine, +6..+10 % with a Ruby build beside it,
// inside its 10 % bound but not by much). Called with mu held.
func (tr *Tracker) resetMark() error {
	tr.marking = tr.opts.Retained && !tr.opts.Exact && tr.counter != nil && tr.cal == nil
	m := allocWindowMark{State: markOff}
	if tr.marking {
		m.State = markFresh
	}
	if err := tr.maps.WindowMark.Put(uint32(0), m); err != nil {
		return fmt.Errorf("reset the window mark: %w", err)
	}
	return nil
}

// armMark arms the window mark once the window's time is up: the program
// ends the window at the next event like its first (with the same event
// before it). It reports whether the mark was armed (a signature was
// taken). Called with mu held.
func (tr *Tracker) armMark() bool {
	if !tr.marking {
		return false
	}
	m, ok := tr.readMark()
	if !ok || m.State != markOpen {
		return false
	}
	m.State = markArmed
	return tr.maps.WindowMark.Put(uint32(0), m) == nil
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

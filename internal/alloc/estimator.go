package alloc

import (
	"fmt"
	"os"
)

// estimator is what values a Tracker's windows for the whole run: Ruby's
// allocation counter (counter once known, cal while it is being found),
// its value when counting began (counterStart) and at the end
// (counterEnd), its growth inside the counting windows (counterOn) and
// the events counted there, by which the counts are scaled.
type estimator struct {
	counter     *rubyCounter
	cal         *calibration
	counterNote string
	// calPoints are the calibration's reads in the current window, tested
	// once the probes are detached (settleCalibration).
	calPoints []calPoint
	// calVM and calSize locate rb_vm_t for calibrating (again): 0 when
	// the counter came from DWARF.
	calVM, calSize uint64
	recalibrations int
	counterStart   uint64
	counterEnd     uint64
	counterOn      uint64
	// counterEvents are the events counted in the windows counterOn
	// covers. calEvents are those counted while the counter was being
	// found: scaling values those windows at the growth per event of the
	// later ones, whose edges are exact (see calOn).
	counterEvents uint64
	calEvents     uint64
	// calPast are the allocations past the marks of the calibration's
	// windows so far (see settleCalibration).
	calPast uint64
	// winCounter is the counter's value when the current window opened,
	// winEvents the events then.
	winCounter uint64
	winEvents  uint64
	// winLoose: the current window's start is known only to within more
	// than pairSpread events (see readPair); looseWindows counts the
	// windows whose growth was extrapolated for a loose edge.
	winLoose     bool
	looseWindows int
	// counterEndHow says how counterEnd was last read (Report.CounterEnd).
	counterEndHow string
}

// extrapolateWindow closes a window whose end the counter could not be
// read at (the process exited without Ruby's teardown: exit!, a signal):
// its growth is taken as the window's events at the growth per event of
// the windows before, which the totals are scaled by anyway. Called with
// mu held.
func (e *estimator) extrapolateWindow(events uint64) {
	e.counterEnd = e.winCounter + e.addGuessed(events)
	e.counterEndHow = counterEndLost
}

// addGuessed adds to the windows' growth a window whose growth of Ruby's
// counter is unknown, valued at the growth per event of the windows so
// far (one per event before any), and returns that growth. Called with mu
// held.
func (e *estimator) addGuessed(events uint64) uint64 {
	grown := events
	if e.counterEvents > 0 {
		grown = uint64(float64(events) * float64(e.counterOn) / float64(e.counterEvents))
	}
	e.counterOn += grown
	e.counterEvents += events
	return grown
}

// overrunEvents is how many events a window may count, however long it
// lasted, before the pause after it grows in proportion (see offLength):
// what windowLength aims a window at. Called with mu held.
func (e *estimator) overrunEvents() uint64 {
	if e.cal != nil {
		return calMinEvents
	}
	return windowEvents
}

// settleCalibration tests the window's reads against the candidates, in
// order, once the probes are detached: listing and pruning hundreds of
// thousands of candidates took 54 ms with the gate open, every one of
// them a millisecond of uprobe traps for a tight loop (arrays ran 1.6
// times slower). A counter chosen at one of the reads counts the growth
// of its words in the reads after it. Called with mu held.
func (e *estimator) settleCalibration() {
	pts := e.calPoints
	e.calPoints = nil
	var chosen *calibration
	for _, p := range pts {
		if e.cal != nil {
			cal := e.cal
			// The candidates grew by the allocations past the mark
			// too; the scale counts only those counted (adoptCounter).
			e.calPast += p.past
			if cur, found := e.calClose(p.now, p.sure+p.past, p.events+p.past); found {
				e.winCounter, chosen = cur, cal
			}
			continue
		}
		if chosen == nil || e.counter == nil {
			return
		}
		v, ok := chosen.chosenValue(p.now)
		if !ok || v < e.winCounter {
			continue
		}
		e.calEvents += p.events
		e.winCounter, e.counterEnd = v, v
	}
}

// calClose feeds one (part of a) window to the calibration; found says
// whether it chose the counter, whose value in now is cur.
func (e *estimator) calClose(now [][]uint64, sure, events uint64) (cur uint64, found bool) {
	c, start, _, cur := e.cal.close(now, sure, events)
	if os.Getenv("RBSCOPE_ALLOC_DEBUG") != "" {
		fmt.Fprintf(os.Stderr, "cal close: sure %d events %d: windows %d events %d cands %d chosen %v\n", sure, events, e.cal.windows, e.cal.events, len(e.cal.cands), c != nil)
	}
	if c != nil && e.recalibrations > 0 {
		c.source += fmt.Sprintf(", found again since it counts (%s)", e.counterNote)
	}
	if c != nil {
		e.adoptCounter(c, start)
		e.counterEnd = cur
		return cur, true
	}
	if e.cal.failed() {
		e.cal = nil
		e.counterNote += "; calibration: no word of the object space grew with the allocations counted"
	}
	return 0, false
}

// adoptCounter ends the calibration with the counter it chose, its value
// when counting began (the calibration's windows count for their events,
// see calOn). Called with mu held.
func (e *estimator) adoptCounter(c *rubyCounter, start uint64) {
	e.counterStart = start
	e.calEvents = e.cal.events - min(e.cal.events, e.calPast)
	e.counter, e.cal = c, nil
}

// calOn is what the calibration's windows count for in the counter's
// growth inside windows: their events at the growth per event of the
// windows since (Ruby allocates objects no probe reports: 6% more than
// the events on testdata/mixed.rb), or failing those, their events, the
// least a true counter grows by over them. Their measured growth is off
// by their edges: inflated by the reads of the blocks before the gate
// opens and after it closes (+19 % on a tight loop), short where a read's
// events were counted after the counter's word was read (-9 % under two
// CPU hogs); valued at the least of the two, per read, it scaled a 0.3 s
// job's totals 6-18 % high (TestAllocJobExits, TestExitingJob on Debian's
// Ruby, which has its counter calibrated). Called with mu held.
func (e *estimator) calOn() uint64 {
	if e.calEvents == 0 {
		return 0
	}
	if e.counterEvents == 0 || e.counterOn == 0 {
		return e.calEvents
	}
	return uint64(float64(e.calEvents) * float64(e.counterOn) / float64(e.counterEvents))
}

// wantExitRanges is what the exit probe should copy now: the counter's
// words, or the live calibration blocks (all of them before the first
// check), none when they are too many. Called with mu held.
func (e *estimator) wantExitRanges() []allocExitRange {
	var out []allocExitRange
	switch {
	case e.counter != nil:
		for _, a := range e.counter.addrs {
			out = append(out, allocExitRange{Addr: a, Len: 8})
		}
	case e.cal != nil:
		for i, a := range e.cal.regions {
			if e.cal.live == nil || e.cal.live[i] {
				out = append(out, allocExitRange{Addr: a, Len: calWords * 8})
			}
		}
	}
	if len(out) > exitRanges {
		return nil
	}
	return out
}

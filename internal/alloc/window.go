package alloc

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"time"

	"github.com/rbscope/rbscope/internal/procfs"
	"github.com/rbscope/rbscope/internal/ruby"
	"github.com/rbscope/rbscope/internal/target"
)

// findCounter opens the Ruby VM and locates its allocation counter: from
// DWARF where there is some, else on Ruby 3.3-3.4 from its heaps' layout
// (counterFromHeaps), else (default mode only) by calibration over
// the first counting windows. Failing both, estimates are scaled by time
// and counterNote says why.
func (tr *Tracker) findCounter() {
	p, err := ruby.Open(context.Background(), ruby.Spec{Target: tr.t, Consistency: ruby.Running})
	if err != nil {
		tr.counterNote = err.Error() // "find the Ruby VM in process N: ..."
		return
	}
	tr.rb = p
	vm, err := p.VMAddress()
	if err != nil {
		tr.counterNote = fmt.Sprintf("locate the Ruby VM: %v", err)
		return
	}
	c, err := counterFromDWARF(tr.t, p, vm)
	if err == nil {
		tr.counter = c
		return
	}
	tr.counterNote = fmt.Sprintf("no DWARF for the object space (%v)", err)
	if c, herr := counterFromHeaps(tr.t, p); herr == nil && !tr.opts.calibrate {
		tr.counter = c
		return
	} else if herr != nil {
		tr.counterNote += fmt.Sprintf("; %v", herr)
	}
	if tr.opts.Exact {
		return
	}
	size, err := p.Layout().Size("rb_vm_struct")
	if err != nil {
		tr.counterNote += fmt.Sprintf("; no rb_vm_t size: %v", err)
		return
	}
	cal, err := newCalibration(tr.t, vm, size)
	if err != nil {
		tr.counterNote += fmt.Sprintf("; calibration: %v", err)
		return
	}
	cal.forVersion(p.Version())
	tr.cal, tr.calVM, tr.calSize, tr.calPast = cal, vm, size, 0
}

// statSum reads one statistics slot, summed over CPUs.
func (tr *Tracker) statSum(slot uint32) (uint64, error) {
	var per []uint64
	if err := tr.maps.Stats.Lookup(slot, &per); err != nil {
		return 0, fmt.Errorf("read stats: %w", err)
	}
	var sum uint64
	for _, v := range per {
		sum += v
	}
	return sum, nil
}

func (tr *Tracker) setGate(open bool) error {
	v := uint32(0)
	if open {
		v = 1
	}
	if err := tr.maps.Gate.Put(uint32(0), v); err != nil {
		return fmt.Errorf("set counting gate: %w", err)
	}
	return nil
}

// openWindow starts counting once the probes are attached. With the
// counter known, it opens the gate, then reads the counter and the events
// counted so far back to back (readPair): the counter's value when the
// gate opened is that value less those events. Reading the counter before
// opening the gate instead left every allocation between the read and the
// gate to the window's growth but not to its events, most of a window's
// worth when the tracker was preempted in between (CI: a total -5.6%).
func (tr *Tracker) openWindow() {
	tr.winEvents, _ = tr.statSum(statObjects)
	tr.winOpenEvents = tr.winEvents
	tr.winPastEnd, _ = tr.statSum(statPastEnd)
	if tr.cal != nil && tr.counter == nil && !tr.exitFired() {
		tr.cal.open()
	}
	if err := tr.setGate(true); err != nil && tr.dutyErr == nil {
		tr.dutyErr = err
	}
	tr.onSince = time.Now()
	if tr.counter == nil {
		return
	}
	v, ev, tight, err := tr.readPair()
	tr.winLoose = err == nil && !tight
	if err != nil {
		if tr.goneError(err) {
			// The process is exiting: the window's growth will be
			// extrapolated from the counter's last value.
			tr.winCounter = tr.counterEnd
			return
		}
		tr.dropCounter(err.Error())
		return
	}
	v -= min(v, ev-tr.winEvents)
	tr.winCounter = v
	if tr.counterStart == 0 {
		tr.counterStart = v
	}
}

// closeWindow stops counting (before the probes are detached). With the
// counter known, it reads the counter and the events back to back while
// the gate is still open (readPair), then closes the gate: the counter's
// value when the gate closed is that value plus the events counted since.
func (tr *Tracker) closeWindow() {
	var v, ev2 uint64
	var readErr error
	tight := true
	ended := tr.markEnded()
	switch {
	case tr.counter != nil && ended:
		// The program ended the window at its start's recurrence:
		// the counter then was its value now less the allocations
		// since (the events past the end, one per allocation as
		// inside it).
		var past uint64
		v, past, tight, readErr = tr.readPairOf(statPastEnd)
		v -= min(v, past-min(past, tr.winPastEnd))
		ev2, _ = tr.statSum(statObjects)
	case tr.counter != nil:
		v, ev2, tight, readErr = tr.readPair()
	}
	if err := tr.setGate(false); err != nil && tr.dutyErr == nil {
		tr.dutyErr = err
	}
	d := time.Since(tr.onSince)
	tr.onTotal += d
	ev, _ := tr.statSum(statObjects)
	events := ev - tr.winEvents
	all := ev - tr.winOpenEvents
	tr.lastWinEvents, tr.lastWin = all, d
	if all > 0 && d > 0 {
		// The whole window's: a calibrating window's events are cut
		// at its checkpoints (a rate half the true one made the first
		// windows after it count 3,000 events instead of 1,000).
		r := float64(all) / d.Seconds()
		if tr.winRate == 0 {
			tr.winRate = r
		} else {
			tr.winRate += (r - tr.winRate) / 4
		}
	}
	switch {
	case tr.counter != nil:
		if readErr != nil {
			if tr.goneError(readErr) {
				tr.extrapolateWindow(events)
				break
			}
			tr.dropCounter(readErr.Error())
			break
		}
		tr.counterEnd = v
		if ev >= ev2 {
			v += ev - ev2
		}
		if os.Getenv("RBSCOPE_ALLOC_DEBUG") != "" {
			fmt.Fprintf(os.Stderr, "window: %v events %d counter +%d loose %v/%v marked end %v\n", d, events, int64(v-tr.winCounter), tr.winLoose, !tight, ended)
		}
		if tr.winLoose || !tight {
			// An edge known only to within more than pairSpread events:
			// the window's growth is taken at the growth per event of
			// the others, and the counter's check waits for a window
			// whose edges are known.
			tr.winLoose = false
			tr.looseWindows++
			tr.addGuessed(events)
			break
		}
		if v < tr.winCounter || v-tr.winCounter+calSlack < events-events/dropShortfall {
			// The check that chose the counter, repeated on every window,
			// with room for a window's edges: a true counter was seen to
			// grow 3-14 % less than the events of one short window (then
			// dropped, and a wrong word calibrated in its place: totals
			// off by -8 % and +172 % in TestDefaultMode).
			tr.dropCounter(fmt.Sprintf("it grew by %d in a window that counted %d allocations", int64(v-tr.winCounter), events))
			break
		}
		tr.counterOn += v - tr.winCounter
		tr.counterEvents += events
	case tr.cal != nil:
		var past uint64
		if ended {
			// Allocations past the mark, which Ruby's counter
			// counted before the gate closed.
			p, _ := tr.statSum(statPastEnd)
			past = p - min(p, tr.winPastEnd)
		}
		if os.Getenv("RBSCOPE_ALLOC_DEBUG") != "" {
			fmt.Fprintf(os.Stderr, "calibrating window: %v events %d (all %d) past its mark %d\n", d, events, all, past)
		}
		if now, ok := tr.calRead(); ok {
			tr.calPoints = append(tr.calPoints, calPoint{now: now, sure: events, events: events, past: past})
		}
	}
}

// goneError reports whether a read of Ruby's counter failed because the
// process is exiting or gone (rather than a wrong address): the counter
// is kept, and its growth since the last read is unknown. Called with mu
// held.
func (tr *Tracker) goneError(err error) bool {
	return errors.Is(err, errExitUncopied) || target.IsExited(err) || !tr.Alive()
}

// windowEvents is how many events a counting window aims at, and
// minWindow the shortest window. Past a few hundred events a window
// adds little to the distribution (a steady load shows its mix in each,
// the counter gives the total), while every event costs the target a
// uprobe trap: at the default 3 ms an array-literal loop counted ~3,000
// events a window and ran 1.3 times slower.
const (
	windowEvents = 1000
	minWindow    = 300 * time.Microsecond
)

// calMaxWindow bounds a calibrating window, and calOff is the mean pause
// between two while the counter is still unknown and the last window
// counted allocations: the target is allocating now, so the windows that
// find the counter come within a few tens of milliseconds instead of one
// per DutyWindow (a run shorter than a few DutyWindows otherwise ended
// unscaled). A quiet window brings the usual pause back, so that an idle
// process is not probed more often.
const (
	calMaxWindow = 25 * time.Millisecond
	calOff       = 10 * time.Millisecond
)

// offLength returns how long the probes stay detached after a window:
// about DutyWindow less the window (at a random phase), or about calOff
// while calibrating on a target that allocated in the last window.
//
// A window that overran (its gate open longer than full: rbscope was
// not scheduled in time to close it, on a loaded machine) is followed by
// a pause that long in proportion, so that the probes stay attached
// DutyCycle of the time whatever the load: 3 ms windows were seen to
// last 0.2 to 1.5 s while rbscope waited for a CPU, attached 28-39 % of
// the time (a tenfold cost to the target, and TestDefaultMode's check of
// the windowed mode failing under load). The target pays per event, not
// per millisecond attached: an overrun window that counted no more than a
// window may (overrunEvents) cost it no more than one, and is followed by
// the usual pause. Pausing in proportion after those too made a window
// that overran while the target idled (waiting for its job) outlast the
// short job that came right after it: none of the job's allocations
// counted, its estimates all 0 (CI under load, TestAllocJobExits; a 0.3 s
// job's first window closed 8-19 ms late with 0-1,000 events paused the
// probes 0.1-0.9 s in TestExitingJob).
// Called with mu held.
func (tr *Tracker) offLength(full time.Duration) time.Duration {
	mean := tr.opts.DutyWindow - full
	if tr.lastWin > full && tr.opts.DutyCycle < 1 && tr.lastWinEvents > tr.overrunEvents() {
		mean = time.Duration(float64(tr.lastWin) * (1/tr.opts.DutyCycle - 1))
	}
	if tr.cal == nil && tr.lastWinEvents > windowEvents {
		// A window that waited for a quiet moment past windowEvents
		// (untilQuiet) is followed by a pause in proportion to its
		// events: the target pays per event, windowEvents per
		// DutyWindow at most, as with windows that end on time.
		mean = max(mean, time.Duration(float64(tr.opts.DutyWindow)*float64(tr.lastWinEvents)/windowEvents)-tr.lastWin)
	}
	if tr.cal != nil && tr.lastWinEvents >= calMinFirstEvents {
		mean = min(mean, calOff)
	}
	// A random phase, so that windows cannot alias with a periodic
	// workload.
	return time.Duration(float64(mean) * (0.5 + rand.Float64()))
}

// windowLength returns how long the next window stays attached: full
// (DutyCycle of DutyWindow) when events come slowly, shorter when the
// recent windows' rate would count more than windowEvents. While the
// counter is being found, a window lasts long enough to count what a
// choice needs (calMinEvents), up to calMaxWindow: where a uprobe trap is
// slow (6 us on some VMs, against 0.8 elsewhere), a 3 ms window counts a
// few hundred events, and a short run ended before enough windows came
// (an array loop of 0.2 s was never calibrated, its totals scaled by time:
// -99.7 %). The target pays per event, not per millisecond attached.
// Called with mu held.
func (tr *Tracker) windowLength(full time.Duration) time.Duration {
	if tr.cal != nil {
		if tr.winRate <= 0 {
			return full
		}
		on := time.Duration(calMinEvents / tr.winRate * float64(time.Second))
		return min(max(on, full), max(full, calMaxWindow))
	}
	if tr.winRate <= 0 {
		return full
	}
	on := time.Duration(windowEvents / tr.winRate * float64(time.Second))
	return min(full, max(on, minWindow))
}

// quietGap is how long the target must go without an allocation for a
// window to end (untilQuiet), quietMaxEvents and quietMaxWait bound how
// far past its length a window waits for one, and quietRetry is how often
// (in windows) a target that had none within those bounds is looked at
// again.
//
// A window's edges are not neutral to the program's phase: the probes slow
// the target while attached, so a window ending at a fixed time ends
// inside a burst of allocations far more often than one starting at a
// random time begins inside one (the target ran at full speed before it).
// Windows that end on time keep the heads of bursts and lose their tails:
// a script allocating 2,000 Head then 2,000 Tail every 50 ms was reported
// 100 % Head on Ruby 3.4.5 (68 % on 3.3.8), and retained mode scaled a
// leak made at the start of each 10 ms step +5..+10 % high and one made at
// its end -6..-9 % low (TestRetainedBySite, TestDefaultModeBursts). A server
// between requests, a job runner between jobs, is exactly such a program.
// Ending windows where the target is idle keeps whole bursts; a target
// that never idles has no bursts to cut, and its windows end at the
// bounds.
const (
	quietGap       = 2 * time.Millisecond
	quietMaxEvents = 16 * windowEvents
	quietMaxWait   = 250 * time.Millisecond
	quietRetry     = 8
)

// untilQuiet waits, after a window's planned length, until no
// allocation was counted for quietGap (the window's last quietGap counts
// as the first look when dutyLoop carved it out of the window's steps),
// or the program ended the window at its start's recurrence (armMark), or
// the window counted quietMaxEvents, or it ran quietMaxWait past its
// length. After a window that found no quiet moment within those bounds
// (a target that never idles has no bursts to cut: waiting would only
// make its windows longer and fewer), windows no longer wait for one, but
// every quietRetry-th looks again; they still wait for the mark, at most
// as many events again as they counted (markMaxEvents). It returns false
// when Stop was called meanwhile.
//
// The mark (set when the window opened after a burst, see untilIdle)
// keeps whole bursts when the probes slow the target so much that it no
// longer idles while they are attached: a Ruby 3.4.5 on a VM whose traps
// cost tens of microseconds made each 10 ms step of testdata/leaky.rb
// take 13 ms under the probes (43 under two CPU hogs), and its windows,
// opened between two steps and ended on time, kept the heads of steps
// (the leak) and lost their tails (the churn): the leak came out 6-14 %
// high (TestRetainedBySite). A default-mode window that opened while the
// target idled and found no quiet end waits for its learned mark
// (untilBoundary).
func (tr *Tracker) untilQuiet(carved bool) bool {
	tr.mu.Lock()
	last, err := tr.activity()
	open := tr.winOpenEvents
	look := err == nil && tr.quietMisses%quietRetry == 0
	if !look {
		tr.quietMisses++
	}
	armed := err == nil && tr.armMark()
	span := tr.boundary.span
	tr.mu.Unlock()
	if !look && !armed {
		if carved {
			// The window's last quietGap, carved out of its steps.
			select {
			case <-tr.stop:
				return false
			case <-time.After(quietGap):
			}
		}
		return true
	}
	w := idleWait{what: "quiet?", events: statObjects, from: open, idleEnds: look, markEnds: armed,
		maxEvents: quietMaxEvents, maxWait: quietMaxWait}
	if !look {
		w.maxEvents = markMaxEvents(last.events - open)
		if !tr.opts.Retained {
			// To the next burst's start (the window's began one).
			w.maxEvents = max(w.maxEvents, 2*span)
		}
	}
	r := tr.pollIdle(w, last)
	if look && r == pollMissed && !armed && !tr.untilBoundary(open) {
		return false
	}
	if !look {
		return r != pollStopped
	}
	return tr.tallyWait(r)
}

// untilBoundary ends a default-mode window that opened while the target
// idled and found no quiet moment to end at: the probes slow the target
// so much that it no longer idles while they are attached, and a window
// ending at its bounds kept its first burst whole (it began one) but only
// the head of its last: 1,000 Head then 1,000 Tail every 20 ms, one
// window of eight such bursts under two CPU hogs, came out Head +5..+13 %
// (TestDefaultModeBursts). It arms the mark at the boundary the window
// learned (learnBoundary) and waits for it, or the target idle, at most as
// many events again as the window counted or quietMaxWait: the window then
// holds whole bursts. It returns false when Stop was called meanwhile.
func (tr *Tracker) untilBoundary(open uint64) bool {
	tr.mu.Lock()
	cur, err := tr.activity()
	armed := err == nil && !tr.opts.Retained && tr.armMark()
	if os.Getenv("RBSCOPE_ALLOC_DEBUG") != "" {
		preds, _ := tr.readFirstPreds()
		m, _ := tr.readMark()
		fmt.Fprintf(os.Stderr, "boundary: at idle %v armed %v preds %v mark %+v\n", tr.winAtIdle, armed, preds, m)
	}
	tr.mu.Unlock()
	if !armed {
		return true
	}
	w := idleWait{what: "boundary?", events: statObjects, from: cur.events, idleEnds: true, markEnds: true,
		maxEvents: markMaxEvents(cur.events - open), maxWait: quietMaxWait}
	return tr.pollIdle(w, cur) != pollStopped
}

// markMaxEvents bounds how many events a window that does not look for a
// quiet moment waits for its mark after its planned length: as many as it
// counted (at least windowEvents/4), so that a target whose first events
// rarely come again pays at most twice a window.
func markMaxEvents(counted uint64) uint64 {
	return max(counted, windowEvents/4)
}

// untilIdle waits, once the probes of a window are attached and before
// its gate opens, until the target went quietGap without an allocation
// (counted or not: statSeen) or a GC phase, so that the window opens
// between two bursts of allocations rather than inside one. Under CPU
// contention a target's burst is stretched by preemption, and a window
// opening inside it counted its tail alone: 1,000 Head then 1,000 Tail
// every 20 ms, under a CPU hog, came out Head -16 %, Tail +14 %
// (TestDefaultModeBursts). It waits at most quietMaxEvents events or
// quietMaxWait.
//
// With the window mark (armMark), the idle moment must come after an
// event seen since the probes were attached: the window's first event
// then has a known predecessor, which tells the start of a burst from the
// same event inside one (the leak at the start of each step of
// testdata/leaky.rb is ten objects: the step's first and its second
// differ by the event before them), and the mark ends the window before
// the next burst. It waits for that event at most a window's full length
// (an idle target opens its window at once and it ends unmarked: the
// program marks no window whose first event has no predecessor seen). A
// window that opens otherwise has no burst's start to end at: it ends on
// time (dropMark).
//
// While the target found no quiet end to its windows (untilQuiet), the
// wait is shorter: without the mark, none (a target that never idles
// has no bursts to cut); with it, at most a random number of events
// below windowEvents, so that a target the probes keep busy opens its
// window at a random point of its stream rather than at the start of a
// burst (it was idle when they were attached): windows that opened at
// the start of a step of testdata/leaky.rb and ended on time made the
// leak at its start 6-14 % high. In the default mode it notes whether
// the window opens while the target idles (winAtIdle: the wait ended
// idle, or without a wait, idleNow), which its mark needs. It returns
// false when Stop was called meanwhile.
func (tr *Tracker) untilIdle() bool {
	tr.mu.Lock()
	misses, marking := tr.quietMisses, tr.marking && tr.opts.Retained
	first, err := tr.activityOf(statSeen)
	if err == nil && misses != 0 && !marking {
		tr.winAtIdle = tr.idleNow()
	}
	tr.mu.Unlock()
	if err != nil || (misses != 0 && !marking) {
		return true
	}
	w := idleWait{what: "idle?", events: statSeen, from: first.events, idleEnds: true, needPrev: marking,
		prevWait: tr.fullWindow(), maxEvents: quietMaxEvents, maxWait: quietMaxWait}
	if misses != 0 {
		w.maxEvents = 1 + rand.Uint64N(windowEvents)
	}
	r := tr.pollIdle(w, first)
	if r == pollIdle {
		tr.mu.Lock()
		tr.winAtIdle = true
		tr.mu.Unlock()
		return true // a window opening idle says nothing of its end
	}
	if marking && r == pollMissed {
		// Opening at a random point of a busy stream, the window
		// ends on time: its first event starts no burst.
		tr.mu.Lock()
		tr.dropMark()
		tr.mu.Unlock()
	}
	if misses != 0 {
		return r != pollStopped
	}
	return tr.tallyWait(r)
}

// idleNow reports whether the target idles as a window opens at once
// (without untilIdle's wait): no allocation was seen since its probes
// were being attached (seenAtAttach), and none of its threads is running
// or waiting for a CPU. Its first event then begins a burst. Called with
// mu held.
func (tr *Tracker) idleNow() bool {
	seen, err := tr.statSum(statSeen)
	if err != nil || seen != tr.seenAtAttach {
		return false
	}
	tids, err := procfs.Tasks(tr.pid)
	if err != nil {
		return false
	}
	for _, tid := range tids {
		if procfs.TaskState(tr.pid, tid) == 'R' {
			return false
		}
	}
	return true
}

// pollResult is how pollIdle's wait ended.
type pollResult int

const (
	pollIdle    pollResult = iota // the target was idle (idleSince)
	pollMissed                    // no idle moment within the bounds
	pollFailed                    // the activity could not be read
	pollStopped                   // Stop was called
	pollMarked                    // the program ended the window (armMark)
)

// idleWait is what pollIdle waits for: the target idle (idleEnds) after
// an event seen since the probes were attached (needPrev, for at most
// prevWait), the window's mark
// (markEnds), within maxEvents of events (from stats slot events, from
// from) and maxWait; what names it in RBSCOPE_ALLOC_DEBUG's lines.
type idleWait struct {
	what      string
	events    uint32
	from      uint64
	idleEnds  bool
	needPrev  bool
	prevWait  time.Duration
	markEnds  bool
	maxEvents uint64
	maxWait   time.Duration
}

// pollIdle reads the target's activity every quietGap, from last, until
// what w waits for came: the target was idle since the read before, or
// the program ended the window; or its events passed w.from+w.maxEvents,
// or w.maxWait went by.
func (tr *Tracker) pollIdle(w idleWait, last activity) pollResult {
	deadline := time.Now().Add(w.maxWait)
	prevDeadline := time.Now().Add(w.prevWait)
	for {
		select {
		case <-tr.stop:
			return pollStopped
		case <-time.After(quietGap):
		}
		if w.needPrev && w.prevWait > 0 && time.Now().After(prevDeadline) {
			w.needPrev = false
		}
		tr.mu.Lock()
		cur, err := tr.activityOf(w.events)
		if os.Getenv("RBSCOPE_ALLOC_DEBUG") != "" {
			m, _ := tr.readMark()
			fmt.Fprintf(os.Stderr, "%s from %d last %+v now %+v misses %d mark %+v\n", w.what, w.from, last, cur, tr.quietMisses, m)
		}
		idle := err == nil && w.idleEnds && tr.idleSince(last, cur) && (!w.needPrev || tr.markPrev())
		marked := err == nil && w.markEnds && tr.markEnded()
		tr.mu.Unlock()
		switch {
		case err != nil:
			return pollFailed
		case marked:
			// Before idle: nothing is counted past the mark.
			return pollMarked
		case idle:
			return pollIdle
		case cur.events-w.from >= w.maxEvents || time.Now().After(deadline):
			return pollMissed
		}
		last = cur
	}
}

// tallyWait counts the outcome of a wait for an idle moment in quietMisses
// and reports whether the duty cycle goes on.
func (tr *Tracker) tallyWait(r pollResult) bool {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	switch r {
	case pollStopped:
		return false
	case pollIdle:
		tr.quietMisses = 0
	case pollMissed:
		tr.quietMisses++
	}
	return true
}

// activity is what untilQuiet and untilIdle compare: the events counted,
// the GC phases ended, and whether one is under way. A GC inside a burst
// allocates nothing for as long as it runs: it is not the target idling.
type activity struct {
	events, gcPhases uint64
	inGC             bool
	lastTID          uint32 // the thread of the last allocation event seen
}

// idleSince reports whether the target went from a to now without an
// allocation, a GC phase, or being runnable in the thread that allocated
// last: under CPU contention a thread preempted in the middle of a burst
// (runnable, waiting for a CPU) makes the same pause in the events as one
// that finished its burst and sleeps; two CPU hogs made 2 ms pauses inside
// bursts common enough to move TestDefaultModeBursts' shares by 10-18 %.
func (tr *Tracker) idleSince(a, now activity) bool {
	if now != a || now.inGC {
		return false
	}
	return now.lastTID == 0 || procfs.TaskState(tr.pid, int(now.lastTID)) != 'R'
}

// activity reads the target's activity, its events those counted in the
// window. Called with mu held.
func (tr *Tracker) activity() (activity, error) { return tr.activityOf(statObjects) }

// activityOf reads the target's activity, its events from stats slot
// events. Called with mu held.
func (tr *Tracker) activityOf(events uint32) (activity, error) {
	var a activity
	var err error
	if a.events, err = tr.statSum(events); err != nil {
		return a, err
	}
	marks, err := tr.statSum(statGCMarkCount)
	if err != nil {
		return a, err
	}
	sweeps, err := tr.statSum(statGCSweepCount)
	if err != nil {
		return a, err
	}
	a.gcPhases = marks + sweeps
	if err := tr.maps.LastTid.Lookup(uint32(0), &a.lastTID); err != nil {
		return a, fmt.Errorf("read the last allocating thread: %w", err)
	}
	for slot := uint32(0); slot < 2; slot++ {
		var start uint64
		if err := tr.maps.GcStart.Lookup(slot, &start); err != nil {
			return a, fmt.Errorf("read GC phase start: %w", err)
		}
		a.inGC = a.inGC || start != 0
	}
	return a, nil
}

// pairSpread is how many events readPair allows between the two reads of
// the events that bracket its read of Ruby's counter, and pairTries how
// often it reads all three again when more came: the event count at the
// counter's read is only known to within that spread. A looser pair sets
// a window's edge off by the allocations in between, all on one side:
// with the counter read before the events, a tracker preempted between
// the two (a loaded CI machine) subtracted from the window's start
// allocations made after it, the window grew by that much more than its
// events, and the totals, scaled by growth per event, came out 8 % low
// (TestAgentAlloc). A window still loose after pairTries is left out of
// the growth per event (see closeWindow).
const (
	pairSpread = windowEvents / 32
	pairTries  = 5
)

// readPair reads Ruby's counter between two reads of the events the
// probes counted so far and returns the counter and the events at its
// read (the middle of the two); tight is false when the two reads stayed
// more than pairSpread apart in every try.
func (tr *Tracker) readPair() (counter, events uint64, tight bool, err error) {
	return tr.readPairOf(statObjects)
}

// readPairOf is readPair with the events of stats slot slot.
func (tr *Tracker) readPairOf(slot uint32) (counter, events uint64, tight bool, err error) {
	for i := 0; i < pairTries; i++ {
		e1, err := tr.statSum(slot)
		if err != nil {
			return 0, 0, false, err
		}
		if counter, err = tr.readCounter(); err != nil {
			return 0, 0, false, err
		}
		e2, err := tr.statSum(slot)
		if err != nil {
			return 0, 0, false, err
		}
		events = e1 + (e2-e1)/2
		if e2-e1 <= pairSpread {
			return counter, events, true, nil
		}
	}
	return counter, events, false, nil
}

// dropShortfall: a calibrated counter is dropped when it grows less than
// the window's counted events minus 1/dropShortfall of them.
const dropShortfall = 4

// calSteps is how many checkpoints a window has while calibrating, each at
// least calStepMin long (reading the candidate blocks takes a while).
const (
	calSteps   = 4
	calStepMin = 1500 * time.Microsecond
)

func (tr *Tracker) calibrating() bool {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.cal != nil
}

// checkpoint reads the calibration's candidates in the middle of a window
// (the gate stays open), to be tested once the window closes. Called with
// mu held.
func (tr *Tracker) checkpoint() {
	if tr.cal == nil || !tr.attached {
		return
	}
	ev0, err := tr.statSum(statObjects)
	if err != nil {
		return
	}
	now, ok := tr.calRead()
	if !ok {
		return
	}
	ev, err := tr.statSum(statObjects)
	if err != nil {
		return
	}
	tr.calPoints = append(tr.calPoints, calPoint{now: now, sure: ev0 - tr.winEvents, events: ev - tr.winEvents})
	tr.winEvents = ev
}

// calPoint is one read of the calibration's blocks while the probes were
// attached: events were counted since the previous read, sure of them
// before this one began, and past more came after the window's mark
// ended it (not counted, yet allocated before the read).
type calPoint struct {
	now                [][]uint64
	sure, events, past uint64
}

// maxRecalibrations bounds how often a calibrated counter that failed
// the check is looked for again.
const maxRecalibrations = 3

// dropCounter stops trusting the counter. A calibrated one is looked for
// again: a sum of size-pool counters holds only the pools that allocated
// while it was found, and one that starts allocating later fails the
// check. Until a new one is found (and after maxRecalibrations), counts
// are scaled by time; a new counter's scale covers the windows since it
// was found.
func (tr *Tracker) dropCounter(why string) {
	tr.counterNote = fmt.Sprintf("Ruby's allocation counter (%s) dropped: %s", tr.counter.source, why)
	tr.counter = nil
	tr.counterStart, tr.counterEnd, tr.counterOn, tr.winCounter = 0, 0, 0, 0
	tr.counterEvents, tr.calEvents, tr.calPast = 0, 0, 0
	tr.counterEndHow = ""
	if tr.calVM == 0 || tr.opts.Exact || tr.recalibrations >= maxRecalibrations || tr.exitFired() {
		return
	}
	cal, err := newCalibration(tr.t, tr.calVM, tr.calSize)
	if err != nil {
		tr.counterNote += fmt.Sprintf("; calibrating again: %v", err)
		return
	}
	cal.forVersion(tr.rb.Version())
	tr.cal = cal
	tr.recalibrations++
	tr.counterNote += "; calibrating again"
}

// scaling returns the factor counts are multiplied by, how it was found
// ("exact", "counter", "time") and Ruby's own count of the allocations
// since counting began (0 when unknown). Called with mu held.
func (tr *Tracker) scaling(now time.Time, dur time.Duration) (scale float64, how string, rubyTotal uint64) {
	scale = float64(tr.opts.SamplePeriod)
	var cur uint64
	if tr.counter != nil {
		cur = tr.counterEnd
		if !tr.stopped {
			if v, err := tr.readCounter(); err == nil {
				cur = v
			}
		}
		if cur >= tr.counterStart {
			rubyTotal = cur - tr.counterStart
		}
	}
	if tr.opts.Exact {
		return scale, "exact", rubyTotal
	}
	if tr.counter != nil {
		on := tr.counterOn + tr.calOn()
		if tr.attached && cur >= tr.winCounter {
			on += cur - tr.winCounter
		}
		if on > 0 {
			return scale * float64(rubyTotal) / float64(on), "counter", rubyTotal
		}
	}
	on := tr.onTotal
	if tr.attached {
		on += now.Sub(tr.onSince)
	}
	if on > 0 {
		scale *= float64(dur) / float64(on)
	}
	return scale, "time", rubyTotal
}

// calSlack is how many allocations a window may count beyond the growth of
// Ruby's counter: one whose probe fired just before the gate closed may
// be counted by Ruby just after the counter was read (one per thread).
const calSlack = 16

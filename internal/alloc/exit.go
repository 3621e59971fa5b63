package alloc

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/cilium/ebpf/ringbuf"
)

// The exit probe (exitFunc's entry, see bpf/alloc.bpf.c) copies Ruby's
// allocation counter when Ruby tears down, so that a process that exits
// while rbscope counts still has its total read to the end: once it is
// gone its memory cannot be read, and the default mode's last read may
// be a whole duty window (100 ms) old, most of a short job (CI: totals
// 7.5-26 % low on a 0.3 s loop). The program copies what user space
// names in exit_ranges: the counter's words once known, or, while the
// counter is still being calibrated, the blocks holding its candidates.

// How Ruby's counter was last read, as Report.CounterEnd says.
const (
	counterEndLive = "live"      // read from the running process
	counterEndStop = "stop"      // read when counting stopped
	counterEndExit = "exit"      // copied by the exit probe at Ruby's teardown
	counterEndLost = "last read" // the process ended without Ruby's teardown
)

// exitRanges and exitRangeMax are the eBPF program's EXIT_RANGES and
// EXIT_RANGE_MAX.
const (
	exitRanges   = 256
	exitRangeMax = 2048
)

// exitCapture is the tracker's side of the exit probe.
type exitCapture struct {
	// ranges are those the program copies now, gen the exit_gen they were
	// written under (even).
	ranges []allocExitRange
	gen    uint64
	// prevRanges and prevGen are the ones before: the probe may have
	// copied them just before they were rewritten.
	prevRanges []allocExitRange
	prevGen    uint64
	// copy is what the program copied, once Ruby's teardown began and the
	// copy was found consistent (nil before); fired is set with it, and
	// also when the copy was taken across a rewrite of the ranges
	// (unusable: copy stays nil).
	fired bool
	copy  *exitCopy
	err   error // why fired without a copy
	// rd reads the program's wake-up at exit; woke is closed once it
	// came and the names were read, done when watchExit returns.
	rd         *ringbuf.Reader
	woke, done chan struct{}
}

// watchExit waits for the exit probe's wake-up, then reads the names the
// tracker still lacks (the class and file names of sites first counted
// since the last read) while Ruby tears down: they go with the process.
func (tr *Tracker) watchExit() {
	defer close(tr.exit.done)
	if _, err := tr.exit.rd.Read(); err != nil {
		return // closed
	}
	tr.resolveNames()
	close(tr.exit.woke)
}

// exitWoke is closed once the exit probe fired and the names were read;
// nil (never ready) without an exit probe.
func (tr *Tracker) exitWoke() <-chan struct{} { return tr.exit.woke }

// exitCopy is the target's memory at exit: the ranges named and their
// bytes.
type exitCopy struct {
	ranges []allocExitRange
	data   [][]byte
}

// word returns the 8-byte word at addr, if a range covers it.
func (c *exitCopy) word(addr uint64) (uint64, bool) {
	for i, r := range c.ranges {
		if addr >= r.Addr && addr+8 <= r.Addr+uint64(r.Len) {
			return binary.LittleEndian.Uint64(c.data[i][addr-r.Addr:]), true
		}
	}
	return 0, false
}

// sum returns the sum of the words at addrs, if all are covered.
func (c *exitCopy) sum(addrs []uint64) (uint64, bool) {
	var s uint64
	for _, a := range addrs {
		v, ok := c.word(a)
		if !ok {
			return 0, false
		}
		s += v
	}
	return s, true
}

// errExitUncopied: Ruby tore down, but the exit probe did not copy the
// counter (it was not known, or the ranges were being rewritten).
var errExitUncopied = errors.New("Ruby's teardown began and its allocation counter was not copied")

// syncExitRanges writes wantExitRanges to the program's map when they
// changed, between two changes of exit_gen. Called with mu held (or
// before the tracker is shared).
func (tr *Tracker) syncExitRanges() {
	if tr.maps.ExitRanges == nil || !tr.plan.HasExitProbe() || tr.exitFired() {
		return
	}
	want := tr.wantExitRanges()
	if tr.exit.gen != 0 && slices.Equal(want, tr.exit.ranges) {
		return
	}
	gen := tr.exit.gen + 1 // odd: being written
	if err := tr.maps.ExitGen.Put(uint32(0), gen); err != nil {
		tr.exit.err = fmt.Errorf("name the ranges to copy at exit: %w", err)
		return
	}
	// The program stops at the first empty range.
	for i := 0; i <= len(want) && i < exitRanges; i++ {
		r := allocExitRange{}
		if i < len(want) {
			r = want[i]
		}
		if err := tr.maps.ExitRanges.Put(uint32(i), &r); err != nil {
			tr.exit.err = fmt.Errorf("name the ranges to copy at exit: %w", err)
			return
		}
	}
	gen++
	if err := tr.maps.ExitGen.Put(uint32(0), gen); err != nil {
		tr.exit.err = fmt.Errorf("name the ranges to copy at exit: %w", err)
		return
	}
	tr.exit.prevGen, tr.exit.prevRanges = tr.exit.gen, tr.exit.ranges
	tr.exit.gen, tr.exit.ranges = gen, want
}

// exitFired reports whether Ruby's teardown began (the exit probe fired),
// and once it has, reads the copy. Called with mu held.
func (tr *Tracker) exitFired() bool {
	if tr.exit.fired {
		return true
	}
	if tr.maps.ExitInfo == nil || !tr.plan.HasExitProbe() {
		return false
	}
	var st allocExitState
	if err := tr.maps.ExitInfo.Lookup(uint32(0), &st); err != nil || st.Done == 0 {
		return false
	}
	tr.exit.fired = true
	tr.names.fromExit(st)
	// The ranges the program copied: those written under the generation
	// it saw, unchanged while it copied.
	var ranges []allocExitRange
	switch {
	case st.GenBefore != st.GenAfter || st.GenBefore%2 != 0:
		tr.exit.err = errors.New("the ranges to copy were being rewritten when Ruby tore down")
		return true
	case st.GenBefore == tr.exit.gen:
		ranges = tr.exit.ranges
	case st.GenBefore == tr.exit.prevGen:
		ranges = tr.exit.prevRanges
	default:
		tr.exit.err = fmt.Errorf("the copy taken at exit names ranges of generation %d, not %d", st.GenBefore, tr.exit.gen)
		return true
	}
	switch {
	case st.Failed > 0:
		tr.exit.err = fmt.Errorf("%d of %d ranges could not be read at exit", st.Failed, st.Failed+st.Copied)
		return true
	case int(st.Copied) < len(ranges):
		tr.exit.err = fmt.Errorf("%d of %d ranges copied at exit", st.Copied, len(ranges))
		return true
	}
	c := &exitCopy{ranges: ranges}
	for i, r := range ranges {
		var w allocExitWords
		if err := tr.maps.ExitCopy.Lookup(uint32(i), &w); err != nil {
			tr.exit.err = fmt.Errorf("read the copy taken at exit: %w", err)
			return true
		}
		c.data = append(c.data, slices.Clone(w.Data[:r.Len]))
	}
	tr.exit.copy = c
	return true
}

// fromExit adds to the names the ones the exit probe copied: those of the
// exiting CPU's last site, unless already read.
func (n *names) fromExit(st allocExitState) {
	add := func(addr uint64, b []int8) {
		if addr == 0 {
			return
		}
		if _, ok := n.strs[addr]; ok {
			return
		}
		s := make([]byte, 0, len(b))
		for _, c := range b {
			if c == 0 {
				break
			}
			s = append(s, byte(c))
		}
		n.strs[addr] = string(s)
	}
	add(st.LastCls, st.ClsName[:])
	add(st.LastFile, st.FileName[:])
}

// readCounter reads Ruby's allocation counter: live, or, once Ruby's
// teardown began (when the object space is being freed, then gone), from
// the exit probe's copy. A live read that Ruby's teardown overtook is
// replaced by the copy. Called with mu held.
func (tr *Tracker) readCounter() (uint64, error) {
	if !tr.exitFired() {
		v, err := tr.counter.read()
		if !tr.exitFired() {
			return v, err
		}
	}
	if tr.exit.copy != nil {
		if v, ok := tr.exit.copy.sum(tr.counter.addrs); ok {
			return v, nil
		}
	}
	if tr.exit.err != nil {
		return 0, fmt.Errorf("%w: %w", errExitUncopied, tr.exit.err)
	}
	return 0, errExitUncopied
}

// calRead reads the calibration's blocks: live, or from the exit probe's
// copy once Ruby's teardown began; ok is false when the copy does not hold
// every live block. Called with mu held.
func (tr *Tracker) calRead() (now [][]uint64, ok bool) {
	if !tr.exitFired() {
		now = tr.cal.read()
		if !tr.exitFired() {
			return now, true
		}
	}
	c := tr.exit.copy
	if c == nil {
		return nil, false
	}
	now = make([][]uint64, len(tr.cal.regions))
	for i, a := range tr.cal.regions {
		if tr.cal.live != nil && !tr.cal.live[i] {
			continue
		}
		w := make([]uint64, calWords)
		for k := range w {
			v, found := c.word(a + uint64(k)*8)
			if !found {
				return nil, false
			}
			w[k] = v
		}
		now[i] = w
	}
	return now, true
}

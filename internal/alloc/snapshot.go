package alloc

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/cilium/ebpf"
)

// Stats slots, as in the eBPF program.
const (
	statEvents = iota
	statSampled
	statSitesFull
	statClassesFull
	statArgErrors
	statGCMarkNS
	statGCMarkCount
	statGCSweepNS
	statGCSweepCount
	statObjects
	statStacks     // stacks copied to the ring buffer
	statStacksLost // stacks the ring buffer had no room for
	statKeys       // keys added to the site and class maps
	statTracked    // retained mode: objects whose address was paired
	statRetBad     // ... paired with a value that is no object of the kind
	statTrackFull  // ... that the tracked map had no room for
	statDied       // tracked objects unmarked when a sweep began
	statChecks     // sweeps that checked the tracked objects
	statPending    // create events left for their allocation to return
	statSeen       // allocation events seen while attached, gate open or not
	statPastEnd    // events after the window ended at its start's recurrence
	statMax        = 24
)

// AnonymousClass names the objects of anonymous classes (Class.new),
// which are counted together: their names are temporary strings.
const AnonymousClass = "(anonymous class)"

// anonClass is the eBPF program's marker for anonymous classes.
const anonClass = 1

// ClassCount is the allocations of one class.
type ClassCount struct {
	Class string `json:"class"`
	Count uint64 `json:"count"`
	// Bytes is the payload size the probes report: string lengths for
	// String, 8 bytes per element for Array; 0 where the probe gives no
	// size (object__create, hash__create, symbol__create).
	Bytes uint64 `json:"bytes"`
}

// SiteCount is the allocations of one class at one file:line.
type SiteCount struct {
	Class string `json:"class"`
	Path  string `json:"path"`
	Line  int    `json:"line"`
	Count uint64 `json:"count"`
	Bytes uint64 `json:"-"`
}

// Report is the cumulative count since Attach, names resolved and scaled
// when sampling or duty-cycling. ByClass and BySite are sorted by count,
// descending (then by name).
type Report struct {
	Pid       int           `json:"pid"`
	Duration  time.Duration `json:"-"`
	Estimated bool          `json:"estimated"`
	ByClass   []ClassCount  `json:"by_class"`
	BySite    []SiteCount   `json:"by_site"`

	// Mode is "usdt" or "symbols"; in "symbols" mode sites have no
	// file:line.
	Mode string `json:"-"`
	// ClassesOnly: counted by class only (Options.NoSites), BySite empty.
	ClassesOnly bool `json:"-"`
	// Scale is the factor raw counts were multiplied by.
	Scale float64 `json:"-"`
	// Scaling says how Scale was found: "exact" (every event counted,
	// Scale is the sample period), "counter" (counting windows scaled by
	// Ruby's own allocation counter: unbiased however much the probes
	// slow the target), "time" (windows scaled by wall time, when the
	// counter could not be found: biased low on allocation-bound loops).
	Scaling string `json:"-"`
	// RubyAllocated is Ruby's own count of the objects allocated while
	// rbscope counted (GC.stat(:total_allocated_objects) growth, which
	// includes internal objects no probe reports); 0 when unknown.
	RubyAllocated uint64 `json:"-"`
	// CounterSource says where Ruby's counter was read from, or why it
	// was not.
	CounterSource string `json:"-"`
	// CounterEnd says how Ruby's counter was last read: "live" (counting
	// goes on), "stop" (when counting stopped), "exit" (copied by the
	// exit probe when Ruby tore down: the process exited, and the totals
	// run to its end), "last read" (the process ended without Ruby's
	// teardown, exit! or a signal: what it allocated after the last
	// counting window is not in the totals); "" without a counter.
	CounterEnd string `json:"-"`
	// LooseWindows counts the counting windows whose growth of Ruby's
	// counter was taken at the others' growth per event, because an edge
	// could not be read tightly (the tracker preempted mid-read).
	LooseWindows int `json:"-"`
	// ExitProbe is false when the Ruby binary has no exitFunc to hook:
	// a process that exits then loses what it allocated after the last
	// counting window.
	ExitProbe bool `json:"-"`
	// Attached is the fraction of the time the probes were counting.
	Attached float64 `json:"-"`
	// Events is the number of allocation probe hits the kernel saw
	// (before sampling), Counted how many were counted.
	Events, Counted uint64 `json:"-"`
	// SitesDropped counts events whose file:line did not fit in the
	// kernel's site table (their class is still counted unless
	// ClassesDropped says the class table was full too).
	SitesDropped, ClassesDropped, ArgErrors uint64 `json:"-"`
	// GC time and phase counts from the gc__mark/gc__sweep probes,
	// which stay attached the whole session in every mode (never
	// sampled nor duty-cycled): every GC since Attach. GCMarks is
	// GC.count's growth (one mark phase starts every GC).
	GCMark, GCSweep   time.Duration `json:"-"`
	GCMarks, GCSweeps uint64        `json:"-"`
	UnreadableNames   uint64        `json:"-"`
	// Stacks are the Ruby stacks of sampled allocations, counts scaled
	// to the class totals; StackSamples how many were copied,
	// StackErrors how many could not be walked, StackError why (or why
	// there are none).
	Stacks                    []StackCount `json:"-"`
	StackSamples, StackErrors uint64       `json:"-"`
	StackError                string       `json:"-"`
	// Retained: the report is the retained view (Options.Retained):
	// ByClass, BySite and Stacks count the objects created while
	// rbscope watched and still alive at the end, with their bytes
	// (slot and malloc'd), scaled by Scale; RetainedInfo says how it
	// was made.
	Retained     bool          `json:"-"`
	RetainedInfo *RetainedInfo `json:"-"`
}

// Snapshot reads the kernel's counters and returns the cumulative report.
func (tr *Tracker) Snapshot() (*Report, error) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.dutyErr != nil {
		return nil, fmt.Errorf("re-attach for duty cycle: %w", tr.dutyErr)
	}
	now := time.Now()
	if tr.stopped && !tr.end.IsZero() {
		now = tr.end
	}
	r := tr.newReport(now)

	stats, err := readStats(tr.maps.Stats)
	if err != nil {
		return nil, err
	}
	r.Events, r.Counted = stats[statEvents], stats[statSampled]
	r.SitesDropped, r.ClassesDropped, r.ArgErrors = stats[statSitesFull], stats[statClassesFull], stats[statArgErrors]
	r.GCMark, r.GCSweep = time.Duration(stats[statGCMarkNS]), time.Duration(stats[statGCSweepNS])
	r.GCMarks, r.GCSweeps = stats[statGCMarkCount], stats[statGCSweepCount]

	sites, err := readSites(tr.maps.Sites, tr.maps.LastSite)
	if err != nil {
		return nil, err
	}
	classes, err := readPerCPU[allocClassKey](tr.maps.Classes)
	if err != nil {
		return nil, fmt.Errorf("read class counts: %w", err)
	}
	tr.countAllocations(r, classes, sites)
	sortReport(r)
	r.Stacks = tr.scaledStacks(r.ByClass)
	r.StackSamples, r.StackErrors, r.StackError = tr.stacks.total, tr.stacks.walkErrors, tr.stacks.lastErr
	if tr.ret != nil {
		tr.fillRetained(r)
	}
	return r, nil
}

// newReport starts the report of the session up to now: its duration,
// how the counts scale (r.Scale) and where Ruby's allocation counter came
// from, and the share of the time the probes were counting.
func (tr *Tracker) newReport(now time.Time) *Report {
	r := &Report{Pid: tr.pid, Duration: now.Sub(tr.start), Mode: tr.plan.Mode, ClassesOnly: tr.opts.NoSites}
	scale, how, rubyTotal := tr.scaling(now, r.Duration)
	r.Scale, r.Scaling, r.RubyAllocated = scale, how, rubyTotal
	r.Estimated = how != "exact" || scale != 1
	r.ExitProbe = tr.plan.HasExitProbe()
	r.LooseWindows = tr.looseWindows
	if tr.counter != nil {
		r.CounterSource = tr.counter.source
		r.CounterEnd = tr.counterEndHow
		if r.CounterEnd == "" {
			r.CounterEnd = counterEndLive
		}
	} else {
		r.CounterSource = tr.counterNote
	}
	if on := tr.onTotal; r.Duration > 0 {
		if tr.attached {
			on += now.Sub(tr.onSince)
		}
		r.Attached = float64(on) / float64(r.Duration)
	}
	return r
}

// countAllocations fills r.ByClass and (unless classes only) r.BySite,
// unsorted, from the kernel's class and site counts, scaled by r.Scale.
func (tr *Tracker) countAllocations(r *Report, classes map[allocClassKey]allocCounter, sites map[allocSiteKey]allocCounter) {
	scale := r.Scale
	sc := func(v uint64) uint64 { return uint64(math.Round(float64(v) * scale)) }

	// Class totals: the sites' sums, plus the class map, which holds only
	// events whose site did not fit in the site map.
	byClass := map[string]*ClassCount{}
	addClass := func(name string, c allocCounter) {
		cc := byClass[name]
		if cc == nil {
			cc = &ClassCount{Class: name}
			byClass[name] = cc
		}
		cc.Count += c.Count
		cc.Bytes += c.Bytes
	}
	for k, c := range classes {
		addClass(tr.className(Kind(k.Kind), k.Cls, r), c)
	}
	type siteID struct {
		class, path string
		line        int
	}
	bySite := map[siteID]*SiteCount{}
	for k, c := range sites {
		name := tr.className(Kind(k.Kind), k.Cls, r)
		path := ""
		if k.File != 0 {
			p, err := tr.names.cString(k.File)
			if err != nil {
				r.UnreadableNames++
				p = fmt.Sprintf("(unreadable 0x%x)", k.File)
			}
			path = p
		}
		addClass(name, c)
		if tr.opts.NoSites {
			continue
		}
		id := siteID{name, path, int(int32(k.Line))}
		s := bySite[id]
		if s == nil {
			s = &SiteCount{Class: name, Path: path, Line: id.line}
			bySite[id] = s
		}
		s.Count += c.Count
		s.Bytes += c.Bytes
	}
	r.ByClass = make([]ClassCount, 0, len(byClass))
	for _, c := range byClass {
		c.Count, c.Bytes = sc(c.Count), sc(c.Bytes)
		r.ByClass = append(r.ByClass, *c)
	}
	r.BySite = make([]SiteCount, 0, len(bySite))
	for _, s := range bySite {
		s.Count, s.Bytes = sc(s.Count), sc(s.Bytes)
		r.BySite = append(r.BySite, *s)
	}
}

// resolveNames reads the class and file names of every site counted so
// far that has none yet, while the process lives: a process that exits
// takes its memory, and the names, with it. Failed reads are retried at
// the next call (and at Snapshot).
//
// The site map is read only when the program added keys since the last
// read (statKeys): on a large application it holds thousands of sites
// per CPU, and this runs after every counting window. The CPUs' last
// sites, which reach the map only when another site comes, are read
// every time.
func (tr *Tracker) resolveNames() {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.closed {
		return
	}
	var scratch Report // unreadable names are counted by Snapshot
	name := func(k allocSiteKey) {
		tr.className(Kind(k.Kind), k.Cls, &scratch)
		if k.File != 0 {
			tr.names.cString(k.File)
		}
	}
	keys, err := tr.statSum(statKeys)
	if err != nil {
		return
	}
	if keys == tr.namedKeys {
		var last []allocLastSite
		if err := tr.maps.LastSite.Lookup(uint32(0), &last); err != nil {
			return
		}
		for _, l := range last {
			if l.C.Count > 0 {
				name(l.Key)
			}
		}
		return
	}
	sites, err := readSites(tr.maps.Sites, tr.maps.LastSite)
	if err != nil {
		return
	}
	for k := range sites {
		name(k)
	}
	classes, err := readPerCPU[allocClassKey](tr.maps.Classes)
	if err != nil {
		return
	}
	for k := range classes {
		tr.className(Kind(k.Kind), k.Cls, &scratch)
	}
	tr.namedKeys = keys
}

func sortReport(r *Report) {
	sort.Slice(r.ByClass, func(i, j int) bool {
		a, b := r.ByClass[i], r.ByClass[j]
		if a.Count != b.Count {
			return a.Count > b.Count
		}
		return a.Class < b.Class
	})
	sort.Slice(r.BySite, func(i, j int) bool {
		a, b := r.BySite[i], r.BySite[j]
		if a.Count != b.Count {
			return a.Count > b.Count
		}
		if a.Path != b.Path {
			return a.Path < b.Path
		}
		if a.Line != b.Line {
			return a.Line < b.Line
		}
		return a.Class < b.Class
	})
}

func (tr *Tracker) className(k Kind, cls uint64, r *Report) string {
	switch k {
	case KindObject:
		if cls == 0 || cls == anonClass {
			return AnonymousClass
		}
		s, err := tr.names.cString(cls)
		if err != nil {
			r.UnreadableNames++
			return fmt.Sprintf("(unreadable 0x%x)", cls)
		}
		return s
	case KindNewobj:
		return tr.names.class(cls)
	}
	if s, ok := kindClass[k]; ok {
		return s
	}
	return fmt.Sprintf("(kind %d)", k)
}

func readStats(m *ebpf.Map) ([]uint64, error) {
	out := make([]uint64, statMax)
	for i := range out {
		var per []uint64
		if err := m.Lookup(uint32(i), &per); err != nil {
			return nil, fmt.Errorf("read stats: %w", err)
		}
		for _, v := range per {
			out[i] += v
		}
	}
	return out, nil
}

// readSites reads the site counts: the site map plus each CPU's last
// site (counts the program has not moved to the map yet). A count moves
// from a slot to the map while both are read: the slots are read before
// and after the map, and the read stands when no slot's seq moved in
// between (a few tries, then the last read: a slot moving on every read
// holds runs of a few events). Once the probes are detached, both are
// final.
func readSites(sites, last *ebpf.Map) (map[allocSiteKey]allocCounter, error) {
	var out map[allocSiteKey]allocCounter
	var after []allocLastSite
	for try := 0; try < readSitesTries; try++ {
		var before []allocLastSite
		if err := last.Lookup(uint32(0), &before); err != nil {
			return nil, fmt.Errorf("read the last site counted: %w", err)
		}
		var err error
		if out, err = readPerCPU[allocSiteKey](sites); err != nil {
			return nil, fmt.Errorf("read site counts: %w", err)
		}
		if err := last.Lookup(uint32(0), &after); err != nil {
			return nil, fmt.Errorf("read the last site counted: %w", err)
		}
		if sameSeqs(before, after) {
			break
		}
	}
	for _, l := range after {
		if l.C.Count == 0 {
			continue
		}
		c := out[l.Key]
		c.Count += l.C.Count
		c.Bytes += l.C.Bytes
		out[l.Key] = c
	}
	return out, nil
}

// readSitesTries bounds readSites' attempts at a read no move crossed.
const readSitesTries = 4

// sameSeqs reports whether no slot moved a count between two reads of
// the last sites (and none was moving during the first).
func sameSeqs(before, after []allocLastSite) bool {
	if len(before) != len(after) {
		return false
	}
	for i := range before {
		if before[i].Seq%2 != 0 || before[i].Seq != after[i].Seq {
			return false
		}
	}
	return true
}

// readPerCPU reads a per-CPU hash of counters, summing CPUs, with batch
// lookups (one syscall per 4096 entries) where the kernel has them.
func readPerCPU[K comparable](m *ebpf.Map) (map[K]allocCounter, error) {
	ncpu, err := ebpf.PossibleCPU()
	if err != nil {
		return nil, fmt.Errorf("count CPUs: %w", err)
	}
	out := map[K]allocCounter{}
	const batch = 4096
	keys := make([]K, batch)
	vals := make([]allocCounter, batch*ncpu)
	var cursor ebpf.MapBatchCursor
	for {
		n, err := m.BatchLookup(&cursor, keys, vals, nil)
		for i := 0; i < n; i++ {
			var sum allocCounter
			for c := 0; c < ncpu; c++ {
				v := vals[i*ncpu+c]
				sum.Count += v.Count
				sum.Bytes += v.Bytes
			}
			out[keys[i]] = sum
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return out, nil
		}
		if errors.Is(err, ebpf.ErrNotSupported) {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	// No batch operations: iterate.
	out = map[K]allocCounter{}
	var k K
	var per []allocCounter
	it := m.Iterate()
	for it.Next(&k, &per) {
		var sum allocCounter
		for _, v := range per {
			sum.Count += v.Count
			sum.Bytes += v.Bytes
		}
		out[k] = sum
	}
	if err := it.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

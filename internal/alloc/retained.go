package alloc

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"

	"github.com/rbscope/rbscope/internal/elfx"
	"github.com/rbscope/rbscope/internal/heap"
	"github.com/rbscope/rbscope/internal/stack"
)

// Retained mode (Options.Retained, `rbscope alloc --retained`): the
// objects created while rbscope watched and still alive at the end, by
// class and file:line and by Ruby stack, with their bytes: memprof's
// "objects created and not destroyed", from outside.
//
//   - Address: Ruby's create probes fire before the allocation. Each
//     counted create event is left pending for its thread; a probe on the
//     instruction after the allocation call that follows the create probe
//     (found by following the machine code from the probe, see
//     retsite.go) pairs it with the returned VALUE (rax), checked to be a
//     live object of the probe's type, and tracks it in the kernel with
//     its site, its klass and (one in RetainedStackPeriod) its stack.
//   - Death: when a GC's sweep begins, its mark bits say which objects it
//     frees: the program drops every tracked object whose bit is clear,
//     so that a slot freed and reused by an untracked object is never
//     taken for the tracked one.
//   - End: each tracked object's slot is read (package heap): it counts
//     if it still holds an object of the klass it was created with.
//     Objects that died after the last GC's marking are still in their
//     slots and count, as in memprof and ObjectSpace.
//
// In the default mode the probes count in windows (the duty cycle), so
// the tracked objects are a sample of those created; their counts are
// scaled as the allocation counts are (by Ruby's own allocation counter)
// and marked as estimates. Exact mode tracks every allocation.

// Default stack periods in retained mode: one tracked object in this many
// has its stack copied (fewer events are counted than in alloc's
// default: the stacks are per object).
const (
	DefaultRetainedStackPeriod      = 4
	DefaultRetainedExactStackPeriod = 64
)

// How many objects retained mode tracks at once (alive, or dead since the
// last GC's marking), at most: 80 bytes of kernel memory each. Objects
// past it are not tracked (RetainedInfo.Full counts them).
const (
	DefaultRetainedMax      = 1 << 16
	DefaultRetainedExactMax = 1 << 18
)

// ErrRetainedNoProbes: retained mode needs the create probes.
var ErrRetainedNoProbes = errors.New("--retained needs Ruby's USDT create probes (this Ruby has none): it follows each probe to the allocation it precedes")

// RetainedInfo says how the retained view was made.
type RetainedInfo struct {
	// Tracked is how many objects the kernel tracked (their address
	// paired with their create event), Died how many of those a GC's
	// marking found dead, Gone how many others were no longer in their
	// slot at the end (freed since the last marking, or the slot
	// reused: its class differs), Alive how many were still there.
	Tracked uint64 `json:"tracked"`
	Died    uint64 `json:"died_at_gc"`
	Gone    uint64 `json:"gone_at_end"`
	Alive   uint64 `json:"alive"`
	// Unpaired are counted create events whose allocation returned no
	// object of the probe's type, or whose probe has no return site
	// found (see Plan.RetSkipped); Full those the tracked map had no
	// room for.
	Unpaired uint64 `json:"unpaired"`
	// BadReturn are those whose return value was no object of the kind.
	BadReturn uint64 `json:"bad_return,omitempty"`
	Full      uint64 `json:"untracked_map_full,omitempty"`
	// Checks is how many GC sweeps checked the tracked objects.
	Checks uint64 `json:"gc_checks"`
	// CutShort: the process exited before the window's end; the view is
	// what was retained when Ruby's teardown began (the slots copied by
	// the exit probe), or, without it, unverified.
	CutShort bool   `json:"cut_short"`
	EndRead  string `json:"end_read"`
	// MarkBits says where the mark bits were found.
	MarkBits string `json:"mark_bits"`
	// Unresolved are tracked objects whose end state could not be read.
	Unresolved uint64 `json:"unresolved,omitempty"`
}

// retState is the tracker's retained-mode state; guarded by Tracker.mu.
type retState struct {
	heap  *heap.Heap
	marks heap.MarkBits
	// stacks maps a stack id to its frames' index in frames; equal
	// stacks are kept once (a long window copies thousands of the
	// same few).
	stacks   map[uint64]int32
	frames   [][]stack.Frame
	frameIdx map[string]int32
	// final is the retained view taken at Stop.
	final *retainedView
}

type retainedView struct {
	info    RetainedInfo
	objects []retObject
}

// retObject is one tracked object that is still alive.
type retObject struct {
	key   allocSiteKey
	bytes uint64
	id    uint64
}

// setupRetained prepares retained mode before the program is loaded:
// return sites in the plan, the heap's mark bits in the program.
func (tr *Tracker) setupRetained(spec *ebpf.CollectionSpec) error {
	if tr.plan.Mode != "usdt" {
		return ErrRetainedNoProbes
	}
	if tr.rb == nil {
		return fmt.Errorf("--retained reads the heap: %s", tr.counterNote)
	}
	r, err := tr.t.OpenFile(tr.plan.Binary)
	if err != nil {
		return fmt.Errorf("open %s to find its allocation calls: %w", tr.plan.Binary, err)
	}
	b, err := elfx.Open(r)
	if err != nil {
		r.Close()
		return fmt.Errorf("read ELF %s: %w", tr.plan.Binary, err)
	}
	addReturnSites(tr.plan, b.ELF())
	r.Close()
	objects := false
	for _, s := range tr.plan.Sites {
		if s.Kind == KindReturn {
			for _, o := range s.Origins {
				if tr.plan.Sites[o].Kind == KindObject {
					objects = true
				}
			}
		}
	}
	if !objects {
		return fmt.Errorf("--retained: no allocation call found after object__create in %s (%s)", tr.plan.Binary, strings.Join(tr.plan.RetSkipped, "; "))
	}
	h, err := heap.Open(tr.rb)
	if err != nil {
		return fmt.Errorf("--retained reads the heap: %w", err)
	}
	m, err := h.MarkBits()
	if err != nil {
		return fmt.Errorf("--retained: %w", err)
	}
	tr.ret = &retState{heap: h, marks: m, stacks: map[uint64]int32{}, frameIdx: map[string]int32{}}
	max := uint32(DefaultRetainedMax)
	if tr.opts.Exact {
		max = DefaultRetainedExactMax
	}
	spec.Maps[allocMapTracked].MaxEntries = max
	for name, v := range map[string]any{
		allocVarTrackedMax:  max,
		allocVarRetained:    uint32(1),
		allocVarHeapAlign:   m.Align,
		allocVarMarkBitsOff: uint32(m.Offset),
	} {
		if err := spec.Variables[name].Set(v); err != nil {
			return fmt.Errorf("set %s: %w", name, err)
		}
	}
	return nil
}

// retProbeSpec fills a return site's spec: its origins, index + 1.
func retProbeSpec(s Site, ps *allocProbeSpec) {
	for j, o := range s.Origins {
		if j < len(ps.Args) {
			ps.Args[j].Val = int64(o) + 1
		}
	}
}

// addRetainedStack keeps a tracked object's stack. Called with mu held.
func (tr *Tracker) addRetainedStack(id uint64, frames []stack.Frame) {
	if tr.ret != nil && id != 0 {
		var b strings.Builder
		for _, f := range frames {
			fmt.Fprintf(&b, "%s\x01%s\x01%d\x00", f.Name, f.Path, f.Line)
		}
		i, ok := tr.ret.frameIdx[b.String()]
		if !ok {
			i = int32(len(tr.ret.frames))
			tr.ret.frames = append(tr.ret.frames, frames)
			tr.ret.frameIdx[b.String()] = i
		}
		tr.ret.stacks[id] = i
	}
}

// collectRetained reads the tracked objects and keeps the alive ones:
// from their slots while the process lives, else from what the exit
// probe copied. Called with mu held, after the probes are detached.
func (tr *Tracker) collectRetained(exited bool) {
	v := &retainedView{}
	v.info.MarkBits = tr.ret.marks.Source
	if st, err := readStats(tr.maps.Stats); err == nil {
		v.info.Died, v.info.Checks, v.info.Full = st[statDied], st[statChecks], st[statTrackFull]
		v.info.Tracked, v.info.BadReturn = st[statTracked], st[statRetBad]
		if p := st[statPending]; p > st[statTracked]+st[statTrackFull] {
			v.info.Unpaired = p - st[statTracked] - st[statTrackFull]
		}
	}
	var addrs []uint64
	var vals []allocTrackedObj
	var n uint32
	if err := tr.maps.TrackedLen.Lookup(uint32(0), &n); err != nil {
		v.info.EndRead = fmt.Sprintf("unreadable: %v", err)
	}
	for i := uint32(0); i < n; i++ {
		var val allocTrackedObj
		if err := tr.maps.Tracked.Lookup(i, &val); err != nil {
			break
		}
		addrs = append(addrs, val.Addr)
		vals = append(vals, val)
	}
	var objs []heap.Object
	v.info.EndRead = "slots read at the end"
	if !exited {
		objs = tr.ret.heap.Objects(addrs)
		if len(objs) > 0 && !tr.Alive() {
			exited, objs = true, nil
		}
	}
	if exited {
		v.info.CutShort = true
		v.info.EndRead = "slots copied when Ruby's teardown began (the process exited)"
	}
	for i := range addrs {
		t := vals[i]
		var typ uint8
		var klass, bytes uint64
		switch {
		case objs != nil:
			o := objs[i]
			if o.Err != nil {
				v.info.Gone++
				continue
			}
			typ, klass, bytes = o.Type, o.Klass, o.Bytes
		case t.Ended != 0:
			// The slot's bytes cannot be read any more: its base
			// slot and what the probe said (a string's length, an
			// array's elements).
			typ, klass, bytes = uint8(t.EndFlags&0x1f), t.EndKlass, heapBaseSlot+t.Bytes
		default:
			v.info.Unresolved++
			continue
		}
		if typ == 0 || klass != t.Klass {
			v.info.Gone++
			continue
		}
		v.objects = append(v.objects, retObject{key: t.Key, bytes: bytes, id: t.Id})
	}
	if exited && len(addrs) > 0 && v.info.Unresolved == uint64(len(addrs)) {
		v.info.EndRead = "unverified: the process ended without Ruby's teardown"
	}
	v.info.Alive = uint64(len(v.objects))
	tr.ret.final = v
}

// heapBaseSlot is the smallest slot (sizeof(RVALUE)).
const heapBaseSlot = 40

// fillRetained replaces r's counts with the retained view: by class, by
// site and by stack, scaled by r.Scale. Called with mu held.
func (tr *Tracker) fillRetained(r *Report) {
	v := tr.ret.final
	r.Retained = true
	if v == nil {
		r.RetainedInfo = &RetainedInfo{MarkBits: tr.ret.marks.Source, EndRead: "not yet: the window is still open"}
		r.ByClass, r.BySite, r.Stacks = nil, nil, nil
		return
	}
	info := v.info
	r.RetainedInfo = &info
	sc := func(n uint64) uint64 { return uint64(math.Round(float64(n) * r.Scale)) }
	type siteID struct {
		class, path string
		line        int
	}
	bySite := map[siteID]*SiteCount{}
	byClass := map[string]*ClassCount{}
	stacks := map[string]*StackCount{}
	for _, o := range v.objects {
		class := tr.className(Kind(o.key.Kind), o.key.Cls, r)
		path := ""
		if o.key.File != 0 {
			p, err := tr.names.cString(o.key.File)
			if err != nil {
				p = fmt.Sprintf("(unreadable 0x%x)", o.key.File)
			}
			path = p
		}
		id := siteID{class, path, int(o.key.Line)}
		s := bySite[id]
		if s == nil {
			s = &SiteCount{Class: class, Path: path, Line: int(o.key.Line)}
			bySite[id] = s
		}
		s.Count++
		s.Bytes += o.bytes
		c := byClass[class]
		if c == nil {
			c = &ClassCount{Class: class}
			byClass[class] = c
		}
		c.Count++
		c.Bytes += o.bytes
		if fi, ok := tr.ret.stacks[o.id]; o.id != 0 && ok && len(tr.ret.frames[fi]) > 0 {
			frames := tr.ret.frames[fi]
			// Each object's site is known: a site's count is split
			// over the stacks copied at that site (not over all of
			// its class's: a site with one object keeps one).
			var b strings.Builder
			b.WriteString(retSiteKey(class, path, int(o.key.Line)))
			for _, f := range frames {
				fmt.Fprintf(&b, "\x00%s\x01%s\x01%d", f.Name, f.Path, f.Line)
			}
			st := stacks[b.String()]
			if st == nil {
				st = &StackCount{Class: retSiteKey(class, path, int(o.key.Line)), Frames: frames}
				stacks[b.String()] = st
			}
			st.Samples++
			st.Bytes += o.bytes
		}
	}
	r.ByClass, r.BySite = nil, nil
	for _, c := range byClass {
		c.Count, c.Bytes = sc(c.Count), sc(c.Bytes)
		r.ByClass = append(r.ByClass, *c)
	}
	for _, s := range bySite {
		s.Count, s.Bytes = sc(s.Count), sc(s.Bytes)
		r.BySite = append(r.BySite, *s)
	}
	sortReport(r)
	retainedStacks(r, stacks)
	r.StackSamples = 0
	for _, s := range stacks {
		r.StackSamples += s.Samples
	}
	if len(r.Stacks) == 0 && r.StackError == "" {
		r.StackError = fmt.Sprintf("no retained object had its stack copied (one tracked object in %d has)", tr.stackPeriod)
	}
}

// retainedStacks sets r.Stacks from the stacks of the retained objects
// (keyed by site, then frames), each site's scaled count (r.BySite,
// sorted) split over the stacks copied at it; a site without any keeps
// its count under a "(stack not sampled)" frame at the site.
func retainedStacks(r *Report, stacks map[string]*StackCount) {
	sites := make([]ClassCount, 0, len(r.BySite))
	for _, s := range r.BySite {
		sites = append(sites, ClassCount{Class: retSiteKey(s.Class, s.Path, s.Line), Count: s.Count, Bytes: s.Bytes})
	}
	r.Stacks = splitStacks(stacks, sites)
	// A site none of whose objects had its stack copied keeps its count
	// under the site alone, so that the stack views add up to the
	// report (pprof's total is the text's).
	stacked := map[string]bool{}
	for _, st := range r.Stacks {
		stacked[st.Class] = true
	}
	for i, s := range sites {
		if !stacked[s.Class] && s.Count > 0 {
			site := r.BySite[i]
			r.Stacks = append(r.Stacks, StackCount{Class: s.Class, Count: s.Count, Bytes: s.Bytes,
				Frames: []stack.Frame{{Name: "(stack not sampled)", Path: site.Path, Line: site.Line, Kind: stack.KindRuby}}})
		}
	}
	sortStacks(r.Stacks)
	for i := range r.Stacks {
		r.Stacks[i].Class, _, _ = strings.Cut(r.Stacks[i].Class, "\x00")
	}
}

// retSiteKey identifies a site among the retained stacks: the class first.
func retSiteKey(class, path string, line int) string {
	return class + "\x00" + path + "\x00" + strconv.Itoa(line)
}

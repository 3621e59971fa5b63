package alloc

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"

	"github.com/rbscope/rbscope/internal/ruby"
	"github.com/rbscope/rbscope/internal/stack"
	"github.com/rbscope/rbscope/internal/target"
)

// Default stack periods: one in this many counted allocations has its
// Ruby stack copied. The windows of the default mode count a few thousand
// events each; --exact counts them all.
const (
	DefaultStackPeriod      = 64
	DefaultExactStackPeriod = 4096
)

// StackCount is the allocations of one class from one Ruby stack (frames
// innermost first), estimated from the sampled stacks.
type StackCount struct {
	Class  string        `json:"class"`
	Count  uint64        `json:"count"`
	Bytes  uint64        `json:"bytes"`
	Frames []stack.Frame `json:"frames"`
	// Samples is how many stacks were copied for it.
	Samples uint64 `json:"samples"`
}

// stackAgg accumulates the sampled stacks; guarded by Tracker.mu.
type stackAgg struct {
	byKey map[string]*StackCount
	walkErrors,
	total uint64
	lastErr string
}

// stackVars sets the eBPF program's stack-capture variables from the
// walker's layout; false when stacks cannot be taken.
func (tr *Tracker) stackVars(spec *ebpf.CollectionSpec, period uint32) error {
	vm, err := tr.rb.VMAddress()
	if err != nil {
		return err
	}
	l := tr.rb.Layout()
	off := func(s, f string) (uint32, error) {
		o, err := l.Offset(s, f)
		return uint32(o), err
	}
	set := map[string]any{allocVarStkVm: vm, allocVarStackPeriod: period}
	for name, sf := range map[string][2]string{
		allocVarStkMainRactor:    {"rb_vm_struct", "ractor.main_ractor"},
		allocVarStkRunningEc:     {"rb_ractor_struct", "threads.running_ec"},
		allocVarStkEcVmStack:     {"rb_execution_context_struct", "vm_stack"},
		allocVarStkEcVmStackSize: {"rb_execution_context_struct", "vm_stack_size"},
		allocVarStkEcCfp:         {"rb_execution_context_struct", "cfp"},
		allocVarStkCfpSp:         {"rb_control_frame_struct", "sp"},
	} {
		o, err := off(sf[0], sf[1])
		if err != nil {
			return err
		}
		set[name] = o
	}
	for name, v := range set {
		if err := spec.Variables[name].Set(v); err != nil {
			return fmt.Errorf("set %s: %w", name, err)
		}
	}
	return nil
}

// readStacks names the stacks the program copies until the ring buffer is
// closed: it walks each copy with rbscope's walker, reading the copied
// execution context, control frames and top of the value stack instead of
// the live memory (which has moved on), and everything else (iseqs,
// method entries, names) live.
func (tr *Tracker) readStacks(rd *ringbuf.Reader, done chan<- struct{}) {
	defer close(done)
	ov := &overlay{Target: tr.t}
	// Stopped: the execution context and frames it walks are copies,
	// taken by the program while the thread allocated.
	walker, err := ruby.Open(context.Background(), ruby.Spec{Target: ov, Consistency: ruby.Stopped,
		Options: ruby.Options{Layout: tr.rb.Layout()}})
	if err != nil {
		tr.mu.Lock()
		tr.stacks.lastErr = fmt.Sprintf("open the walker: %v", err)
		tr.mu.Unlock()
		return
	}
	var rec ringbuf.Record
	for {
		if err := rd.ReadInto(&rec); err != nil {
			return // closed
		}
		if len(rec.RawSample) < int(unsafe.Sizeof(allocStackEvent{})) {
			continue
		}
		e := (*allocStackEvent)(unsafe.Pointer(&rec.RawSample[0]))
		ov.ranges = append(ov.ranges[:0],
			ovRange{e.Ec, e.EcData[:]},
			ovRange{e.Cfp, e.Cf[:min(e.CfLen, uint32(len(e.Cf)))]},
			ovRange{e.Vs, e.Vsd[:min(e.VsLen, uint32(len(e.Vsd)))]})
		frames, err := walkThread(walker, int(e.Tid))
		key := siteKeyOf(e)
		tr.mu.Lock()
		tr.addStack(key, e.Bytes, frames, err)
		if err == nil {
			tr.addRetainedStack(e.Id, frames)
		}
		tr.mu.Unlock()
	}
}

func siteKeyOf(e *allocStackEvent) allocSiteKey {
	return allocSiteKey{Cls: e.Cls, File: e.File, Line: e.Line, Kind: e.Kind}
}

// walkThread names the stack of thread tid, the one that allocated: the
// other threads' stacks are not read.
func walkThread(p *ruby.Process, tid int) ([]stack.Frame, error) {
	th, err := p.SnapshotThread(ruby.Req{}, tid)
	if err != nil {
		return nil, err
	}
	if th.Error != "" && len(th.Frames) == 0 {
		return nil, errors.New(th.Error)
	}
	return eventFrames(th.Frames), nil
}

// eventFrames drops the activity pseudo-frames the walker puts on top of
// a stack ((garbage collection), (marking), (waiting for the GVL)): it
// reads the GC state and the GVL live, when the copy is named, while an
// allocation's stack was copied at its probe, in Ruby code holding the
// GVL and never inside GC (Ruby refuses to allocate during GC). On the
// CI machine 9 % of a leak's stacks carried (marking) that way.
func eventFrames(fs []stack.Frame) []stack.Frame {
	for len(fs) > 0 && (fs[0].Kind == stack.KindGC || fs[0].Kind == stack.KindGVL) {
		fs = fs[1:]
	}
	return fs
}

// addStack counts one sampled stack. Called with mu held.
func (tr *Tracker) addStack(k allocSiteKey, bytes uint64, frames []stack.Frame, err error) {
	a := &tr.stacks
	if a.byKey == nil {
		a.byKey = map[string]*StackCount{}
	}
	a.total++
	if err != nil || len(frames) == 0 {
		a.walkErrors++
		if err != nil {
			a.lastErr = err.Error()
		}
		return
	}
	var scratch Report
	class := tr.className(Kind(k.Kind), k.Cls, &scratch)
	var b strings.Builder
	b.WriteString(class)
	for _, f := range frames {
		fmt.Fprintf(&b, "\x00%s\x01%s\x01%d", f.Name, f.Path, f.Line)
	}
	s := a.byKey[b.String()]
	if s == nil {
		s = &StackCount{Class: class, Frames: frames}
		a.byKey[b.String()] = s
	}
	s.Samples++
	s.Bytes += bytes
}

// scaledStacks returns the sampled stacks with counts estimated from the
// class totals: a class's count is split over its stacks in proportion to
// their samples, rounded so that they add up to it exactly. Sorted by
// count, descending. Called with mu held.
func (tr *Tracker) scaledStacks(byClass []ClassCount) []StackCount {
	return splitStacks(tr.stacks.byKey, byClass)
}

// splitStacks splits each class's count (and bytes) over its stacks in
// byKey in proportion to their samples (and bytes).
func splitStacks(byKey map[string]*StackCount, byClass []ClassCount) []StackCount {
	byCls := map[string][]*StackCount{}
	for _, s := range byKey {
		byCls[s.Class] = append(byCls[s.Class], s)
	}
	var out []StackCount
	for _, c := range byClass {
		list := byCls[c.Class]
		if len(list) == 0 {
			continue
		}
		var n, bytes uint64
		for _, s := range list {
			n += s.Samples
			bytes += s.Bytes
		}
		first := len(out)
		var given, givenBytes uint64
		for _, s := range list {
			sc := *s
			sc.Count = c.Count * s.Samples / n
			if bytes > 0 {
				sc.Bytes = c.Bytes * s.Bytes / bytes
			}
			given += sc.Count
			givenBytes += sc.Bytes
			out = append(out, sc)
		}
		// The remainders of the divisions go to the first stacks.
		for i := first; given < c.Count; i++ {
			out[first+(i-first)%len(list)].Count++
			given++
		}
		if bytes > 0 {
			out[first].Bytes += c.Bytes - givenBytes
		}
	}
	sortStacks(out)
	return out
}

func sortStacks(s []StackCount) {
	less := func(a, b *StackCount) bool {
		if a.Count != b.Count {
			return a.Count > b.Count
		}
		if a.Samples != b.Samples {
			return a.Samples > b.Samples
		}
		return a.Class < b.Class
	}
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && less(&s[j], &s[j-1]); j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

// overlay is the target as it was when a stack was copied: reads inside
// the copied ranges come from the copy, the rest from the live process.
type overlay struct {
	target.Target
	ranges []ovRange
}

type ovRange struct {
	addr uint64
	data []byte
}

func (o *overlay) inside(p []byte, addr uint64) bool {
	for _, r := range o.ranges {
		if addr >= r.addr && addr+uint64(len(p)) <= r.addr+uint64(len(r.data)) {
			copy(p, r.data[addr-r.addr:])
			return true
		}
	}
	return false
}

func (o *overlay) patch(p []byte, addr uint64) {
	end := addr + uint64(len(p))
	for _, r := range o.ranges {
		rend := r.addr + uint64(len(r.data))
		lo, hi := max(addr, r.addr), min(end, rend)
		if lo < hi {
			copy(p[lo-addr:hi-addr], r.data[lo-r.addr:hi-r.addr])
		}
	}
}

// ReadAt reads from the copy where it holds the bytes.
func (o *overlay) ReadAt(p []byte, addr uint64) error {
	if o.inside(p, addr) {
		return nil
	}
	if err := o.Target.ReadAt(p, addr); err != nil {
		return err
	}
	o.patch(p, addr)
	return nil
}

// ReadBatch reads from the copy where it holds the bytes, the rest in one
// batch.
func (o *overlay) ReadBatch(reqs []target.Read) error {
	rest := make([]target.Read, 0, len(reqs))
	for _, r := range reqs {
		if !o.inside(r.Buf, r.Addr) {
			rest = append(rest, r)
		}
	}
	if len(rest) > 0 {
		if err := o.Target.ReadBatch(rest); err != nil {
			return err
		}
		for _, r := range rest {
			o.patch(r.Buf, r.Addr)
		}
	}
	return nil
}

var _ = binary.LittleEndian

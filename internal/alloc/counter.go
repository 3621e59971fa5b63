package alloc

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	"github.com/rbscope/rbscope/internal/layout"
	"github.com/rbscope/rbscope/internal/ruby"
	"github.com/rbscope/rbscope/internal/target"
)

// rubyCounter reads Ruby's own count of the objects it has allocated, the
// number GC.stat(:total_allocated_objects) returns: one word of the object
// space (rb_objspace_t.total_allocated_objects, Ruby < 3.2) or the sum of
// one word per size pool (size_pools[i].total_allocated_objects, 3.2+).
// The default mode reads it whenever it opens or closes a counting window:
// the windows give the distribution, the counter the total, whatever the
// probes cost the target while attached.
type rubyCounter struct {
	t     target.Target
	addrs []uint64
	// source says where the addresses came from: "dwarf:<file>" or
	// "calibrated (...)".
	source string
}

func (c *rubyCounter) read() (uint64, error) {
	bufs := make([][8]byte, len(c.addrs))
	reqs := make([]target.Read, len(c.addrs))
	for i, a := range c.addrs {
		reqs[i] = target.Read{Addr: a, Buf: bufs[i][:]}
	}
	if err := c.t.ReadBatch(reqs); err != nil {
		return 0, fmt.Errorf("read Ruby's allocation counter: %w", err)
	}
	var sum uint64
	for _, b := range bufs {
		sum += binary.LittleEndian.Uint64(b[:])
	}
	return sum, nil
}

// counterStructs are the structs the counter's offsets come from.
var counterStructs = []string{"rb_vm_struct", "rb_objspace", "rb_size_pool_struct"}

// counterFromDWARF locates the counter with offsets from the DWARF of one
// of the process's Ruby binaries (or its separate debug file).
func counterFromDWARF(t target.Target, p *ruby.Process, vm uint64) (*rubyCounter, error) {
	var errs []error
	for _, b := range p.Info().Binaries {
		l, err := counterLayout(t, b.Path)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		c, err := counterFromLayout(t, l, vm)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", l.Source, err))
			continue
		}
		return c, nil
	}
	return nil, errors.Join(errs...)
}

// counterLayout reads the counter's structs from the DWARF of the binary
// the process mapped as path (never another file now at that path), or
// from its separate debug file.
func counterLayout(t target.Target, path string) (*layout.Layout, error) {
	f, err := t.OpenFile(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return layout.FromBinary(f, path, target.HostPath(t.Pid(), path), counterStructs, layout.WithDefaultDebugRoots(nil))
}

func counterFromLayout(t target.Target, l *layout.Layout, vm uint64) (*rubyCounter, error) {
	objOff, err := l.Offset("rb_vm_struct", "objspace")
	if err != nil {
		return nil, err
	}
	var ptr [8]byte
	if err := t.ReadAt(ptr[:], vm+objOff); err != nil {
		return nil, fmt.Errorf("read rb_vm_t.objspace: %w", err)
	}
	objspace := binary.LittleEndian.Uint64(ptr[:])
	if objspace == 0 {
		return nil, errors.New("rb_vm_t.objspace is NULL")
	}
	c := &rubyCounter{t: t, source: l.Source}
	if off, err := l.Offset("rb_objspace", "total_allocated_objects"); err == nil {
		c.addrs = []uint64{objspace + off}
		return c, nil
	}
	pools, err := l.Field("rb_objspace", "size_pools")
	if err != nil {
		return nil, fmt.Errorf("no total_allocated_objects in rb_objspace nor size pools: %w", err)
	}
	poolSize, err := l.Size("rb_size_pool_struct")
	if err != nil {
		return nil, err
	}
	inPool, err := l.Offset("rb_size_pool_struct", "total_allocated_objects")
	if err != nil {
		return nil, err
	}
	if poolSize == 0 || pools.Size%poolSize != 0 || pools.Size/poolSize > 64 {
		return nil, fmt.Errorf("size_pools is %d bytes, a pool %d", pools.Size, poolSize)
	}
	for i := uint64(0); i < pools.Size/poolSize; i++ {
		c.addrs = append(c.addrs, objspace+pools.Offset+i*poolSize+inPool)
	}
	return c, nil
}

// calibration finds the counter where no DWARF says where it is: among the
// words near the start of every block the VM struct points to (the object
// space is one), the one that never decreases and grows in every counting
// window by at least the number of allocations the probes counted in it,
// by the least margin. The check goes on after the choice: a window in
// which the chosen word grows by less than the events counted drops it
// (the report then falls back to scaling by time).
type calibration struct {
	t       target.Target
	regions []uint64   // block addresses
	cands   []calCand  // surviving candidates
	first   [][]uint64 // words of each region when the first window opened
	last    [][]uint64 // words of each region at the last read
	windows int        // windows with events seen
	events  uint64     // events in all windows
}

type calCand struct {
	region, word int
	grown        uint64 // sum over windows of the word's growth
}

const (
	calWords      = 64   // words read from the start of each block
	calMaxRegions = 2048 // blocks considered
	// calMinWindows and calMinEvents are what a choice needs: the
	// counter of a process that does not allocate cannot be told apart.
	calMinWindows = 2
	calMinEvents  = 2000
	calMaxRatio   = 50
)

// newCalibration lists the blocks that rb_vm_t (vmSize bytes at vm)
// points to.
func newCalibration(t target.Target, vm, vmSize uint64) (*calibration, error) {
	if vmSize == 0 || vmSize > 1<<20 {
		return nil, fmt.Errorf("rb_vm_t size %d", vmSize)
	}
	buf := make([]byte, vmSize-vmSize%8)
	if err := t.ReadAt(buf, vm); err != nil {
		return nil, fmt.Errorf("read rb_vm_t: %w", err)
	}
	maps, err := t.Mappings()
	if err != nil {
		return nil, fmt.Errorf("read mappings: %w", err)
	}
	writable := func(a uint64) bool {
		for _, m := range maps {
			if m.Contains(a) {
				return strings.Contains(m.Perms, "w") && m.Contains(a+calWords*8-1)
			}
		}
		return false
	}
	c := &calibration{t: t}
	seen := map[uint64]bool{}
	for i := 0; i+8 <= len(buf) && len(c.regions) < calMaxRegions; i += 8 {
		a := binary.LittleEndian.Uint64(buf[i:])
		if a < 4096 || a&7 != 0 || seen[a] || !writable(a) {
			continue
		}
		seen[a] = true
		c.regions = append(c.regions, a)
	}
	if len(c.regions) == 0 {
		return nil, errors.New("rb_vm_t points to no writable memory")
	}
	return c, nil
}

// read returns the words of every region (nil for one that cannot be read).
func (c *calibration) read() [][]uint64 {
	out := make([][]uint64, len(c.regions))
	bufs := make([]byte, len(c.regions)*calWords*8)
	reqs := make([]target.Read, len(c.regions))
	for i, a := range c.regions {
		reqs[i] = target.Read{Addr: a, Buf: bufs[i*calWords*8 : (i+1)*calWords*8]}
	}
	batchErr := c.t.ReadBatch(reqs)
	for i := range c.regions {
		b := reqs[i].Buf
		if batchErr != nil {
			if c.t.ReadAt(b, reqs[i].Addr) != nil {
				continue
			}
		}
		w := make([]uint64, calWords)
		for j := range w {
			w[j] = binary.LittleEndian.Uint64(b[j*8:])
		}
		out[i] = w
	}
	return out
}

// open records the words at the start of a window.
func (c *calibration) open() {
	c.last = c.read()
	if c.first == nil {
		c.first = c.last
	}
}

// close reads the words at the end of a window in which the probes counted
// events and prunes the candidates. Once one stands out it returns the
// counter, its value when the first window opened, and its growth in all
// windows so far (nil before).
//
// now is c.read() at the end of the window; events were counted in it
// (they go to the totals), sure of them were counted before now was read
// began (the check: reading every block takes a while, and the counter's
// word may have been read late in it).
func (c *calibration) close(now [][]uint64, sure, events uint64) (counter *rubyCounter, start, grown, cur uint64) {
	prev := c.last
	c.last = now
	if prev == nil {
		return nil, 0, 0, 0
	}
	grew := func(r, w int) (uint64, bool) {
		if prev[r] == nil || now[r] == nil || now[r][w] < prev[r][w] {
			return 0, false
		}
		d := now[r][w] - prev[r][w]
		return d, d+calSlack >= sure
	}
	if c.cands == nil {
		// Every word that has not decreased since the first window.
		for r := range c.regions {
			for w := 0; w < calWords; w++ {
				if c.first[r] == nil || now[r] == nil || now[r][w] < c.first[r][w] || now[r][w]-c.first[r][w] > 1<<40 {
					continue
				}
				if d, ok := grew(r, w); ok {
					c.cands = append(c.cands, calCand{region: r, word: w, grown: d})
				}
			}
		}
	} else {
		kept := c.cands[:0]
		for _, k := range c.cands {
			if d, ok := grew(k.region, k.word); ok {
				k.grown += d
				kept = append(kept, k)
			}
		}
		c.cands = kept
	}
	c.events += events
	// A word that grows far faster than the allocations (a clock, a
	// byte count, a pointer) is not the counter: Ruby's internal objects
	// (the ones no probe reports) are rarely more than a few per object
	// a program allocates.
	kept := c.cands[:0]
	for _, k := range c.cands {
		if k.grown <= calMaxRatio*c.events+calSlack*uint64(c.windows+1) {
			kept = append(kept, k)
		}
	}
	c.cands = kept
	if events > 0 {
		c.windows++
	}
	if c.windows < calMinWindows || c.events < calMinEvents || len(c.cands) == 0 {
		return nil, 0, 0, 0
	}
	best := c.cands[0]
	for _, k := range c.cands[1:] {
		if k.grown < best.grown {
			best = k
		}
	}
	counter = &rubyCounter{
		t:     c.t,
		addrs: []uint64{c.regions[best.region] + uint64(best.word)*8},
		source: fmt.Sprintf("calibrated: the word at +0x%x of block 0x%x grew by at least the allocations counted in each of %d windows (%d events, %+.2f%%)",
			best.word*8, c.regions[best.region], c.windows, c.events, 100*(float64(best.grown)-float64(c.events))/float64(c.events)),
	}
	return counter, c.first[best.region][best.word], best.grown, now[best.region][best.word]
}

// failed reports whether no candidate is left.
func (c *calibration) failed() bool { return c.cands != nil && len(c.cands) == 0 }

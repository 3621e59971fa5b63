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
// Ruby 3.4's modular GC renamed the size pools heaps (rb_heap_struct) and
// put the objspace pointer in the VM's gc struct.
var counterStructs = []string{"rb_vm_struct", "rb_objspace", "rb_size_pool_struct", "rb_heap_struct"}

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
		var err2 error
		if objOff, err2 = l.Offset("rb_vm_struct", "gc.objspace"); err2 != nil {
			return nil, err
		}
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
	poolsField, poolStruct := "size_pools", "rb_size_pool_struct"
	if !l.Has("rb_objspace", poolsField) && l.Has("rb_objspace", "heaps") {
		poolsField, poolStruct = "heaps", "rb_heap_struct" // 3.4+
	}
	pools, err := l.Field("rb_objspace", poolsField)
	if err != nil {
		return nil, fmt.Errorf("no total_allocated_objects in rb_objspace nor size pools: %w", err)
	}
	poolSize, err := l.Size(poolStruct)
	if err != nil {
		return nil, err
	}
	inPool, err := l.Offset(poolStruct, "total_allocated_objects")
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
// by the least margin. Ruby 3.2+ keeps one counter per size pool
// (GC.stat(:total_allocated_objects) is their sum), none of which grows
// by all the allocations: failing a single word, the candidates are sums
// of words at a fixed stride in one block (the same field of consecutive
// pool structs), checked the same way. The check goes on after the
// choice: a window in which the chosen counter grows by less than the
// events counted drops it (the report then falls back to scaling by time).
type calibration struct {
	t       target.Target
	regions []uint64   // block addresses
	cands   []calCand  // surviving candidates
	first   [][]uint64 // words of each region when the first window opened
	last    [][]uint64 // words of each region at the last read
	live    []bool     // regions holding a candidate (nil: all, before the first check)
	// pools is how many size-pool counters Ruby sums (0: unknown): a
	// sum found is completed with the pools that did not allocate
	// while calibrating (see complete).
	pools   int
	windows int    // windows with events seen
	events  uint64 // events in all windows
	sure    uint64 // events surely counted before each read, summed
	// quiet sums, word by word, the growth in the windows that counted
	// too few events to list candidates from (nil before the first).
	quiet [][]uint64
	// singles: the Ruby keeps one counter (before 3.2), so no sums are
	// listed.
	singles bool
	// chosen is the counter's words, once chosen.
	chosen *calCand
}

// calCand is n words of one region, word, word+stride, ...: one word when
// n is 1, the counters of consecutive size pools otherwise.
type calCand struct {
	region, word int
	stride, n    int
	grown        uint64 // sum over windows of the words' growth
}

const (
	calWords      = 256  // words read from the start of each block
	calMaxRegions = 2048 // blocks considered
	// Sums: at most calMaxPools words, calMaxStride words apart (Ruby
	// 3.3's size pool is 28 words, and it has 5 of them).
	calMaxPools  = 8
	calMaxStride = 96
	calMaxCands  = 1 << 18
	// calMinFirstEvents is what the window the candidates are listed
	// from must have counted.
	calMinFirstEvents = 200
	// calMinWindows and calMinEvents are what a choice needs: the
	// counter of a process that does not allocate cannot be told apart,
	// and a word that follows the allocations for a while (the freed
	// objects, swept lazily, in a steady loop) must have had the time to
	// fall behind. Windows here are checks: window ends and the
	// checkpoints inside windows.
	calMinWindows = 4
	// calMinFinalWindows is what a choice needs when counting stops
	// before calMinWindows checks (a short run).
	calMinFinalWindows = 2
	calMinEvents       = 2000
	calMaxRatio        = 50
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

// read returns the words of every live region (nil for one that is not
// live or cannot be read).
func (c *calibration) read() [][]uint64 {
	out := make([][]uint64, len(c.regions))
	var idx []int
	for i := range c.regions {
		if c.live == nil || c.live[i] {
			idx = append(idx, i)
		}
	}
	bufs := make([]byte, len(idx)*calWords*8)
	reqs := make([]target.Read, len(idx))
	for j, i := range idx {
		reqs[j] = target.Read{Addr: c.regions[i], Buf: bufs[j*calWords*8 : (j+1)*calWords*8]}
	}
	batchErr := c.t.ReadBatch(reqs)
	for j, i := range idx {
		b := reqs[j].Buf
		if batchErr != nil {
			if c.t.ReadAt(b, reqs[j].Addr) != nil {
				continue
			}
		}
		w := make([]uint64, calWords)
		for k := range w {
			w[k] = binary.LittleEndian.Uint64(b[k*8:])
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
	// growth is k's growth since prev; false if a word decreased or
	// cannot be read.
	growth := func(k calCand) (uint64, bool) {
		p, n := prev[k.region], now[k.region]
		if p == nil || n == nil {
			return 0, false
		}
		var d uint64
		for i, w := 0, k.word; i < k.n; i, w = i+1, w+k.stride {
			if n[w] < p[w] {
				return 0, false
			}
			d += n[w] - p[w]
		}
		return d, true
	}
	if c.cands == nil && sure < calMinFirstEvents {
		// Too few events to tell words apart (with the slack, nearly
		// every sum would pass, and the candidates overflow, the
		// counter among the ones cut: a bursty load then never found
		// it): wait for a busier window, however long. The candidates'
		// growth will count this one's, as the tracker's counts do.
		c.addQuiet(prev, now)
		c.events += events
		c.sure += sure
		return nil, 0, 0, 0
	}
	if c.cands == nil {
		c.cands = c.enumerate(prev, now, sure)
		for i := range c.cands {
			k := &c.cands[i]
			q := c.quiet
			if q == nil || q[k.region] == nil {
				continue
			}
			for j, w := 0, k.word; j < k.n; j, w = j+1, w+k.stride {
				k.grown += q[k.region][w]
			}
		}
		c.quiet = nil
		c.live = make([]bool, len(c.regions))
		for _, k := range c.cands {
			c.live[k.region] = true
		}
	} else {
		kept := c.cands[:0]
		for _, k := range c.cands {
			if d, ok := growth(k); ok && d+calSlack >= sure {
				k.grown += d
				kept = append(kept, k)
			}
		}
		c.cands = kept
	}
	c.events += events
	c.sure += sure
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
	return c.choose(now, calMinWindows)
}

// addQuiet adds a quiet window's growth, word by word, to c.quiet.
func (c *calibration) addQuiet(prev, now [][]uint64) {
	if prev == nil {
		return
	}
	if c.quiet == nil {
		c.quiet = make([][]uint64, len(c.regions))
	}
	for r := range c.regions {
		p, n := prev[r], now[r]
		if p == nil || n == nil {
			continue
		}
		if c.quiet[r] == nil {
			c.quiet[r] = make([]uint64, calWords)
		}
		for w := range n {
			if n[w] >= p[w] {
				c.quiet[r][w] += n[w] - p[w]
			}
		}
	}
}

// choose returns the counter the candidates point to once minWindows
// checks and calMinEvents events are in (see close); now is the last
// read.
func (c *calibration) choose(now [][]uint64, minWindows int) (counter *rubyCounter, start, grown, cur uint64) {
	if c.windows < minWindows || c.events < calMinEvents || len(c.cands) == 0 {
		return nil, 0, 0, 0
	}
	// Before Ruby 3.2 (c.pools 0): the single word that grew least;
	// failing one, the sum that did (the fewest words on a tie: a word
	// that never moved adds nothing to the evidence). Since (c.pools
	// size pools), the counter is a sum of c.pools words: the candidates
	// that complete to one (see complete), by least growth. Candidates
	// that grew by all the events surely counted, summed over the
	// windows, come first (Ruby's counter always does): the slack each
	// window allows would otherwise favour a sum that leaves out a pool
	// allocating a few objects per window, or the freed-objects word,
	// which lags the allocations (CI: 3.1's total_freed_objects at -2.6%
	// of the events chosen over the counter, then dropped).
	better := func(k, b *calCand) bool {
		if kf, bf := k.grown >= c.sure, b.grown >= c.sure; kf != bf {
			return kf
		}
		if c.pools == 0 && (k.n == 1) != (b.n == 1) {
			return k.n == 1
		}
		// Two single words that grew alike (within 2x: not a byte
		// count): Ruby's counter of allocations is never below its
		// count of freed objects, which tracks it closely in a steady
		// loop and was chosen on short runs (3.1: +0x1c0 over +0x18).
		if k.n == 1 && b.n == 1 && k.grown <= 2*b.grown && b.grown <= 2*k.grown && c.last != nil {
			if lk, lb := c.last[k.region], c.last[b.region]; lk != nil && lb != nil && lk[k.word] != lb[b.word] {
				return lk[k.word] > lb[b.word]
			}
		}
		return k.grown < b.grown || k.grown == b.grown && k.n < b.n
	}
	var best *calCand
	var chosen calCand
	for i := range c.cands {
		k := &c.cands[i]
		if best != nil && !better(k, best) {
			continue
		}
		full := *k
		if c.pools > 0 {
			if full = c.complete(*k, now); full.n != c.pools {
				continue
			}
		}
		best, chosen = k, full
	}
	if best == nil {
		return nil, 0, 0, 0
	}
	chosen0 := *best
	best = &chosen
	c.chosen = &chosen
	counter = &rubyCounter{t: c.t}
	for i := 0; i < best.n; i++ {
		w := best.word + i*best.stride
		counter.addrs = append(counter.addrs, c.regions[best.region]+uint64(w)*8)
		start += c.first[best.region][w]
		cur += now[best.region][w]
	}
	what := fmt.Sprintf("the word at +0x%x", best.word*8)
	if best.n > 1 {
		what = fmt.Sprintf("the sum of %d words from +0x%x, 0x%x apart (Ruby's per-size-pool counters),", best.n, best.word*8, best.stride*8)
	}
	if best.n > chosen0.n {
		what = fmt.Sprintf("%s %d of which allocated while calibrating,", what, chosen0.n)
	}
	counter.source = fmt.Sprintf("calibrated: %s of block 0x%x grew by at least the allocations counted in each of %d windows (%d events, %+.2f%%)",
		what, c.regions[best.region], c.windows, c.events, 100*(float64(best.grown)-float64(c.events))/float64(c.events))
	return counter, start, best.grown, cur
}

// chosenValue is the chosen counter's value in a read of the blocks.
func (c *calibration) chosenValue(now [][]uint64) (uint64, bool) {
	k := c.chosen
	if k == nil || now[k.region] == nil {
		return 0, false
	}
	var v uint64
	for i := 0; i < k.n; i++ {
		v += now[k.region][k.word+i*k.stride]
	}
	return v, true
}

// calMinPoolWords is the least size of a size pool struct, in words.
const calMinPoolWords = 8

// calBaseSlotSize is the slot size of Ruby's first size pool on 64-bit
// builds (BASE_SLOT_SIZE, an RVALUE: 40 bytes); pool i's is twice pool
// i-1's. Every pool struct (rb_size_pool_t in 3.2-3.3, rb_heap_t in 3.4)
// begins with its slot size, a short.
const calBaseSlotSize = 40

// complete extends a size-pool counter, or a sum of them, to all c.pools
// pools: the calibration sees only the pools that allocated while it ran
// (the objects a program makes fill one to three of Ruby's five), so k
// may be one word, skip some (a stride of two pools) or stop short. The
// pools' counters are the same field of consecutive structs, and each
// struct begins with its slot size (40, 80, 160, ... bytes): the array is
// where those slot sizes sit at a stride, with k's words at the same
// offset in their structs (see poolArray). Failing that signature (a
// build that pads the structs otherwise), the smallest stride dividing
// k's at which c.pools words from k's first all look like counters (more
// than 0 since Ruby's boot allocated in every pool, below 2^40, not
// decreased since the first window): a guess, which a window in which
// the sum grows by less than the events counted shows to be wrong (a
// stride that guess took once: 19 words for Ruby 3.3's 28, its fifth
// word a pointer). Without c.pools k stays as found.
func (c *calibration) complete(k calCand, now [][]uint64) calCand {
	if c.pools == 0 {
		return k
	}
	n := now[k.region]
	switch first, stride, m := poolArray(n, k, c.pools); m {
	case poolsFound:
		return calCand{region: k.region, word: first, stride: stride, n: c.pools, grown: k.grown}
	case poolsConflict:
		// A sum that takes words beyond the pools its first word is
		// in (every other pool, past the last): not the counter.
		return calCand{}
	}
	if c.pools <= k.n {
		return k
	}
	f := c.first[k.region]
	like := func(w int) bool { return w < calWords && n[w] > 0 && n[w] < 1<<40 && n[w] >= f[w] }
	if k.n == 1 {
		// One pool allocated: the smallest stride that fits.
		for s := calMinPoolWords; s <= calMaxStride; s++ {
			ok := true
			for i := 1; i < c.pools && ok; i++ {
				ok = like(k.word + i*s)
			}
			if ok {
				return calCand{region: k.region, word: k.word, stride: s, n: c.pools, grown: k.grown}
			}
		}
		return k
	}
	for g := k.stride / calMinPoolWords; g >= 1; g-- {
		if k.stride%g != 0 || (k.n-1)*g+1 > c.pools {
			continue
		}
		s, ok := k.stride/g, true
		for i := 0; i < c.pools && ok; i++ {
			ok = like(k.word + i*s)
		}
		if ok {
			return calCand{region: k.region, word: k.word, stride: s, n: c.pools, grown: k.grown}
		}
	}
	return k
}

// poolMatch is what poolArray found.
type poolMatch int

const (
	poolsUnknown  poolMatch = iota // no array (or two) of pool structs holds k's first word
	poolsFound                     // one does, and all of k's words at the same offset
	poolsConflict                  // one does, but not all of k's words
)

// poolArray finds, in the words of one block, the array of pools size-pool
// structs k's first word belongs to: a stride s (in words) and a first
// struct at word b whose first words hold the slot sizes 40<<i at b+i*s,
// with k's first word at b+j+p*s for some pool p and offset j inside the
// struct (0 < j < s). It returns the pool-0 counter's word b+j and s.
func poolArray(words []uint64, k calCand, pools int) (first, stride int, m poolMatch) {
	found := 0
	for s := calMinPoolWords; s <= calMaxStride; s++ {
		for p := 0; p < pools; p++ {
			for j := 1; j < s; j++ {
				b := k.word - j - p*s
				if b < 0 || b+(pools-1)*s >= len(words) {
					continue
				}
				match := true
				for i := 0; i < pools && match; i++ {
					match = uint16(words[b+i*s]) == calBaseSlotSize<<i
				}
				if match {
					first, stride = b+j, s
					found++
				}
			}
		}
	}
	if found != 1 {
		return 0, 0, poolsUnknown
	}
	if k.n > 1 && (k.stride%stride != 0 || k.word+(k.n-1)*k.stride > first+(pools-1)*stride) {
		return 0, 0, poolsConflict
	}
	return first, stride, poolsFound
}

// forVersion sets what the calibration knows from Ruby's version: how
// many size pools' counters its total sums (3.2-3.4), or that it keeps
// one counter (before 3.2).
func (c *calibration) forVersion(version string) {
	c.pools = sizePools(version)
	c.singles = version != "" && layout.CompareVersions(version, "3.2") < 0
}

// sizePools is how many size pools (3.4: heaps) Ruby 3.2 to 3.4 keep on
// 64-bit Linux, the counters GC.stat(:total_allocated_objects) sums
// (SIZE_POOL_COUNT, HEAP_COUNT: 5); 0 for other versions.
func sizePools(version string) int {
	if layout.CompareVersions(version, "3.2") >= 0 && layout.CompareVersions(version, "3.5") < 0 {
		return 5
	}
	return 0
}

// enumerate lists the candidates of a first window: every word that has
// not decreased since the first window opened and grew in this one by at
// least sure, and (unless c.singles) every sum of such words at a stride
// whose first word grew and whose words grew by at least sure together.
func (c *calibration) enumerate(prev, now [][]uint64, sure uint64) []calCand {
	var out []calCand
	for r := range c.regions {
		f, p, n := c.first[r], prev[r], now[r]
		if f == nil || p == nil || n == nil {
			continue
		}
		ok := make([]bool, calWords)
		for w := range ok {
			ok[w] = n[w] >= f[w] && n[w]-f[w] <= 1<<40 && n[w] >= p[w]
		}
		for a := 0; a < calWords; a++ {
			if !ok[a] || n[a] == p[a] {
				continue
			}
			d0 := n[a] - p[a]
			if d0+calSlack >= sure {
				out = append(out, calCand{region: r, word: a, stride: 1, n: 1, grown: d0})
			}
			if c.singles {
				continue
			}
			for s := 1; s <= calMaxStride; s++ {
				d := d0
				for i, w := 1, a+s; i < calMaxPools && w < calWords && ok[w]; i, w = i+1, w+s {
					d += n[w] - p[w]
					if d+calSlack >= sure {
						out = append(out, calCand{region: r, word: a, stride: s, n: i + 1, grown: d})
					}
				}
			}
			if len(out) > calMaxCands {
				return out
			}
		}
	}
	return out
}

// failed reports whether no candidate is left.
func (c *calibration) failed() bool { return c.cands != nil && len(c.cands) == 0 }

// heapsLayout is where one Ruby series keeps its per-heap (3.4) or
// per-size-pool (3.3) allocation counters, from its GC's source, 64-bit:
// the array's offset in rb_objspace, its element's size, and in each
// element total_allocated_objects, total_freed_objects and the pages'
// total_pages and total_slots (3.3: the eden heap's).
type heapsLayout struct {
	minVer, maxVer string // [minVer, maxVer)
	source         string
	off, size      int
	allocated      int
	freed          int
	pages, slots   int
}

// heapsLayouts are the layouts counterFromHeaps knows, each proven equal
// to DWARF on a build of its series (TestCounterFromHeaps):
//
//	3.3 (gc.c): rb_objspace's size_pools[5] at +32, after malloc_params,
//	  flags, hook_events, next_object_id; rb_size_pool_t: short
//	  slot_size; size_t allocatable_pages, total_allocated_pages,
//	  total_freed_pages, force_major_gc_count,
//	  force_incremental_marking_finish_count, total_allocated_objects,
//	  total_freed_objects, freed_slots, empty_slots; rb_heap_t eden_heap,
//	  tomb_heap (72 bytes each: free_pages, pages, sweeping_page,
//	  compact_cursor, compact_cursor_index, pooled_pages, total_pages,
//	  total_slots): 224 bytes.
//	3.4 (gc/default/default.c): heaps[5] at +40, after malloc_params,
//	  gc_config, flags, hook_events, next_object_id; rb_heap_t: short
//	  slot_size; size_t total_allocated_pages, force_major_gc_count,
//	  force_incremental_marking_finish_count, total_allocated_objects,
//	  total_freed_objects, final_slots_count, freed_slots, empty_slots;
//	  free_pages, pages, sweeping_page, compact_cursor,
//	  compact_cursor_index, pooled_pages, total_pages, total_slots: 144
//	  bytes.
var heapsLayouts = []heapsLayout{
	{"3.3", "3.4", "gc.c 3.3: size_pools[].total_allocated_objects", 32, 224, 48, 56, 80 + 56, 80 + 64},
	{"3.4", "3.5", "gc/default/default.c 3.4: heaps[].total_allocated_objects", 40, 144, 32, 40, 128, 136},
}

// heapsLayoutFor returns the heaps' layout of Ruby version, nil if none.
func heapsLayoutFor(version string) *heapsLayout {
	for i, l := range heapsLayouts {
		if layout.CompareVersions(version, l.minVer) >= 0 && layout.CompareVersions(version, l.maxVer) < 0 {
			return &heapsLayouts[i]
		}
	}
	return nil
}

// heapsCount is how many heaps (size pools) Ruby 3.2-3.4 keep on 64-bit
// Linux, and heapPageSlots bounds the slots of one page of the smallest
// slots (HEAP_PAGE_SIZE 64 KiB / 40 bytes).
const (
	heapsCount    = 5
	heapPageSlots = 64 << 10 / calBaseSlotSize
)

// counterFromHeaps locates Ruby 3.3's or 3.4's counter without DWARF:
// the sum of the heaps' (size pools') total_allocated_objects, at the
// GC source's layout (heapsLayouts), checked on the process. The array
// is where the heaps' slot sizes (40, 80, ... 640 bytes, each one's first
// field) sit: at exactly one stride, which must be the element's size;
// and each heap's counts must say what Ruby's GC.stat derives from them:
// no more freed objects than allocated, no more live (allocated - freed,
// heap_live_slots) than the heap has slots (heap_available_slots), no
// more slots than its pages hold. The first heap has allocated (Ruby's
// boot does). The objspace is package ruby's (DWARF, or its shape).
func counterFromHeaps(t target.Target, p *ruby.Process) (*rubyCounter, error) {
	lay := heapsLayoutFor(p.Version())
	if lay == nil {
		return nil, fmt.Errorf("no built-in layout of the heaps' counters for Ruby %s", p.Version())
	}
	os, src, err := p.Objspace()
	if err != nil {
		return nil, err
	}
	b := make([]byte, lay.off+heapsCount*calMaxStride*8)
	if err := t.ReadAt(b, os); err != nil {
		return nil, fmt.Errorf("read rb_objspace at 0x%x: %w", os, err)
	}
	var strides []int
	for s := 8 * calMinPoolWords; s <= 8*calMaxStride; s += 8 {
		match := true
		for i := 0; i < heapsCount && match; i++ {
			match = binary.LittleEndian.Uint16(b[lay.off+i*s:]) == calBaseSlotSize<<i
		}
		if match {
			strides = append(strides, s)
		}
	}
	if len(strides) != 1 || strides[0] != lay.size {
		return nil, fmt.Errorf("rb_objspace at 0x%x: the heaps' slot sizes from +%d at strides %v, want one at %d bytes (%s)", os, lay.off, strides, lay.size, lay.source)
	}
	c := &rubyCounter{t: t}
	for i := 0; i < heapsCount; i++ {
		h := b[lay.off+i*lay.size:]
		alloc, freed := le64(h, lay.allocated), le64(h, lay.freed)
		pages, slots := le64(h, lay.pages), le64(h, lay.slots)
		switch {
		case alloc >= 1<<48 || freed > alloc:
			return nil, fmt.Errorf("heap %d: %d objects allocated, %d freed (%s)", i, alloc, freed, lay.source)
		case alloc-freed > slots:
			return nil, fmt.Errorf("heap %d: %d objects live in %d slots (%s)", i, alloc-freed, slots, lay.source)
		case slots > pages*(heapPageSlots>>i):
			return nil, fmt.Errorf("heap %d: %d slots in %d pages (%s)", i, slots, pages, lay.source)
		case i == 0 && alloc == 0:
			return nil, fmt.Errorf("heap 0 allocated nothing (%s)", lay.source)
		}
		c.addrs = append(c.addrs, os+uint64(lay.off+i*lay.size+lay.allocated))
	}
	c.source = fmt.Sprintf("%s: +%d in each %d-byte element from +%d, where the heaps' slot sizes are, checked on their counts; objspace from %s", lay.source, lay.allocated, lay.size, lay.off, src)
	return c, nil
}

func le64(b []byte, off int) uint64 {
	if off+8 > len(b) {
		return 0
	}
	return binary.LittleEndian.Uint64(b[off:])
}

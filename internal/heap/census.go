package heap

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"syscall"
	"time"

	"github.com/rbscope/rbscope/internal/procfs"
	"github.com/rbscope/rbscope/internal/ruby"
	"github.com/rbscope/rbscope/internal/target"
)

// batchBytes bounds one batched read of page bodies (and so each of the
// census's two buffers); batchPages bounds the pages of one batch.
const (
	batchBytes = 2 << 20
	batchPages = 256
	listChunk  = 1024 // page pointers read at a time from heap_pages.sorted
	listTries  = 4    // reads of a chunk when the list moved meanwhile (running process)
)

// Heap reads one process's object heap. Open it once; take as many
// censuses as needed (rbscope heap --interval).
type Heap struct {
	p *ruby.Process
	t target.Target
	o *offsets
	// names caches class names by klass address for the life of the
	// Heap, checked again at each census (see Census).
	live bool
}

// Open resolves where p's heap is. It fails with ErrUnsupported (wrapped)
// for Rubies whose heap it cannot read.
func Open(p *ruby.Process) (*Heap, error) {
	o, err := resolve(p)
	if err != nil {
		return nil, err
	}
	_, live := p.Target().(target.ReadCounter)
	return &Heap{p: p, t: p.Target(), o: o, live: live}, nil
}

// Source says where the heap's offsets came from.
func (h *Heap) Source() string { return h.o.source }

// Options tunes a census.
type Options struct {
	// Stop pauses every thread of a live process for the census, which is
	// then exact; otherwise slots that change while they are read are
	// counted as Changed.
	Stop bool
	// Pauser pauses the process when Stop is set (a new one when nil).
	Pauser *target.Pauser
	// Dump, when set, receives every live object as a line of Ruby's
	// ObjectSpace.dump_all format (see dump.go), written as the census
	// goes.
	Dump io.Writer
}

// Entry is the census of one (type, class).
type Entry struct {
	Type  string `json:"type"`
	Class string `json:"class"`
	Count uint64 `json:"count"`
	// SlotBytes is the bytes of their heap slots; MallocBytes what Ruby
	// malloc'd for them outside the slots (strings', arrays' and hashes'
	// buffers, objects' ivars on 3.0-3.1 and 3.3). Bytes is their sum.
	SlotBytes   uint64 `json:"slot_bytes"`
	MallocBytes uint64 `json:"malloc_bytes"`
	Bytes       uint64 `json:"bytes"`
	// SlotOnly is true for types whose out-of-slot memory is not counted.
	SlotOnly bool `json:"slot_only,omitempty"`
}

// Census is the heap of one process at one moment.
type Census struct {
	Pid         int       `json:"pid"`
	RubyVersion string    `json:"ruby_version"`
	Source      string    `json:"offsets_source"`
	Time        time.Time `json:"time"`
	// Stopped is true when every thread was paused (Stop), or the target
	// is a core file; Pause is how long the process was paused.
	Stopped bool          `json:"stopped"`
	Pause   time.Duration `json:"pause_ns,omitempty"`
	// Duration is the time the census took; BytesRead what it read.
	Duration  time.Duration `json:"duration_ns"`
	BytesRead uint64        `json:"bytes_read"`
	// CPU is the CPU time rbscope spent on the census (user and system,
	// the whole rbscope process meanwhile).
	CPU time.Duration `json:"cpu_ns"`

	Pages int `json:"pages"`
	// PagesChanged are pages of a running process that were freed or
	// reused while the census read them; PagesBad pages that failed their
	// checks or could not be read in a stopped process or a core.
	PagesChanged int `json:"pages_changed,omitempty"`
	// PageChange says why the first changed page failed (its check).
	PageChange string `json:"page_change,omitempty"`
	PagesBad   int    `json:"pages_bad,omitempty"`
	// PagesEmpty are pages of Ruby 3.4's global empty pool: kept for
	// reuse, holding no slots.
	PagesEmpty int    `json:"pages_empty,omitempty"`
	Slots      uint64 `json:"slots"`
	// Changed counts the slots whose bytes differed between the census's
	// two reads (a running process); they are in no entry. Bad counts
	// slots whose fields were impossible.
	Changed uint64 `json:"changed_slots"`
	Bad     uint64 `json:"bad_slots,omitempty"`

	// Types counts slots by type, as ObjectSpace.count_objects does
	// (FREE for empty slots).
	Types map[string]uint64 `json:"types"`
	// Entries are sorted by Bytes, largest first.
	Entries []Entry `json:"entries"`

	// Dumped is how many objects were written to Options.Dump.
	Dumped uint64 `json:"dumped,omitempty"`
	// Notes say what the census could not count (and why).
	Notes []string `json:"notes,omitempty"`
	// Partial is set when part of the heap could not be read; Why says
	// what.
	Partial bool   `json:"partial,omitempty"`
	Why     string `json:"partial_reason,omitempty"`
}

// SlotOnlyTypes lists the types whose out-of-slot memory a census does not
// count.
func (c *Census) SlotOnlyTypes() []string {
	var out []string
	seen := map[string]bool{}
	for _, e := range c.Entries {
		if e.SlotOnly && !seen[e.Type] {
			seen[e.Type] = true
			out = append(out, e.Type)
		}
	}
	sort.Strings(out)
	return out
}

type key struct {
	typ   uint8
	klass uint64
}

type acc struct {
	count, slotBytes, malloc uint64
}

// walk is one census's scratch.
type walk struct {
	h        *Heap
	c        *Census
	byKey    map[key]*acc
	pageBuf  []byte
	bufA     []byte
	bufB     []byte
	reqs     []target.Read
	reqsB    []target.Read
	tables   []target.Read
	tableKey []key
	stopped  bool
	failed   bool // a read failed in the current batch
	types    [32]uint64
	shapes   []byte // 3.3: the shape list, nil when not read
	// last is the entry of the previous slot's key (neighbours are often
	// of one class), saving a map lookup.
	last    *acc
	lastKey key

	unknownShapes uint64
	dump          *dumper
}

// readShapes reads the 3.3 shape list (rb_shape_tree_ptr->shape_list, 40
// bytes a shape, up to next_shape_id), once per census: objects whose
// ivars are out of their slot find their capacity there.
func (w *walk) readShapes() error {
	o, t := w.h.o, w.h.t
	if o.ver < 30300 {
		return nil
	}
	if o.shapeTree == 0 {
		return errors.New(o.shapeSource)
	}
	var b [24]byte
	if err := t.ReadAt(b[:8], o.shapeTree); err != nil {
		return fmt.Errorf("read rb_shape_tree_ptr: %w", err)
	}
	tree := le64(b[:], 0)
	if !isPtr(tree) {
		return fmt.Errorf("rb_shape_tree_ptr is 0x%x", tree)
	}
	if err := t.ReadAt(b[:], tree); err != nil {
		return fmt.Errorf("read the shape tree: %w", err)
	}
	list, n := le64(b[:], 0), le32(b[:], treeNextShapeID)
	if !isPtr(list) || n == 0 || n > maxShapes {
		return fmt.Errorf("shape list 0x%x with %d shapes", list, n)
	}
	shapes := make([]byte, n*shapeSize)
	if err := t.ReadAt(shapes, list); err != nil {
		return fmt.Errorf("read %d shapes: %w", n, err)
	}
	w.c.BytesRead += uint64(len(shapes))
	w.shapes = shapes
	return nil
}

// Census takes one census. A live process keeps running unless opts.Stop
// (then it is resumed before Census returns, also when it fails). The
// census ends early, partial, when ctx is done.
func (h *Heap) Census(ctx context.Context, opts Options) (c *Census, err error) {
	cs := &Census{Pid: h.t.Pid(), RubyVersion: h.p.Version(), Source: h.o.source, Time: time.Now(), Types: map[string]uint64{}}
	w := &walk{h: h, c: cs, byKey: map[key]*acc{}, stopped: !h.live}
	if opts.Dump != nil {
		w.dump = &dumper{w: bufio.NewWriterSize(opts.Dump, 256<<10), names: map[uint64]string{}}
	}
	t0, cpu0 := time.Now(), cpuTime()
	if opts.Stop && h.live {
		pz := opts.Pauser
		if pz == nil {
			pz = target.NewThreadPauser()
			defer pz.Close()
		}
		resume, err := pz.Pause(h.t.Pid())
		if err != nil {
			return nil, fmt.Errorf("pause process %d: %w", h.t.Pid(), err)
		}
		paused := time.Now()
		defer func() {
			rerr := resume()
			cs.Pause = time.Since(paused)
			if rerr != nil && err == nil {
				c, err = nil, fmt.Errorf("resume process %d: %w", h.t.Pid(), rerr)
			}
		}()
		w.stopped = true
	}
	cs.Stopped = w.stopped
	err = w.run(ctx)
	if w.dump != nil {
		if err == nil {
			err = w.dump.err
		}
		if ferr := w.dump.w.Flush(); err == nil && ferr != nil {
			err = fmt.Errorf("write the heap dump: %w", ferr)
		}
		cs.Dumped = w.dump.n
	}
	if err == nil && (w.c.Partial || w.c.PagesChanged > 0) && !h.alive() {
		err = w.readErr("read the heap", target.ExitedError{Pid: h.t.Pid()})
	}
	if err == nil {
		err = w.name()
	}
	cs.Duration, cs.CPU = time.Since(t0), cpuTime()-cpu0
	if err != nil {
		return nil, err
	}
	return cs, nil
}

func (w *walk) partial(format string, args ...any) {
	w.c.Partial = true
	if w.c.Why == "" {
		w.c.Why = fmt.Sprintf(format, args...)
	}
}

// run reads the sorted page list in chunks and each chunk's pages in
// batches.
func (w *walk) run(ctx context.Context) error {
	o, t := w.h.o, w.h.t
	sorted, n, err := o.pageList(t)
	if err != nil {
		return w.readErr("find the heap's pages", err)
	}
	w.c.Pages = int(n)
	if err := w.readShapes(); err != nil {
		w.c.Notes = append(w.c.Notes, fmt.Sprintf("objects' out-of-slot ivars not counted: %v", err))
	}
	list := make([]byte, 8*listChunk)
	w.pageBuf = make([]byte, listChunk*o.hdrLen)
	w.bufA = make([]byte, batchBytes)
	if !w.stopped {
		w.bufB = make([]byte, batchBytes)
	}
	for i := uint64(0); i < n; i += listChunk {
		if err := ctx.Err(); err != nil {
			w.partial("interrupted after %d of %d pages", i, n)
			return nil
		}
		m := min(uint64(listChunk), n-i)
		err := t.ReadAt(list[:8*m], sorted+8*i)
		for try := 0; !w.stopped && try < listTries; try++ {
			// Ruby reallocates the page list as the heap grows: a
			// running process may have moved it while it was read,
			// and the old copy holds stale or freed pointers (a
			// census of a heap growing by 100,000 objects a second
			// once found all 55 of its pages unreadable, and counted
			// nothing). Read it again where it is now.
			now, nn, perr := o.pageList(t)
			if perr != nil || now == sorted {
				break
			}
			sorted, n = now, nn
			w.c.Pages = int(n)
			if i >= n {
				return nil
			}
			m = min(uint64(listChunk), n-i)
			err = t.ReadAt(list[:8*m], sorted+8*i)
		}
		if err != nil {
			if errors.As(err, new(target.ExitedError)) {
				return w.readErr("read heap_pages.sorted", err)
			}
			w.partial("heap_pages.sorted[%d:%d] unreadable: %v", i, i+m, err)
			w.c.PagesBad += int(m)
			continue
		}
		w.c.BytesRead += 8 * m
		if err := w.chunk(ctx, list[:8*m]); err != nil {
			return err
		}
	}
	return nil
}

func (w *walk) readErr(what string, err error) error {
	if target.IsExited(err) {
		return fmt.Errorf("%s: %w (the census stopped %s)", what, err, w.progress())
	}
	return fmt.Errorf("%s: %w", what, err)
}

func (w *walk) progress() string {
	return fmt.Sprintf("after %d slots", w.c.Slots)
}

// chunk reads the heap_page structs of one chunk of the page list, then
// their bodies in batches.
func (w *walk) chunk(ctx context.Context, list []byte) error {
	o := w.h.o
	m := len(list) / 8
	w.reqs = w.reqs[:0]
	for k := 0; k < m; k++ {
		w.reqs = append(w.reqs, target.Read{Addr: le64(list, uint64(8*k)), Buf: w.pageBuf[k*o.hdrLen : (k+1)*o.hdrLen]})
	}
	w.failed = false
	ok := w.readAll(w.reqs)
	if w.failed && !w.h.alive() {
		return w.readErr("read heap pages", target.ExitedError{Pid: w.h.t.Pid()})
	}
	pages := make([]pageInfo, 0, m)
	for k := 0; k < m; k++ {
		if !ok[k] {
			w.pageFailed("its heap_page is unreadable")
			continue
		}
		pg, err := o.decodePage(w.reqs[k].Addr, w.reqs[k].Buf)
		if err != nil {
			w.pageFailed(err.Error())
			continue
		}
		if pg.empty {
			w.c.PagesEmpty++
			continue
		}
		pages = append(pages, pg)
	}
	for len(pages) > 0 {
		if err := ctx.Err(); err != nil {
			w.partial("interrupted")
			return nil
		}
		var size uint64
		k := 0
		for k < len(pages) && k < batchPages && (k == 0 || size+pages[k].span() <= batchBytes) {
			size += pages[k].span()
			k++
		}
		if err := w.batch(pages[:k]); err != nil {
			return err
		}
		if afterBatch != nil {
			afterBatch()
		}
		pages = pages[k:]
	}
	return nil
}

// afterBatch, when set (by tests), runs after each batch of pages.
var afterBatch func()

// pageFailed counts a page the census could not use: changed under a
// running process, bad in a stopped one or a core (the census is then
// partial).
func (w *walk) pageFailed(why string) {
	if w.stopped {
		w.c.PagesBad++
		w.partial("a heap page failed: %s", why)
		return
	}
	w.c.PagesChanged++
	if w.c.PageChange == "" {
		w.c.PageChange = why
	}
}

// readAll performs reqs in one batch; when that fails it reads them one by
// one and says which succeeded. A process that exited fails them all.
func (w *walk) readAll(reqs []target.Read) []bool {
	ok := make([]bool, len(reqs))
	err := w.h.t.ReadBatch(reqs)
	if err != nil {
		w.failed = true
	}
	if err == nil {
		for i := range ok {
			ok[i] = true
			w.c.BytesRead += uint64(len(reqs[i].Buf))
		}
		return ok
	}
	if target.IsExited(err) {
		return ok
	}
	for i := range reqs {
		if w.h.t.ReadAt(reqs[i].Buf, reqs[i].Addr) == nil {
			ok[i] = true
			w.c.BytesRead += uint64(len(reqs[i].Buf))
		}
	}
	return ok
}

// batch reads a batch of page bodies (twice when the process runs) and
// counts their slots.
func (w *walk) batch(pages []pageInfo) error {
	w.reqs, w.reqsB = w.reqs[:0], w.reqsB[:0]
	w.failed = false
	off := uint64(0)
	for _, pg := range pages {
		sp := pg.span()
		w.reqs = append(w.reqs, target.Read{Addr: pg.body, Buf: w.bufA[off : off+sp]})
		if w.bufB != nil {
			w.reqsB = append(w.reqsB, target.Read{Addr: pg.body, Buf: w.bufB[off : off+sp]})
		}
		off += sp
	}
	ok := w.readAll(w.reqs)
	okB := ok
	if w.bufB != nil {
		okB = w.readAll(w.reqsB)
	}
	if w.failed && !w.h.alive() {
		return w.readErr("read heap pages", target.ExitedError{Pid: w.h.t.Pid()})
	}
	w.tables, w.tableKey = w.tables[:0], w.tableKey[:0]
	for i, pg := range pages {
		if !ok[i] || !okB[i] {
			w.pageFailed(fmt.Sprintf("page body at 0x%x is unreadable", pg.body))
			continue
		}
		a := w.reqs[i].Buf
		if le64(a, 0) != pg.page {
			w.pageFailed(fmt.Sprintf("page body at 0x%x does not point back at its page 0x%x", pg.body, pg.page))
			continue
		}
		var b []byte
		if w.bufB != nil {
			b = w.reqsB[i].Buf
			if le64(b, 0) != pg.page {
				w.pageFailed("page freed while read")
				continue
			}
		}
		w.slots(pg, a, b)
	}
	if err := w.readTables(); err != nil {
		return err
	}
	if w.dump != nil {
		w.dump.flush(w)
	}
	return nil
}

// slots counts the slots of one page body (a), comparing them with the
// second read (b) when there is one.
func (w *walk) slots(pg pageInfo, a, b []byte) {
	o := w.h.o
	first := pg.start - pg.body
	for i := uint64(0); i < pg.total; i++ {
		lo, hi := first+i*pg.slot, first+(i+1)*pg.slot
		sb := a[lo:hi]
		w.c.Slots++
		if b != nil && !bytes.Equal(sb, b[lo:hi]) {
			w.c.Changed++
			continue
		}
		s := o.decodeSlot(sb)
		if s.bad {
			w.c.Bad++
			continue
		}
		w.types[s.typ]++
		if s.typ == tNone {
			continue
		}
		k := key{s.typ, classOf(s.typ, s.klass)}
		e := w.last
		if k != w.lastKey || e == nil {
			if e = w.byKey[k]; e == nil {
				e = &acc{}
				w.byKey[k] = e
			}
			w.last, w.lastKey = e, k
		}
		e.count++
		e.slotBytes += pg.slot
		e.malloc += s.malloc
		if s.heapIvars && w.shapes != nil {
			n, tooComplex, ok := shapeIvars(w.shapes, s.shape)
			switch {
			case !ok:
				w.unknownShapes++
			case tooComplex:
				if s.table = le64(sb, robjectHeapIvptr); !isPtr(s.table) {
					s.table = 0
					w.c.Bad++
				}
			default:
				e.malloc += n
				s.malloc += n
			}
		}
		table := -1
		if s.table != 0 {
			table = len(w.tables)
			w.tables = append(w.tables, target.Read{Addr: s.table})
			w.tableKey = append(w.tableKey, k)
		}
		if w.dump != nil {
			w.dump.record(w, pg.start+i*pg.slot, pg, sb, s, table)
		}
	}
}

// classOf is the klass a slot is counted under: 0 for types whose klass
// is no class of theirs (internal objects, classes and modules, which are
// counted by type).
func classOf(typ uint8, klass uint64) uint64 {
	switch typ {
	case tClass, tModule, tIClass, tImemo, tNode, tZombie, tMoved, tNone:
		return 0
	}
	return klass
}

// readTables reads the st_tables of 3.0-3.2 hashes met in a batch (one
// batched read) and adds their entries and bins.
func (w *walk) readTables() error {
	if len(w.tables) == 0 {
		return nil
	}
	if w.dump != nil {
		w.dump.tableBytes = append(w.dump.tableBytes[:0], make([]uint64, len(w.tables))...)
		w.dump.tableEntries = append(w.dump.tableEntries[:0], make([]int64, len(w.tables))...)
	}
	buf := make([]byte, stSize*len(w.tables))
	for i := range w.tables {
		w.tables[i].Buf = buf[i*stSize : (i+1)*stSize]
	}
	w.failed = false
	ok := w.readAll(w.tables)
	if w.failed && !w.h.alive() {
		return w.readErr("read hash tables", target.ExitedError{Pid: w.h.t.Pid()})
	}
	for i, rq := range w.tables {
		e := w.byKey[w.tableKey[i]]
		if !ok[i] {
			w.c.Bad++
			continue
		}
		n, good := stMemsize(rq.Buf)
		if !good {
			w.c.Bad++
			continue
		}
		e.malloc += stSize + n
		if w.dump != nil {
			w.dump.tableBytes[i], w.dump.tableEntries[i] = stSize+n, int64(le64(rq.Buf, stNumEntries))
		}
	}
	return nil
}

// alive reports whether a live target still runs (a zombie has no memory
// left to read); a core is always alive.
// It is asked after a read failed: a process being killed loses its
// memory before it turns zombie, so it is watched for up to 100 ms.
func (h *Heap) alive() bool {
	if !h.live {
		return true
	}
	for i := 0; i < 10; i++ {
		st, err := procfs.ReadStat(h.t.Pid())
		if err != nil || st.Gone() {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// countTypes fills the census's counts by type name.
func (w *walk) countTypes() {
	for t, n := range w.types {
		if n > 0 {
			w.c.Types[TypeName(uint8(t))] = n
		}
	}
}

// name turns the (type, klass) counts into entries named by class.
func (w *walk) name() error {
	o := w.h.o
	w.countTypes()
	if w.unknownShapes > 0 {
		w.c.Notes = append(w.c.Notes, fmt.Sprintf("%d objects have a shape newer than the shape list read: their out-of-slot ivars are not counted", w.unknownShapes))
	}
	names := map[uint64]string{}
	merged := map[[2]string]*Entry{}
	for k, a := range w.byKey {
		cls := ""
		switch k.typ {
		case tClass:
			cls = "Class"
		case tModule:
			cls = "Module"
		default:
			if k.klass == 0 {
				if classOf(k.typ, 1) != 0 {
					cls = "(hidden)"
				}
				break
			}
			n, ok := names[k.klass]
			if !ok {
				n = w.h.className(k.klass)
				names[k.klass] = n
			}
			cls = n
		}
		mk := [2]string{TypeName(k.typ), cls}
		e := merged[mk]
		if e == nil {
			e = &Entry{Type: mk[0], Class: cls, SlotOnly: !o.counted(k.typ, w.shapes != nil)}
			merged[mk] = e
		}
		e.Count += a.count
		e.SlotBytes += a.slotBytes
		e.MallocBytes += a.malloc
		e.Bytes = e.SlotBytes + e.MallocBytes
	}
	w.c.Entries = make([]Entry, 0, len(merged))
	for _, e := range merged {
		w.c.Entries = append(w.c.Entries, *e)
	}
	sortEntries(w.c.Entries)
	return nil
}

// className names an object's class as obj.class does: an object with
// singleton methods has its singleton class as klass, whose superclass
// (RClass.super, at 16 from 3.0 to 3.4) is the class it was made from.
func (h *Heap) className(klass uint64) string {
	k := klass
	for depth := 0; depth < 4; depth++ {
		nm, err := h.p.ClassName(k)
		if err == nil {
			if nm == "" {
				return fmt.Sprintf("#<Class:0x%x>", k)
			}
			return nm
		}
		var b [24]byte
		if h.t.ReadAt(b[:], k) != nil {
			break
		}
		flags := le64(b[:], 0)
		if flags&tMask != tClass || flags&h.o.singletonFlag() == 0 || !isPtr(le64(b[:], 16)) {
			break
		}
		k = le64(b[:], 16)
	}
	return fmt.Sprintf("(unreadable class 0x%x)", klass)
}

func sortEntries(es []Entry) {
	sort.Slice(es, func(i, j int) bool {
		if es[i].Bytes != es[j].Bytes {
			return es[i].Bytes > es[j].Bytes
		}
		if es[i].Type != es[j].Type {
			return es[i].Type < es[j].Type
		}
		return es[i].Class < es[j].Class
	})
}

// cpuTime is rbscope's own CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Page is one heap page as its struct heap_page describes it.
type Page struct {
	Page     uint64 `json:"page"`      // the struct heap_page
	Body     uint64 `json:"body"`      // the page body, whose header points back at Page
	Start    uint64 `json:"start"`     // the first slot
	Slots    uint64 `json:"slots"`     // total_slots
	SlotSize uint64 `json:"slot_size"` // bytes per slot
}

// Pages lists the heap's pages (their headers, decoded and checked; the
// bodies are not read). A page whose header fails its checks is an error.
func (h *Heap) Pages() ([]Page, error) {
	o, t := h.o, h.t
	sorted, n, err := o.pageList(t)
	if err != nil {
		return nil, fmt.Errorf("find the heap's pages: %w", err)
	}
	var out []Page
	list := make([]byte, 8)
	for i := uint64(0); i < n; i++ {
		if err := t.ReadAt(list, sorted+8*i); err != nil {
			return out, fmt.Errorf("read heap_pages.sorted[%d]: %w", i, err)
		}
		pg, err := o.readPage(t, le64(list, 0))
		if err != nil {
			return out, err
		}
		out = append(out, Page{Page: pg.page, Body: pg.body, Start: pg.start, Slots: pg.total, SlotSize: pg.slot})
	}
	return out, nil
}

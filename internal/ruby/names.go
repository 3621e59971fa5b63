package ruby

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// The global symbol table (rb_symbols_t, symbol.c) is in no layout table;
// from Ruby's own symbol.c, 2.2 to 4.0 all keep `ids` (an Array of
// 512-entry chunks of [String, Symbol] pairs) at offset 16, after an
// 8-byte-aligned last_id/next_id.
const (
	symbolsLastID = 0
	symbolsIDs    = 16
	idEntryUnit   = 512
	idScopeShift  = 4
	maxOpID       = 0xff // tLAST_OP_ID is below this in every version
)

// caches hold what the walker read about objects, by address. Every entry
// keyed by the address of a GC-managed object carries the GC epoch in
// which it was last read (see gccount.go) and serves only in that epoch.
type caches struct {
	iseqCache  map[uint64]*iseqInfo
	pathCache  map[uint64]genString
	ownerCache map[uint64]genString
	cfuncCache map[uint64]genString
	classCache map[uint64]className
	idCache    map[uint64]string
	osNames    map[int]string
	startNames map[uint64]startName   // unnamed threads' names, by thread address (see nameThread)
	slotCache  map[uint64][]slotEntry // by VM stack end, see stackSlots
	slotTotal  int
	lastFrames map[uint64]*keptStack // each thread's last stack, by thread address
	keptBytes  int                   // the regions kept in lastFrames
	walks      uint64                // stacks walked (see sameStack)
	offCPU     OffCPUWatch           // see SetOffCPUWatch (nil: none)
	stillSkips uint64                // threads not read: not run since (see stillStack)
	// The global symbol table's memory scan, when it is not exported:
	// retried (a process opened while it boots may not have filled it
	// yet) no sooner than symScanNext, backing off to maxSymScanWait.
	symScanNext time.Time
	symScanWait time.Duration
	classpathSerial,
	attachedSerial uint64
	serialsSearched uint64 // symbol serials searched for them so far
	// incomplete counts the names decoded without all they need: the
	// symbol table (not found yet), a hidden ivar's serial (not interned
	// yet), a class that could not be read, or the method entry of a
	// stopped thread's frame (see frame). A name decoded while it grew is
	// not cached, so that it is decoded again next time.
	incomplete uint64

	// epoch is the GC count (+1) at the start of the current snapshot,
	// or a number of its own per snapshot (top bit set) when the count's
	// address is unknown.
	epoch, fallbackEpoch uint64
	gcCountAddr          uint64
	gcCountTried         bool

	// stoppedAll: every Ruby thread holds still while a snapshot reads,
	// unless its request says otherwise (Spec.Consistency Stopped: a core
	// file, a copy).
	stoppedAll bool
	tornReads  uint64 // stack reads found torn

	// The thread list seen last time (see tick.go).
	knownThreads []uint64
	knownHeads   []threadHeads // per known thread, read with it
	knownRactor  uint64
	nameCache    map[uint64]genString

	witChecks uint64 // witness checks made
}

// genString is a cached string and the GC epoch it was read in.
type genString struct {
	s   string
	gen uint64
	wit witness
}

type className struct {
	name      string
	singleton bool
	gen       uint64
	wit       witness
}

func (c *caches) init() {
	c.iseqCache = map[uint64]*iseqInfo{}
	c.pathCache = map[uint64]genString{}
	c.ownerCache = map[uint64]genString{}
	c.cfuncCache = map[uint64]genString{}
	c.classCache = map[uint64]className{}
	c.idCache = map[uint64]string{}
	c.osNames = map[int]string{}
	c.slotCache = map[uint64][]slotEntry{}
	c.nameCache = map[uint64]genString{}
}

// errNoSymbols reports that the global symbol table was not found.
var errNoSymbols = errors.New("global symbol table not found")

// id2str returns the name of method id id, as rb_id2str does.
func (p *namer) id2str(id uint64) (string, error) {
	if s, ok := p.idCache[id]; ok {
		return s, nil
	}
	if !p.rt.symbolSerials {
		return "", fmt.Errorf("method names of Ruby %s: %w", p.rt.version, errNoSymbols)
	}
	if !p.findSymbols() {
		p.incomplete++
		return "", errNoSymbols
	}
	serial := id
	if id > maxOpID {
		serial = id >> idScopeShift
	}
	s, err := p.serialString(serial)
	if err != nil {
		return "", err
	}
	if len(p.idCache) > 100000 {
		p.idCache = map[uint64]string{}
	}
	p.idCache[id] = s
	return s, nil
}

// serialString reads the String registered for a symbol serial.
func (p *namer) serialString(serial uint64) (string, error) {
	last, err := p.r.u32(p.symbolsAddr + symbolsLastID)
	if err != nil {
		return "", fmt.Errorf("read symbol table: %w", err)
	}
	if serial == 0 || serial > uint64(last) {
		return "", invalidf("symbol serial %d outside 1..%d", serial, last)
	}
	ids, err := p.r.u64(p.symbolsAddr + symbolsIDs)
	if err != nil {
		return "", fmt.Errorf("read symbol table: %w", err)
	}
	chunk, err := p.aryEntry(ids, serial/idEntryUnit)
	if err != nil {
		return "", fmt.Errorf("read symbol chunk: %w", err)
	}
	str, err := p.aryEntry(chunk, (serial%idEntryUnit)*2)
	if err != nil {
		return "", fmt.Errorf("read symbol entry: %w", err)
	}
	return p.rstring(str)
}

// scanForSymbols finds ruby_global_symbols in the Ruby binaries' data when
// it is not exported: a struct whose last_id is plausible and whose ids
// Array has one chunk per 512 serials, and where serial '+' names "+".
// A symbol's serial is taken (++last_id) before its entry is stored, and
// the first serial of a chunk allocates the chunk in between (a GC may
// run there): the table then holds one chunk fewer than last_id says. A
// scan that refused that state left every C function that was not named
// yet "<cfunc>" until the next scan (100 ms later, then longer), seen on a
// target that interns symbols all the time (TestNamesNeverStale).
func (p *namer) scanForSymbols() {
	maps, err := p.t.Mappings()
	if err != nil {
		return
	}
	_, _ = p.scanWords(dataRegions(maps, p.info.Binaries), 24, func(addr uint64, data []byte) bool {
		last := binary.LittleEndian.Uint32(data)
		if last < 256 || last > 1<<26 || binary.LittleEndian.Uint32(data[4:]) != 0 {
			return false
		}
		ids := binary.LittleEndian.Uint64(data[16:])
		if !isHeapPtr(ids) {
			return false
		}
		n, _, err := p.rarray(ids)
		if chunks := uint64(last)/idEntryUnit + 1; err != nil || (n != chunks && n+1 != chunks) {
			return false
		}
		p.symbolsAddr = addr
		if s, err := p.serialString('+'); err == nil && s == "+" {
			p.note("ruby_global_symbols", p.symbolsAddr, "memory scan")
			return true
		}
		p.symbolsAddr = 0
		return false
	})
}

// ClassName returns the qualified name of the class or module at address
// klass ("Outer::Inner"), read from memory. A singleton class is named
// after the object it is attached to.
func (p *Process) ClassName(klass uint64) (string, error) {
	p.beginEpoch()
	name, _, err := p.n.classNameOf(klass)
	return name, err
}

// classNameOf returns the class path of klass and whether klass is a
// singleton class (then name is the attached class's path).
func (p *namer) classNameOf(klass uint64) (string, bool, error) {
	if c, ok := p.classCache[klass]; ok && p.current(&c.gen, c.wit) {
		p.classCache[klass] = c
		p.reuse(c.wit)
		return c.name, c.singleton, nil
	}
	wit := p.startWitness()
	misses := p.incomplete
	name, singleton, err := p.readClassName(klass, 0)
	p.endWitness(wit)
	if err != nil {
		return "", false, err
	}
	if p.incomplete != misses {
		return name, singleton, nil // incomplete: not cached
	}
	if len(p.classCache) > 100000 {
		p.classCache = map[uint64]className{}
	}
	p.classCache[klass] = className{name, singleton, p.epoch, wit.clip()}
	return name, singleton, nil
}

func (p *namer) readClassName(klass uint64, depth int) (string, bool, error) {
	if depth > 4 || !isHeapPtr(klass) {
		return "", false, invalidf("not a class: 0x%x", klass)
	}
	b, err := p.r.read(klass, 16)
	if err != nil {
		return "", false, fmt.Errorf("read class at 0x%x: %w", klass, err)
	}
	flags, kl := le64(b, 0), le64(b, 8)
	singletonFlag := uint64(1) << 12 // FL_SINGLETON = FL_USER0
	if p.rt.singletonUser1 {
		singletonFlag = 1 << 13 // FL_USER1 from 3.4
	}
	p.sawWord(klass, flags, tMask|singletonFlag)
	switch flags & tMask {
	case tClass, tModule:
	case tIClass:
		p.sawWord(klass+8, kl, ^uint64(0))
		return p.readClassName(kl, depth+1)
	default:
		return "", false, invalidf("object at 0x%x is not a class (type 0x%x)", klass, flags&tMask)
	}
	if flags&singletonFlag != 0 {
		att, err := p.attachedObject(klass)
		if err != nil || att == 0 {
			return "", true, err
		}
		name, _, err := p.readClassName(att, depth+1)
		return name, true, err
	}
	name, err := p.classPath(klass)
	return name, false, err
}

// classPath reads the permanent class path of a named class.
func (p *namer) classPath(klass uint64) (string, error) {
	o := &p.rt.o
	switch {
	case o.classextOff.ok && o.classpathOff.ok: // 3.3+
		cp, err := p.sawU64(klass + o.classextOff.off + o.classpathOff.off)
		if err != nil {
			return "", fmt.Errorf("read classpath: %w", err)
		}
		if !isHeapPtr(cp) {
			return "", nil // anonymous
		}
		return p.rstring(cp)
	case p.rt.hiddenIvarNames:
		val, ok, err := p.classIvar(klass, "__classpath__")
		if err != nil || !ok {
			return "", err
		}
		return p.rstring(val)
	}
	return "", nil
}

// attachedObject returns the object a singleton class is attached to.
func (p *namer) attachedObject(klass uint64) (uint64, error) {
	o := &p.rt.o
	if o.classextOff.ok && o.attachedOff.ok {
		return p.sawU64(klass + o.classextOff.off + o.attachedOff.off)
	}
	if p.rt.hiddenIvarNames {
		val, ok, err := p.classIvar(klass, "__attached__")
		if err != nil || !ok {
			return 0, err
		}
		return val, nil
	}
	return 0, nil
}

// Before 3.2, a class's hidden ivars (__classpath__, __attached__) live in
// the st_table iv_tbl of its classext (RClass.ptr at 24; iv_tbl at 8 of
// rb_classext_struct in 2.1 to 3.1).
const (
	rclassPtr      = 24
	classextIvTbl  = 8
	stNumEntries   = 16
	stEntriesStart = 32
	stEntriesBound = 40
	stEntries      = 48
	stEntrySize    = 24
	maxStEntries   = 1 << 16
)

func (p *namer) classIvar(klass uint64, name string) (uint64, bool, error) {
	resume := p.notRecording() // found once per process
	serial, err := p.hiddenSerial(name)
	resume()
	if err != nil || serial == 0 {
		return 0, false, err
	}
	ext, err := p.sawU64(klass + rclassPtr)
	if err != nil || !isHeapPtr(ext) {
		return 0, false, err
	}
	ivOff := uint64(classextIvTbl)
	if f, err := p.rt.lay.Field("rb_classext_struct", "iv_tbl"); err == nil {
		ivOff = f.Offset
	}
	tbl, err := p.sawU64(ext + ivOff)
	if err != nil || !isHeapPtr(tbl) {
		return 0, false, err
	}
	hdr, err := p.r.readOwned(tbl, 56)
	if err != nil {
		return 0, false, fmt.Errorf("read ivar table: %w", err)
	}
	start, bound, entries := le64(hdr, stEntriesStart), le64(hdr, stEntriesBound), le64(hdr, stEntries)
	p.saw(tbl+stEntriesStart, hdr[stEntriesStart:stEntries+8])
	if bound < start || bound-start > maxStEntries || !isHeapPtr(entries) {
		return 0, false, invalidf("ivar table at 0x%x", tbl)
	}
	data, err := p.r.readOwned(entries+start*stEntrySize, int((bound-start)*stEntrySize))
	if err != nil {
		return 0, false, fmt.Errorf("read ivar entries: %w", err)
	}
	p.saw(entries+start*stEntrySize, data)
	for i := uint64(0); i < bound-start; i++ {
		e := data[i*stEntrySize:]
		key := le64(e, 8)
		if key>>idScopeShift == serial && key > maxOpID {
			return le64(e, 16), true, nil
		}
	}
	return 0, false, nil
}

// hiddenSerial finds the symbol serial of an internal name such as
// "__classpath__" by searching the global symbol table (they are interned
// early, so the search is short).
func (p *namer) hiddenSerial(name string) (uint64, error) {
	if p.classpathSerial == 0 || p.attachedSerial == 0 {
		if err := p.searchSerials(); err != nil {
			p.incomplete++
			return 0, err
		}
	}
	var serial uint64
	switch name {
	case "__classpath__":
		serial = p.classpathSerial
	case "__attached__":
		serial = p.attachedSerial
	}
	if serial == 0 {
		p.incomplete++
	}
	return serial, nil
}

// maxSerialSearch bounds the symbol serials searched for the hidden ivar
// names (interned while Ruby boots: a few hundred in).
const maxSerialSearch = 20000

// searchSerials searches the symbols interned since the last search for
// the hidden ivar names (symbols are only ever added, so each serial is
// read once).
func (p *namer) searchSerials() error {
	if !p.findSymbols() {
		return errNoSymbols
	}
	if p.serialsSearched == 0 && p.tryHiddenHint() {
		return nil
	}
	defer func() {
		if p.classpathSerial != 0 && p.attachedSerial != 0 {
			p.rt.hiddenHint.Store(p.classpathSerial<<32 | p.attachedSerial)
		}
	}()
	last, err := p.r.u32(p.symbolsAddr + symbolsLastID)
	if err != nil {
		return fmt.Errorf("read symbol table: %w", err)
	}
	limit := min(uint64(last), maxSerialSearch)
	for s := p.serialsSearched + 1; s <= limit && (p.classpathSerial == 0 || p.attachedSerial == 0); s++ {
		p.serialsSearched = s
		str, err := p.serialString(s)
		if err != nil {
			continue // not a String (a freed dynamic symbol, say)
		}
		switch str {
		case "__classpath__":
			p.classpathSerial = s
		case "__attached__":
			p.attachedSerial = s
		}
	}
	return nil
}

// tryHiddenHint takes the serials another process of this build found
// the hidden ivar names at (Runtime.hiddenHint) when this process's
// symbol table has those names there: a few reads instead of a search of
// a few hundred serials (some 2 ms) for each new process.
func (p *namer) tryHiddenHint() bool {
	h := p.rt.hiddenHint.Load()
	cp, at := h>>32, h&(1<<32-1)
	if cp == 0 || at == 0 {
		return false
	}
	if s, err := p.serialString(cp); err != nil || s != "__classpath__" {
		return false
	}
	if s, err := p.serialString(at); err != nil || s != "__attached__" {
		return false
	}
	p.classpathSerial, p.attachedSerial = cp, at
	return true
}

// maxSymScanWait is the longest wait between two memory scans for the
// global symbol table.
const maxSymScanWait = 10 * time.Second

// findSymbols reports whether the global symbol table is known, scanning
// memory for it (see scanForSymbols) when it is not exported and the last
// scan is old enough.
func (p *namer) findSymbols() bool {
	if p.symbolsAddr != 0 {
		return true
	}
	now := time.Now()
	if now.Before(p.symScanNext) {
		return false
	}
	p.scanForSymbols()
	if p.symbolsAddr != 0 {
		return true
	}
	p.symScanWait = min(max(2*p.symScanWait, 100*time.Millisecond), maxSymScanWait)
	p.symScanNext = time.Now().Add(p.symScanWait)
	return false
}

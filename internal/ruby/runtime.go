package ruby

import (
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/rbscope/rbscope/internal/elfx"
	"github.com/rbscope/rbscope/internal/layout"
)

// Runtimes shares what Open learns about one Ruby build (a set of binaries
// told apart by their GNU build ids) among every process that runs it:
// each binary's parsed symbol table, and the build's version and struct
// layout. The forks of a Puma master, or fifty processes started from one
// Ruby, then cost one ELF parse and one DWARF read between them; each
// process still locates its own VM. A binary without a build id is never
// shared (nothing tells two such files apart). Safe for concurrent use;
// pass one to every Open through Options.Runtimes.
type Runtimes struct {
	mu     sync.Mutex
	bins   map[string]*elfx.Binary // by build id
	builds map[string]*Runtime
	// busy holds the keys ("bin:ID", "build:KEY") being resolved by one
	// Open: the others of that build wait for it rather than resolve the
	// same build at once (closed when done).
	busy    map[string]chan struct{}
	opens   atomic.Int64
	symLoad atomic.Int64
	symHit  atomic.Int64
	layRes  atomic.Int64
	layHit  atomic.Int64
}

// Runtime is what is true of one Ruby build whichever process runs it: its
// version, its struct layout, the offsets resolved from that layout, and
// the capabilities the version implies (named here, rather than compared
// as versions where they are used). Immutable once made, but for hints
// learned from one of its processes that every process checks before it
// uses them (hiddenHint): the processes of one build share one Runtime
// (see Runtimes), a fork its parent's.
type Runtime struct {
	version       string // "3.1.2"
	versionSource string // how the version was told
	ver           int    // version as v(major, minor, patch)
	lay           *layout.Layout
	o             offsets
	bodyMask      []byte // the iseq body bytes readIseqInfo decodes (see witness.go)

	// Capabilities implied by the version, where Ruby's logic (not only
	// its offsets) changed.

	// iseqBody: 2.0+, an iseq keeps its names and lines in a body;
	// before, in the iseq itself.
	iseqBody bool
	// livingThreads: 2.2+, the VM lists its threads in living_threads
	// (a ccan list); before, in an st_table.
	livingThreads bool
	// symbolSerials: 2.2+, an ID's name is found by its serial number in
	// the global symbol table; class paths and attached objects sit in
	// hidden ivars until 3.2 (hiddenIvarNames).
	symbolSerials   bool
	hiddenIvarNames bool
	// epFrames: 2.3+, a frame's magic and method entry are in its
	// environment (ep), iseqs are imemo objects, static labels are
	// named by iseq type, and the thread status enum starts with
	// "running" (before, THREAD_TO_KILL came first).
	epFrames bool
	// execContext: 2.5+, threads run in execution contexts
	// (ruby_current_execution_context_ptr until 3.0).
	execContext bool
	// ractors: 3.0+, the VM holds ractors, each with its threads and GVL
	// (the VM is found by ruby_current_vm_ptr).
	ractors bool
	// gvlOwnerInVM: 2.6-2.7, the GVL (and its owner) is in the VM.
	gvlOwnerInVM bool
	// gvlInSched: 3.2+, the GVL's owner is the ractor's thread
	// scheduler's running thread; schedFlags: 3.3+, three bools (not a
	// mutex) between it and the ready queue.
	gvlInSched, schedFlags bool
	// wideArrayLen: 3.2+, an embedded Array's length has 7 bits (2
	// before).
	wideArrayLen bool
	// singletonUser1: 3.4+, FL_SINGLETON is FL_USER1 (FL_USER0 before).
	singletonUser1 bool

	// hiddenHint is the symbol serials of the hidden ivar names
	// (__classpath__ in the high 32 bits, __attached__ in the low) one
	// process of this build found them at (0: none yet). Ruby interns
	// both while it boots, so they are most often the same in every
	// process of a build; each process checks them in its own symbol
	// table (see namer.searchSerials).
	hiddenHint atomic.Uint64
}

// newRuntime makes the Runtime of a build of the given version (trimmed;
// how it was told: source) with layout l.
func newRuntime(version, source string, l *layout.Layout) (*Runtime, error) {
	o, err := resolveOffsets(l)
	if err != nil {
		return nil, err
	}
	ver := parseVer(version)
	rt := &Runtime{
		version: version, versionSource: source, ver: ver, lay: l, o: o,
		iseqBody:        ver >= v(2, 0, 0),
		livingThreads:   ver >= v(2, 2, 0),
		symbolSerials:   ver >= v(2, 2, 0),
		hiddenIvarNames: ver >= v(2, 2, 0) && ver < v(3, 2, 0),
		epFrames:        ver >= v(2, 3, 0),
		execContext:     ver >= v(2, 5, 0),
		gvlOwnerInVM:    ver >= v(2, 6, 0) && ver < v(3, 0, 0),
		ractors:         ver >= v(3, 0, 0),
		gvlInSched:      ver >= v(3, 2, 0),
		schedFlags:      ver >= v(3, 3, 0),
		wideArrayLen:    ver >= v(3, 2, 0),
		singletonUser1:  ver >= v(3, 4, 0),
	}
	rt.bodyMask = bodyMaskOf(&rt.o)
	return rt, nil
}

// RuntimeStats counts a Runtimes' work and savings.
type RuntimeStats struct {
	Opens int64 // Opens that used the cache
	// SymbolLoads counts the binaries whose symbols were read from their
	// files (or from memory, without a build id); SymbolHits those taken
	// from the cache.
	SymbolLoads, SymbolHits int64
	// LayoutResolutions counts version detections and layout look-ups
	// (DWARF, its cache, or the built-in tables); LayoutHits the builds
	// whose version and layout came from the cache.
	LayoutResolutions, LayoutHits int64
	// Builds is the number of Ruby builds known.
	Builds int
}

// NewRuntimes returns an empty cache.
func NewRuntimes() *Runtimes {
	return &Runtimes{bins: map[string]*elfx.Binary{}, builds: map[string]*Runtime{}, busy: map[string]chan struct{}{}}
}

// Stats returns the counts so far.
func (r *Runtimes) Stats() RuntimeStats {
	r.mu.Lock()
	n := len(r.builds)
	r.mu.Unlock()
	return RuntimeStats{
		Opens:             r.opens.Load(),
		SymbolLoads:       r.symLoad.Load(),
		SymbolHits:        r.symHit.Load(),
		LayoutResolutions: r.layRes.Load(),
		LayoutHits:        r.layHit.Load(),
		Builds:            n,
	}
}

// claim returns once key is in the cache (found reports true, a hit) or
// this caller is the one to resolve it (found false): then it must call
// release(key) once it has stored the result, or failed. lookup reports
// whether key is cached; r.mu is held while it runs.
func (r *Runtimes) claim(key string, lookup func() bool) (found bool) {
	for {
		r.mu.Lock()
		if lookup() {
			r.mu.Unlock()
			return true
		}
		ch, busy := r.busy[key]
		if !busy {
			r.busy[key] = make(chan struct{})
			r.mu.Unlock()
			return false
		}
		r.mu.Unlock()
		<-ch
	}
}

// release ends a claim: the callers waiting on key look again.
func (r *Runtimes) release(key string) {
	r.mu.Lock()
	if ch, ok := r.busy[key]; ok {
		close(ch)
		delete(r.busy, key)
	}
	r.mu.Unlock()
}

// binary returns the parsed binary with build id id, nil when unknown:
// then the caller must parse it and call keepBinary (or release on
// failure), and other callers for id wait meanwhile.
func (r *Runtimes) binary(id string) *elfx.Binary {
	if r == nil || id == "" {
		return nil
	}
	var b *elfx.Binary
	if r.claim("bin:"+id, func() bool { b = r.bins[id]; return b != nil }) {
		r.symHit.Add(1)
		return b
	}
	return nil
}

// keepBinary remembers b under its build id, and ends the claim of id
// (the build id read from memory, which b's should equal).
func (r *Runtimes) keepBinary(id string, b *elfx.Binary) {
	if r == nil {
		return
	}
	if b != nil && b.BuildID != "" && b.BuildID == id {
		r.mu.Lock()
		r.bins[b.BuildID] = b
		r.mu.Unlock()
	}
	if id != "" {
		r.release("bin:" + id)
	}
}

// buildKey is the key of a process's build: its binaries' build ids, ""
// when one lacks a build id.
func buildKey(bins []Binary) string {
	ids := make([]string, 0, len(bins))
	for _, b := range bins {
		if b.BuildID == "" {
			return ""
		}
		ids = append(ids, b.BuildID)
	}
	if len(ids) == 0 {
		return ""
	}
	sort.Strings(ids)
	return strings.Join(ids, "+")
}

// build returns the cached Runtime of build key; nil when unknown: then
// the caller makes it and calls keepBuild (with nil on failure), and
// other callers for key wait meanwhile.
func (r *Runtimes) build(key string) *Runtime {
	if r == nil || key == "" {
		return nil
	}
	var b *Runtime
	if r.claim("build:"+key, func() bool { b = r.builds[key]; return b != nil }) {
		r.layHit.Add(1)
		return b
	}
	return nil
}

// keepBuild remembers b (nil: resolution failed) and ends the claim.
func (r *Runtimes) keepBuild(key string, b *Runtime) {
	if r == nil || key == "" {
		return
	}
	if b != nil {
		r.mu.Lock()
		r.builds[key] = b
		r.mu.Unlock()
	}
	r.release("build:" + key)
}

func (r *Runtimes) countSymbolLoad() {
	if r != nil {
		r.symLoad.Add(1)
	}
}

// sharedBinary returns the cached parse of the binary whose header is
// mapped at base (file offset off), found by the build id in the
// process's memory, and that id; a nil binary without a cache, a build
// id or an entry (with an id, the caller then owes keepBinary(id, ...)).
func (p *opener) sharedBinary(base, off uint64) (*elfx.Binary, string) {
	if p.opts.Runtimes == nil || off != 0 {
		return nil, ""
	}
	id, err := elfx.ReadMemoryBuildID(p.t, base)
	if err != nil || id == "" {
		return nil, ""
	}
	return p.opts.Runtimes.binary(id), id
}

// versionAndLayout detects the Ruby version and resolves the struct
// layout into the process's Runtime, or takes the Runtime of another
// process of the same build.
func (p *opener) versionAndLayout() error {
	rts := p.opts.Runtimes
	if rts != nil {
		rts.opens.Add(1)
	}
	key := ""
	if rts != nil && p.opts.Version == "" && p.opts.Layout == nil {
		key = buildKey(p.info.Binaries)
	}
	rt := rts.build(key)
	if rt == nil {
		if rts != nil {
			rts.layRes.Add(1)
		}
		version, source, err := p.detectVersion()
		if err == nil {
			rt, err = p.loadLayout(version, source)
		}
		rts.keepBuild(key, rt)
		if err != nil {
			return err
		}
	}
	p.useRuntime(rt)
	return nil
}

// useRuntime makes rt the process's Runtime.
func (p *Process) useRuntime(rt *Runtime) {
	p.rt = rt
	p.info.Version = rt.version
	p.info.VersionSource = rt.versionSource
	p.info.LayoutSource = rt.lay.Source
}

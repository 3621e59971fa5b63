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
	builds map[string]*runtimeBuild
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

// runtimeBuild is what one build's processes share beyond symbols.
type runtimeBuild struct {
	version, versionSource string
	lay                    *layout.Layout
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
	return &Runtimes{bins: map[string]*elfx.Binary{}, builds: map[string]*runtimeBuild{}, busy: map[string]chan struct{}{}}
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

// build returns the cached version and layout of build key; nil when
// unknown: then the caller resolves them and calls keepBuild (with nil
// on failure), and other callers for key wait meanwhile.
func (r *Runtimes) build(key string) *runtimeBuild {
	if r == nil || key == "" {
		return nil
	}
	var b *runtimeBuild
	if r.claim("build:"+key, func() bool { b = r.builds[key]; return b != nil }) {
		r.layHit.Add(1)
		return b
	}
	return nil
}

// keepBuild remembers b (nil: resolution failed) and ends the claim.
func (r *Runtimes) keepBuild(key string, b *runtimeBuild) {
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
func (p *Process) sharedBinary(base, off uint64) (*elfx.Binary, string) {
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
// layout, or takes both from another process of the same build.
func (p *Process) versionAndLayout() error {
	rt := p.opts.Runtimes
	if rt != nil {
		rt.opens.Add(1)
	}
	key := ""
	if rt != nil && p.opts.Version == "" && p.opts.Layout == nil {
		key = buildKey(p.info.Binaries)
	}
	if b := rt.build(key); b != nil {
		p.setVersion(b.version, b.versionSource)
		p.opts.Layout = b.lay
		return p.loadLayout()
	}
	if rt != nil {
		rt.layRes.Add(1)
	}
	if err := p.detectVersion(); err != nil {
		rt.keepBuild(key, nil)
		return err
	}
	if err := p.loadLayout(); err != nil {
		rt.keepBuild(key, nil)
		return err
	}
	rt.keepBuild(key, &runtimeBuild{version: p.version, versionSource: p.info.VersionSource, lay: p.lay})
	return nil
}

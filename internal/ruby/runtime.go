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
	mu      sync.Mutex
	bins    map[string]*elfx.Binary // by build id
	builds  map[string]*runtimeBuild
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
	return &Runtimes{bins: map[string]*elfx.Binary{}, builds: map[string]*runtimeBuild{}}
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

// binary returns the parsed binary with build id id, nil when unknown.
func (r *Runtimes) binary(id string) *elfx.Binary {
	if r == nil || id == "" {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	b := r.bins[id]
	if b != nil {
		r.symHit.Add(1)
	}
	return b
}

// keepBinary remembers b under its build id.
func (r *Runtimes) keepBinary(b *elfx.Binary) {
	if r == nil || b.BuildID == "" {
		return
	}
	r.mu.Lock()
	r.bins[b.BuildID] = b
	r.mu.Unlock()
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

func (r *Runtimes) build(key string) *runtimeBuild {
	if r == nil || key == "" {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	b := r.builds[key]
	if b != nil {
		r.layHit.Add(1)
	}
	return b
}

func (r *Runtimes) keepBuild(key string, b *runtimeBuild) {
	if r == nil || key == "" {
		return
	}
	r.mu.Lock()
	r.builds[key] = b
	r.mu.Unlock()
}

func (r *Runtimes) countSymbolLoad() {
	if r != nil {
		r.symLoad.Add(1)
	}
}

// sharedBinary returns the cached parse of the binary whose header is
// mapped at base (file offset off), found by the build id in the
// process's memory; nil without a cache, a build id or an entry.
func (p *Process) sharedBinary(base, off uint64) *elfx.Binary {
	if p.opts.Runtimes == nil || off != 0 {
		return nil
	}
	id, err := elfx.ReadMemoryBuildID(p.t, base)
	if err != nil || id == "" {
		return nil
	}
	return p.opts.Runtimes.binary(id)
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
		return err
	}
	if err := p.loadLayout(); err != nil {
		return err
	}
	rt.keepBuild(key, &runtimeBuild{version: p.version, versionSource: p.info.VersionSource, lay: p.lay})
	return nil
}

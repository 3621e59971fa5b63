package alloc

import (
	"debug/elf"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/rbscope/rbscope/internal/elfx"
	"github.com/rbscope/rbscope/internal/ruby"
	"github.com/rbscope/rbscope/internal/target"
	"github.com/rbscope/rbscope/internal/usdt"
)

// Kind is what an attached site reports. The values are shared with the
// eBPF program.
type Kind uint32

// Probe kinds.
const (
	KindObject   Kind = 1 // ruby:object__create(classname, file, line)
	KindArray    Kind = 2 // ruby:array__create(length, file, line)
	KindHash     Kind = 3 // ruby:hash__create(length, file, line)
	KindString   Kind = 4 // ruby:string__create(length, file, line)
	KindSymbol   Kind = 5 // ruby:symbol__create(str, file, line)
	KindNewobj   Kind = 6 // entry of an allocation function: klass VALUE
	KindClassNew Kind = 7 // entry of Class#new (counted as KindNewobj)
	// KindReturn is the instruction after the allocation call that
	// follows a create probe (retained mode): rax is the new object.
	KindReturn      Kind = 8
	KindGCMarkBegin Kind = 16
	KindGCMarkEnd   Kind = 17
	KindGCSwpBegin  Kind = 18
	KindGCSwpEnd    Kind = 19
	// KindExit is the entry of Ruby's teardown (exitFunc), where the
	// program copies Ruby's allocation counter before it is gone.
	KindExit Kind = 20
)

// exitFunc is the function whose entry the exit probe hooks: rb_ec_cleanup
// (what ruby_run_node, ruby_cleanup and ruby_stop end in, whether the
// program ended, called exit or raised) calls it after the at_exit
// handlers and finalizers ran, the last Ruby code; it frees the object
// space (Ruby 3.1) or leaves it to the process's end (3.3), so at its
// entry Ruby's counter is final and still there. It is public C API
// (include/ruby/vm.h), hence in the dynamic symbols of every libruby and
// of an executable that links Ruby statically (which exports its symbols
// for C extensions): no DWARF needed. exit! and fatal signals skip it.
const exitFunc = "ruby_vm_destruct"

// always reports whether a site stays attached for the whole session
// (GC phases and the exit probe: a few events per GC, one at exit),
// whatever the duty cycle.
func (s Site) always() bool { return s.Kind >= KindGCMarkBegin }

var probeKinds = map[string]Kind{
	"object__create":   KindObject,
	"array__create":    KindArray,
	"hash__create":     KindHash,
	"string__create":   KindString,
	"symbol__create":   KindSymbol,
	"gc__mark__begin":  KindGCMarkBegin,
	"gc__mark__end":    KindGCMarkEnd,
	"gc__sweep__begin": KindGCSwpBegin,
	"gc__sweep__end":   KindGCSwpEnd,
}

// kindClass names the class of the objects a kind counts, when the probe
// does not say.
var kindClass = map[Kind]string{
	KindArray:  "Array",
	KindHash:   "Hash",
	KindString: "String",
	KindSymbol: "Symbol",
}

// Site is one place a program is attached.
type Site struct {
	Kind Kind
	Name string // probe or function name
	// Offset and RefCtrOffset are file offsets of the site and of its
	// semaphore (0: none) in Binary.
	Offset, RefCtrOffset uint64
	Args                 []usdt.Arg
	// Origins are, for a KindReturn site, the indexes in Plan.Sites of
	// the create probes whose allocation returns here.
	Origins []int
}

// Plan is what Attach will attach to in one process.
type Plan struct {
	// Binary is the path of the ELF file in the target's mount namespace
	// ("/usr/lib/x86_64-linux-gnu/libruby-3.1.so.3.1"). The plan was
	// read from the file the process mapped (target.Target.OpenFile),
	// never from another file now at that path.
	Binary string
	// BuildID is the mapped binary's GNU build id (hex, "" if none).
	BuildID string
	// Mode is "usdt" or "symbols".
	Mode  string
	Sites []Site
	// Skipped lists probe sites left out, with the reason.
	Skipped []string
	// RetSkipped lists create probes whose allocation call could not be
	// found (retained mode does not track their objects), with the reason.
	RetSkipped []string
}

// ErrNoProbes means the Ruby binary has neither USDT probes nor symbols
// for its allocation functions.
var ErrNoProbes = errors.New("this Ruby has neither USDT probes (built without --enable-dtrace) nor symbols for its allocation functions")

// newobjFuncs are exported allocation functions and the registers holding
// their klass and flags arguments at entry (System V: rdi, rsi, rdx, ...;
// flags "" for none). The flags let the program skip imemos, whose klass
// slot holds no class of theirs (3.4's rb_imemo_new, in imemo.c, passes a
// call cache's receiver class there through these functions).
var newobjFuncs = []struct {
	name, reg, flags string
	kind             Kind
}{
	{"rb_wb_protected_newobj_of", "rdi", "rsi", KindNewobj},
	{"rb_wb_unprotected_newobj_of", "rdi", "rsi", KindNewobj},
	{"rb_ec_wb_protected_newobj_of", "rsi", "rdx", KindNewobj},
	{"rb_newobj_of", "rdi", "rsi", KindNewobj},
	// Class#new and its C API: T_OBJECT allocation is inlined in Ruby's
	// gc.c, so objects of Ruby classes are counted here (and the
	// allocation-function call that may follow for the same klass on the
	// same thread is not counted again).
	{"rb_class_new_instance_pass_kw", "rdx", "", KindClassNew},
	{"rb_class_new_instance_kw", "rdx", "", KindClassNew},
	{"rb_class_new_instance", "rdx", "", KindClassNew},
}

// PlanFor finds the Ruby binary mapped into the target (the executable or
// a libruby) and decides where to attach: USDT probes if it has them,
// allocation functions otherwise. forceSymbols skips the probes (to test
// the fallback).
func PlanFor(t target.Target, forceSymbols bool) (*Plan, error) {
	maps, err := t.Mappings()
	if err != nil {
		return nil, fmt.Errorf("read mappings: %w", err)
	}
	var cands []string
	seen := map[string]bool{}
	add := func(p string) {
		if p != "" && !seen[p] {
			seen[p] = true
			cands = append(cands, p)
		}
	}
	for _, m := range maps {
		if strings.Contains(filepath.Base(m.Path), "libruby") {
			add(m.Path)
		}
	}
	add(t.Executable())
	if err := checkRuby(t, maps); err != nil {
		return nil, err
	}
	var errs []error
	var symPlan *Plan
	for _, c := range cands {
		p, err := planMapped(t, c, forceSymbols)
		if err != nil {
			if target.IsReplaced(err) || target.IsExited(err) {
				// Another Ruby binary would not help: the VM is
				// in this one.
				return nil, err
			}
			errs = append(errs, err)
			continue
		}
		if p == nil {
			continue
		}
		if p.Mode == "usdt" {
			return p, nil
		}
		if symPlan == nil {
			symPlan = p
		}
	}
	if symPlan != nil {
		return symPlan, nil
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%w (%v)", ErrNoProbes, errors.Join(errs...))
	}
	return nil, fmt.Errorf("%w: looked in %s", ErrNoProbes, strings.Join(cands, ", "))
}

// checkRuby fails with ruby.ErrNotRuby when the process maps no libruby
// and its executable has no Ruby symbols (ruby.IsRubyProcess): no probe
// could be found in it, and saying so beats saying that this "Ruby" has
// none. An executable that cannot be read is left to the planning.
func checkRuby(t target.Target, maps []target.Mapping) error {
	if ruby.IsRubyProcess(maps, "", nil) {
		return nil
	}
	exe := t.Executable()
	r, err := t.OpenFile(exe)
	if err != nil {
		return nil
	}
	defer r.Close()
	b, err := elfx.Open(r)
	if err != nil || ruby.IsRubyProcess(maps, exe, b.Symbols) {
		return nil
	}
	return fmt.Errorf("%w: %s maps no libruby and has no Ruby symbols", ruby.ErrNotRuby, exe)
}

// planMapped opens the binary the process mapped as path (the mapped
// object itself, or the file at the path once its inode and build id are
// checked: target.ReplacedError otherwise) and plans for it.
func planMapped(t target.Target, path string, forceSymbols bool) (*Plan, error) {
	r, err := t.OpenFile(path)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	b, err := elfx.Open(r)
	if err != nil {
		return nil, fmt.Errorf("read ELF %s of process %d: %w", path, t.Pid(), err)
	}
	p, err := planBinary(b.ELF(), path, forceSymbols)
	if p != nil {
		if err := addExitSite(p, b); err != nil {
			return nil, err
		}
		if p.BuildID, err = elfx.FileBuildID(r); err != nil {
			return nil, fmt.Errorf("build id of %s: %w", path, err)
		}
	}
	return p, err
}

// addExitSite adds the exit probe (exitFunc's entry) to p when b, the
// binary p attaches to, defines exitFunc; otherwise p.Skipped says so.
func addExitSite(p *Plan, b *elfx.Binary) error {
	s, ok := b.Symbols.Lookup(exitFunc)
	if !ok || s.Value == 0 {
		p.Skipped = append(p.Skipped, exitFunc+": not in the symbols: Ruby's counter is not read at exit")
		return nil
	}
	off, err := usdt.VaddrToOffset(b.ELF(), s.Value)
	if err != nil {
		return fmt.Errorf("%s in %s: %w", exitFunc, p.Binary, err)
	}
	p.Sites = append(p.Sites, Site{Kind: KindExit, Name: exitFunc, Offset: off})
	return nil
}

// HasExitProbe reports whether the plan reads Ruby's counter at exit.
func (p *Plan) HasExitProbe() bool {
	for _, s := range p.Sites {
		if s.Kind == KindExit {
			return true
		}
	}
	return false
}

// planBinary returns the plan for one binary, nil if it has nothing to
// attach to.
func planBinary(f *elf.File, path string, forceSymbols bool) (*Plan, error) {
	if f.Machine != elf.EM_X86_64 {
		return nil, fmt.Errorf("%s: %v is not supported (x86_64 only)", path, f.Machine)
	}
	plan := &Plan{Binary: path}
	if !forceSymbols {
		probes, err := usdt.FromELF(f)
		if err != nil {
			return nil, fmt.Errorf("read probes of %s: %w", path, err)
		}
		plan.Mode = "usdt"
		haveAlloc := false
		for _, p := range probes {
			if p.Provider != "ruby" {
				continue
			}
			k, ok := probeKinds[p.Name]
			if !ok {
				continue
			}
			where := fmt.Sprintf("%s at 0x%x", p.Name, p.Offset)
			if p.ArgErr != nil {
				plan.Skipped = append(plan.Skipped, fmt.Sprintf("%s: %v", where, p.ArgErr))
				continue
			}
			if k < KindGCMarkBegin && len(p.Args) < 3 {
				plan.Skipped = append(plan.Skipped, fmt.Sprintf("%s: %d arguments, want 3", where, len(p.Args)))
				continue
			}
			if (k == KindArray || k == KindHash || k == KindString) && p.Args[0].Kind == usdt.ArgConst && p.Args[0].Disp == 0 {
				// RUBY_DTRACE_CREATE_HOOK(ARRAY, 0) and friends sit in the
				// allocators (empty_ary_alloc, ...), which run only after
				// object__create has counted the same object with its
				// real class: counting them again would double count.
				plan.Skipped = append(plan.Skipped, where+": allocator site, counted by object__create")
				continue
			}
			plan.Sites = append(plan.Sites, Site{Kind: k, Name: p.Name, Offset: p.Offset, RefCtrOffset: p.SemaphoreOffset, Args: p.Args})
			if k < KindGCMarkBegin {
				haveAlloc = true
			}
		}
		if haveAlloc {
			return plan, nil
		}
		plan.Sites, plan.Skipped = nil, nil
	}
	plan.Mode = "symbols"
	syms, _ := f.Symbols()
	dyn, _ := f.DynamicSymbols()
	byName := map[string]elf.Symbol{}
	for _, s := range append(dyn, syms...) {
		if elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Value != 0 && s.Section != elf.SHN_UNDEF {
			byName[s.Name] = s
		}
	}
	_, haveEC := byName["rb_ec_wb_protected_newobj_of"]
	for _, fn := range newobjFuncs {
		s, ok := byName[fn.name]
		if !ok {
			continue
		}
		if fn.name == "rb_wb_protected_newobj_of" && !haveEC {
			// Ruby 3.3 folded rb_ec_wb_protected_newobj_of into it:
			// (ec, klass, flags, size), klass second.
			fn.reg, fn.flags = "rsi", "rdx"
		}
		off, err := usdt.VaddrToOffset(f, s.Value)
		if err != nil {
			return nil, fmt.Errorf("%s in %s: %w", fn.name, path, err)
		}
		var args []usdt.Arg
		for _, reg := range []string{fn.reg, fn.flags} {
			if reg == "" {
				continue
			}
			arg, err := usdt.ParseArg("8@%" + reg)
			if err != nil {
				return nil, err
			}
			args = append(args, arg)
		}
		plan.Sites = append(plan.Sites, Site{Kind: fn.kind, Name: fn.name, Offset: off, Args: args})
	}
	if len(plan.Sites) == 0 {
		return nil, nil
	}
	return plan, nil
}

func planOf(pid int) (*Plan, error) {
	t, err := target.OpenLive(pid)
	if err != nil {
		return nil, err
	}
	defer t.Close()
	return PlanFor(t, false)
}

// SemaphoreSites counts the sites of kind k that name the semaphore
// ReadSemaphore reads: attached, the kernel raises it once per uprobe that
// names it (Ruby 3.4 has two object__create sites sharing one).
func (p *Plan) SemaphoreSites(k Kind) int {
	var sem uint64
	n := 0
	for _, s := range p.Sites {
		if s.Kind == k && s.RefCtrOffset != 0 && (sem == 0 || s.RefCtrOffset == sem) {
			sem = s.RefCtrOffset
			n++
		}
	}
	return n
}

// ReadSemaphore reads the 2-byte semaphore of the first site of kind k in
// process pid (through /proc/PID/mem), to check that attaching raised it
// and detaching (or rbscope dying) dropped it.
func ReadSemaphore(pid int, plan *Plan, k Kind) (uint16, error) {
	var site *Site
	for i := range plan.Sites {
		if plan.Sites[i].Kind == k && plan.Sites[i].RefCtrOffset != 0 {
			site = &plan.Sites[i]
			break
		}
	}
	if site == nil {
		return 0, fmt.Errorf("no site of kind %d with a semaphore", k)
	}
	t, err := target.OpenLive(pid)
	if err != nil {
		return 0, err
	}
	defer t.Close()
	maps, err := t.Mappings()
	if err != nil {
		return 0, fmt.Errorf("read mappings: %w", err)
	}
	for _, m := range maps {
		if m.Path != plan.Binary || site.RefCtrOffset < m.Offset || site.RefCtrOffset >= m.Offset+(m.End-m.Start) {
			continue
		}
		var b [2]byte
		if err := t.ReadAt(b[:], m.Start+site.RefCtrOffset-m.Offset); err != nil {
			return 0, fmt.Errorf("read semaphore: %w", err)
		}
		return uint16(b[0]) | uint16(b[1])<<8, nil
	}
	return 0, fmt.Errorf("semaphore offset 0x%x of %s is not mapped", site.RefCtrOffset, plan.Binary)
}

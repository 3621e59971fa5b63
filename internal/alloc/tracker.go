package alloc

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/rbscope/rbscope/internal/target"
)

// Errors users hit, each with what to do. They wrap the underlying error.
var (
	// ErrPermission: the kernel refused to load or attach (needs
	// CAP_SYS_ADMIN for uprobes here; CAP_BPF+CAP_PERFMON are not enough).
	ErrPermission = errors.New("attaching eBPF uprobes needs CAP_SYS_ADMIN: run as root (CAP_BPF and CAP_PERFMON alone are not enough)")
	// ErrNoBPF: the kernel cannot load the program.
	ErrNoBPF = errors.New("this kernel cannot run the eBPF program (needs BPF with kprobe programs, attach cookies: Linux 5.15+)")
	// ErrNoUprobes: the kernel has no uprobe support.
	ErrNoUprobes = errors.New("this kernel has no uprobes (needs CONFIG_UPROBE_EVENTS)")
	// ErrProbeBusy: another tracer holds the probe with another semaphore.
	ErrProbeBusy = errors.New("another tracer (bcc?) holds this probe with a different semaphore offset: stop it and retry")
	// ErrUnsupportedArch: the program reads x86_64 registers.
	ErrUnsupportedArch = errors.New("rbscope alloc supports x86_64 only")
)

// Options tunes Attach.
type Options struct {
	// SamplePeriod counts one in SamplePeriod events (chosen at random, in
	// the kernel) and scales counts by it. 0 or 1 counts every event.
	SamplePeriod uint32
	// DutyCycle attaches the probes for this fraction of every DutyWindow
	// and scales counts by elapsed/attached time. 0 or >= 1: always.
	DutyCycle float64
	// DutyWindow is the duty-cycle period (default 1s).
	DutyWindow time.Duration
	// ForceSymbols uses the allocation-function fallback even when the
	// binary has USDT probes.
	ForceSymbols bool
	// ClassName resolves a klass VALUE to its name (the fallback mode
	// counts klass pointers). Nil: names are shown as addresses.
	ClassName func(klass uint64) (string, error)
}

// Tracker counts one process's allocations until closed.
type Tracker struct {
	pid   int
	t     target.Target
	plan  *Plan
	opts  Options
	objs  allocObjects
	exe   *link.Executable
	start time.Time

	mu       sync.Mutex
	links    []link.Link
	attached bool
	onSince  time.Time     // when the current attached period began
	onTotal  time.Duration // attached time before onSince
	stop     chan struct{}
	done     chan struct{}
	closed   bool
	names    *names
	dutyErr  error
}

// Attach loads the program and attaches it to the Ruby process pid.
func Attach(pid int, opts Options) (*Tracker, error) {
	if runtime.GOARCH != "amd64" {
		return nil, ErrUnsupportedArch
	}
	t, err := target.OpenLive(pid)
	if err != nil {
		return nil, err
	}
	plan, err := PlanFor(t, opts.ForceSymbols)
	if err != nil {
		t.Close()
		return nil, err
	}
	tr, err := attachPlan(t, plan, opts)
	if err != nil {
		t.Close()
		return nil, err
	}
	return tr, nil
}

func attachPlan(t target.Target, plan *Plan, opts Options) (*Tracker, error) {
	if len(plan.Sites) > maxSpecs {
		return nil, fmt.Errorf("%d probe sites (at most %d)", len(plan.Sites), maxSpecs)
	}
	if opts.SamplePeriod == 0 {
		opts.SamplePeriod = 1
	}
	if opts.DutyWindow <= 0 {
		opts.DutyWindow = time.Second
	}
	spec, err := loadAlloc()
	if err != nil {
		return nil, fmt.Errorf("load program spec: %w", err)
	}
	if err := spec.Variables[allocVarTargetTgid].Set(uint32(t.Pid())); err != nil {
		return nil, fmt.Errorf("set target pid: %w", err)
	}
	if err := spec.Variables[allocVarSamplePeriod].Set(opts.SamplePeriod); err != nil {
		return nil, fmt.Errorf("set sample period: %w", err)
	}
	tr := &Tracker{pid: t.Pid(), t: t, plan: plan, opts: opts, names: newNames(t, opts.ClassName)}
	// Memory is charged to the cgroup on current kernels; the memlock
	// rlimit is not raised (that would need CAP_SYS_RESOURCE).
	if err := spec.LoadAndAssign(&tr.objs, nil); err != nil {
		return nil, classifyLoad(err)
	}
	for i, s := range plan.Sites {
		ps := allocProbeSpec{Kind: uint32(s.Kind)}
		for j, a := range s.Args {
			if j >= len(ps.Args) {
				break
			}
			ps.Args[j] = allocArgSpec{Kind: uint8(a.Kind), Size: uint8(a.Size), RegOff: uint16(a.RegOffset), Val: a.Disp}
			if a.Signed {
				ps.Args[j].IsSigned = 1
			}
		}
		if err := tr.objs.ProbeSpecs.Put(uint32(i), &ps); err != nil {
			tr.objs.Close()
			return nil, fmt.Errorf("store probe spec: %w", err)
		}
	}
	tr.exe, err = link.OpenExecutable(plan.HostPath)
	if err != nil {
		tr.objs.Close()
		return nil, fmt.Errorf("open %s: %w", plan.Binary, err)
	}
	tr.start = time.Now()
	if err := tr.attach(); err != nil {
		tr.objs.Close()
		return nil, err
	}
	if opts.DutyCycle > 0 && opts.DutyCycle < 1 {
		tr.stop = make(chan struct{})
		tr.done = make(chan struct{})
		go tr.dutyLoop()
	}
	return tr, nil
}

const maxSpecs = 256

// attach attaches the program to every site. Called with mu held or
// before the tracker is shared.
func (tr *Tracker) attach() error {
	links := make([]link.Link, 0, len(tr.plan.Sites))
	for i, s := range tr.plan.Sites {
		l, err := tr.exe.Uprobe(s.Name, tr.objs.RubyAlloc, &link.UprobeOptions{
			Address:      s.Offset,
			RefCtrOffset: s.RefCtrOffset,
			PID:          tr.pid,
			Cookie:       uint64(i),
		})
		if err != nil {
			for _, l := range links {
				l.Close()
			}
			return classifyAttach(err, tr.pid, s)
		}
		links = append(links, l)
	}
	tr.links = links
	tr.attached = true
	tr.onSince = time.Now()
	return nil
}

func (tr *Tracker) detach() {
	for _, l := range tr.links {
		l.Close()
	}
	tr.links = nil
	if tr.attached {
		tr.onTotal += time.Since(tr.onSince)
	}
	tr.attached = false
}

func (tr *Tracker) dutyLoop() {
	defer close(tr.done)
	on := time.Duration(float64(tr.opts.DutyWindow) * tr.opts.DutyCycle)
	off := tr.opts.DutyWindow - on
	for {
		select {
		case <-tr.stop:
			return
		case <-time.After(on):
		}
		tr.mu.Lock()
		tr.detach()
		tr.mu.Unlock()
		select {
		case <-tr.stop:
			return
		case <-time.After(off):
		}
		tr.mu.Lock()
		if !tr.closed {
			if err := tr.attach(); err != nil {
				tr.dutyErr = err
				tr.mu.Unlock()
				return
			}
		}
		tr.mu.Unlock()
	}
}

// Plan returns where the tracker is attached.
func (tr *Tracker) Plan() *Plan { return tr.plan }

// Pid is the traced process.
func (tr *Tracker) Pid() int { return tr.pid }

// Close detaches and frees everything. The kernel also detaches (and
// decrements the probes' semaphores) when rbscope dies, because the links
// are file descriptors.
func (tr *Tracker) Close() error {
	tr.mu.Lock()
	if tr.closed {
		tr.mu.Unlock()
		return nil
	}
	tr.closed = true
	tr.mu.Unlock()
	if tr.stop != nil {
		close(tr.stop)
		<-tr.done
	}
	tr.mu.Lock()
	tr.detach()
	tr.mu.Unlock()
	tr.objs.Close()
	return tr.t.Close()
}

// Alive reports whether the traced process still exists.
func (tr *Tracker) Alive() bool {
	err := unix.Kill(tr.pid, 0)
	if err == nil || errors.Is(err, unix.EPERM) {
		// A zombie has exited even though kill succeeds.
		b, rerr := os.ReadFile(fmt.Sprintf("/proc/%d/stat", tr.pid))
		if rerr != nil {
			return false
		}
		i := strings.LastIndexByte(string(b), ')')
		return i < 0 || i+2 >= len(b) || b[i+2] != 'Z'
	}
	return false
}

func classifyLoad(err error) error {
	switch {
	case errors.Is(err, unix.EPERM), errors.Is(err, unix.EACCES):
		return fmt.Errorf("%w: load program: %v", ErrPermission, err)
	case errors.Is(err, ebpf.ErrNotSupported), errors.Is(err, unix.ENOSYS), errors.Is(err, unix.EINVAL):
		return fmt.Errorf("%w: load program: %v", ErrNoBPF, err)
	}
	return fmt.Errorf("load program: %w", err)
}

func classifyAttach(err error, pid int, s Site) error {
	where := fmt.Sprintf("attach to %s at offset 0x%x", s.Name, s.Offset)
	switch {
	case errors.Is(err, unix.EPERM), errors.Is(err, unix.EACCES):
		return fmt.Errorf("%w: %s: %v", ErrPermission, where, err)
	case errors.Is(err, unix.ESRCH):
		return fmt.Errorf("%s: %w", where, target.ErrProcessExited{Pid: pid})
	case errors.Is(err, unix.EINVAL) && s.RefCtrOffset != 0:
		// The kernel logs "ref_ctr_offset mismatch" when a uprobe at the
		// same place exists with another semaphore offset.
		return fmt.Errorf("%w: %s: %v", ErrProbeBusy, where, err)
	case errors.Is(err, ebpf.ErrNotSupported), errors.Is(err, link.ErrNotSupported):
		return fmt.Errorf("%w: %s: %v", ErrNoUprobes, where, err)
	}
	return fmt.Errorf("%s: %w", where, err)
}

// names reads C strings and class names from the target, once per
// distinct address.
type names struct {
	t         target.Target
	strs      map[uint64]string
	classes   map[uint64]string
	className func(uint64) (string, error)
}

func newNames(t target.Target, cn func(uint64) (string, error)) *names {
	return &names{t: t, strs: map[uint64]string{}, classes: map[uint64]string{}, className: cn}
}

const maxName = 4096

// cString reads the NUL-terminated string at addr.
func (n *names) cString(addr uint64) (string, error) {
	if s, ok := n.strs[addr]; ok {
		return s, nil
	}
	if addr == 0 {
		return "", nil
	}
	var out []byte
	buf := make([]byte, 256)
	for len(out) < maxName {
		// Never read across a page boundary in one go: the next page
		// may be unmapped.
		chunk := buf
		if room := 4096 - int((addr+uint64(len(out)))%4096); room < len(chunk) {
			chunk = buf[:room]
		}
		if err := n.t.ReadAt(chunk, addr+uint64(len(out))); err != nil {
			return "", fmt.Errorf("read string at 0x%x: %w", addr, err)
		}
		for i, c := range chunk {
			if c == 0 {
				out = append(out, chunk[:i]...)
				s := string(out)
				n.strs[addr] = s
				return s, nil
			}
		}
		out = append(out, chunk...)
	}
	s := string(out)
	n.strs[addr] = s
	return s, nil
}

// class returns a klass VALUE's name.
func (n *names) class(klass uint64) string {
	if s, ok := n.classes[klass]; ok {
		return s
	}
	s := ""
	if klass == 0 {
		s = "(hidden)"
	} else if n.className != nil {
		if name, err := n.className(klass); err == nil && name != "" {
			s = name
		}
	}
	if s == "" {
		s = fmt.Sprintf("(class 0x%x)", klass)
	}
	n.classes[klass] = s
	return s
}

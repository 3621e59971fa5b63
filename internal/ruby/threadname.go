package ruby

import (
	"path/filepath"
	"regexp"
	"strconv"

	"github.com/rbscope/rbscope/internal/stack"
)

// startName is what startNames keeps of a thread: its tid (a thread
// struct reused by another thread has another), the kernel's name it was
// decided for, and the name of its start.
type startName struct {
	tid     int
	comm    string
	name    string // "" when comm is not Ruby's start name
	decided bool   // else the start could not be read: tried again
	tries   int
}

// maxStartTries bounds the reads of a thread's start that fail.
const maxStartTries = 3

// maxStartNames bounds startNames.
const maxStartNames = 4096

// startLike matches a kernel thread name that may be Ruby's name of an
// unnamed thread, "FILE:LINE" (thread_pthread.c's native_set_thread_name),
// whole or cut to 14 bytes and "*".
var startLike = regexp.MustCompile(`^[^/]*:[0-9]+$|^[^/]{14}\*$`)

// nameThread names thread th (at addr), which has no Ruby name, from comm,
// the kernel's name of its native thread. Ruby names the native thread of
// an unnamed thread after the block it starts with, "FILE:LINE" (FILE the
// base name, LINE the block's first line), which the kernel cuts to 15
// bytes (Ruby marks the cut with "*"): when comm is that name, whole or
// cut, the thread is named with the whole of it, read from the thread's
// outermost frame (once per thread). Else it keeps the kernel's name (a
// C extension's pthread_setname_np, the process's name for the main
// thread), which may be cut too (stack.Thread.NameMayBeCut).
func (p *walker) nameThread(th *stack.Thread, addr uint64, comm string) {
	if comm == "" {
		return
	}
	th.Name, th.NameSource = comm, stack.NameKernel
	// Decided once per thread (and name): a tick costs a map lookup.
	e, ok := p.startNames[addr]
	if fresh := !ok || e.tid != th.TID || e.comm != comm; fresh || !e.decided {
		if fresh {
			e = startName{tid: th.TID, comm: comm, decided: !startLike.MatchString(comm)}
		}
		if !e.decided {
			// The outermost frames seldom change, but a read can
			// still race with the running thread: a few tries.
			name, ok := p.threadStart(addr)
			e.tries++
			e.decided = ok || e.tries >= maxStartTries
			if ok && cutLikeRuby(name) == comm {
				e.name = name
			}
		}
		if p.startNames == nil || len(p.startNames) >= maxStartNames {
			p.startNames = map[uint64]startName{}
		}
		p.startNames[addr] = e
	}
	if e.name != "" {
		th.Name, th.NameSource = e.name, stack.NameStart
	}
}

// cutLikeRuby is name as Ruby passes it to the kernel: at most 15 bytes,
// a longer name cut to 14 and "*".
func cutLikeRuby(name string) string {
	if len(name) > stack.KernelNameMax {
		return name[:stack.KernelNameMax-1] + "*"
	}
	return name
}

// startFrames is how many control frames, from the outermost, are searched
// for a thread's first Ruby frame (below it lies the dummy frame a thread
// starts with).
const startFrames = 4

// threadStart returns "FILE:LINE" of the thread at addr: the base name of
// the path and the first line of its outermost Ruby frame's iseq, the
// block (or method) the thread was started with, as Ruby's own name for
// the native thread of an unnamed thread (rb_proc_location of the block).
func (p *walker) threadStart(addr uint64) (string, bool) {
	o := &p.rt.o
	tb, err := p.r.readOwned(addr, int(o.thSize))
	if err != nil {
		return "", false
	}
	var stackStart, stackSize uint64
	if o.thEC.ok {
		ec := o.thEC.u64(tb)
		if !isHeapPtr(ec) {
			return "", false
		}
		eb, err := p.r.read(ec, p.ecHeadSize())
		if err != nil {
			return "", false
		}
		stackStart, stackSize = o.ecVMStack.u64(eb), o.ecVMStackSize.u64(eb)
	} else {
		stackStart, stackSize = o.thStack.u64(tb), o.thStackSize.u64(tb)
	}
	end := stackStart + stackSize*8
	n := min(uint64(startFrames), stackSize*8/o.cfpSize)
	if stackStart == 0 || n == 0 {
		return "", false
	}
	buf, err := p.r.readOwned(end-n*o.cfpSize, int(n*o.cfpSize))
	if err != nil {
		return "", false
	}
	for i := int(n) - 1; i >= 0; i-- {
		iseq := o.cfpIseq.u64(buf[uint64(i)*o.cfpSize:])
		if !isHeapPtr(iseq) {
			continue
		}
		info, err := p.n.iseqInfo(iseq, nil)
		if err != nil || info == nil || info.path == "" {
			continue
		}
		return filepath.Base(info.path) + ":" + strconv.Itoa(info.firstLine), true
	}
	return "", false
}

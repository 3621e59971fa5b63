// Package stack holds the data that flows from the Ruby walker to the
// sampler, the raw recording and the outputs: frames, thread stacks and
// samples.
package stack

import (
	"fmt"
	"strconv"
	"sync/atomic"
	"time"
)

// Kind is what a frame is: a Ruby frame, a C function, or one of the
// pseudo-frames. Its value is the string written to JSON and to raw
// recordings ("ruby", "cfunc", ...); "" is read as KindRuby (see
// Frame.Func).
type Kind string

// Frame kinds.
const (
	KindRuby  Kind = "ruby"  // an iseq frame (method, block, <main>, ...)
	KindCFunc Kind = "cfunc" // a C-function frame (Array#each)
	KindGC    Kind = "gc"    // the pseudo-frames "(garbage collection)", "(marking)", "(sweeping)"
	KindGVL   Kind = "gvl"   // the pseudo-frame "(waiting for GVL)"
	KindTorn  Kind = "torn"  // the pseudo-frame "(stack changed while read)"
)

// Pseudo-frame names (stackprof's convention for GC).
const (
	FrameGC         = "(garbage collection)"
	FrameMarking    = "(marking)"
	FrameSweeping   = "(sweeping)"
	FrameCompacting = "(compacting)"
	FrameGVLWait    = "(waiting for GVL)"
	// FrameTorn stands, nonblocking, for the inner frames of a stack
	// that kept changing while it was read; the frames under it held
	// still.
	FrameTorn = "(stack changed while read)"
)

// Activity is why a thread is where it is at one moment. Its value is the
// string JSON carries ("running", "gvl_wait", ...), as in snapshot's
// output and a raw recording's trailer; "" in samples of recordings that
// predate it.
type Activity string

// Activities: why a thread is where it is at one moment.
const (
	// ActivityRunning: the thread holds the GVL, executing Ruby or C.
	ActivityRunning Activity = "running"
	// ActivityGVLWait: runnable, waiting for the GVL.
	ActivityGVLWait Activity = "gvl_wait"
	// ActivityBlocked: the GVL released (IO, sleep, Mutex, Queue,
	// ConditionVariable, a C extension's blocking region).
	ActivityBlocked Activity = "blocked"
	// ActivityGC: the thread is running the garbage collector.
	ActivityGC Activity = "gc"
	// ActivityUnknown: neither Ruby's state nor the kernel's could tell.
	ActivityUnknown Activity = "unknown"
)

// Activities lists the activities in display order.
var Activities = []Activity{ActivityRunning, ActivityGVLWait, ActivityBlocked, ActivityGC, ActivityUnknown}

// IsPseudo reports whether f is a pseudo-frame (GC, GVL wait, or a stack
// that changed while read) rather than a Ruby or C frame.
func (f Frame) IsPseudo() bool { return f.Kind == KindGC || f.Kind == KindGVL || f.Kind == KindTorn }

// DropGC removes the sample's GC pseudo-frames (--no-gc); a stack that
// had some is another stack, whose ID is not known.
func (s *Sample) DropGC() {
	i := 0
	for i < len(s.Frames) && s.Frames[i].Kind == KindGC {
		i++
	}
	if i > 0 {
		s.Frames, s.Stack = s.Frames[i:], 0
	}
}

// ID is a stack's identity, given by whoever made its frames (the Ruby
// walker, a recording's reader) and carried by the thread and the sample
// through the sampler, the recording writer and the outputs: two samples
// with the same nonzero ID have the same frames, so what one derived from
// a stack (its frame ids, rows, tree path) serves the other without
// comparing frames. The frames of a nonzero ID are shared and never
// modified: a holder may keep them without a copy. The same frames may
// carry different IDs (made apart); 0 means not known, and frames
// derived from a stack (a sub-slice, a pseudo-frame dropped) take 0 or an
// ID from a Derived.
type ID uint64

var lastID atomic.Uint64

// NewID returns an ID no other stack of this process has.
func NewID() ID { return ID(lastID.Add(1)) }

// Same reports whether a and b are known to be the same stack: both
// carry the same nonzero ID.
func Same(a, b ID) bool { return a != 0 && a == b }

// Derived gives the stacks one derivation makes from others (the same
// frames cut the same way, say without their innermost one) IDs of their
// own: the same for every stack derived from one ID, since that ID's
// frames never change. Its zero value is ready; it is not for concurrent
// use.
type Derived struct{ ids map[ID]ID }

// maxDerived bounds a Derived's memory: past it, its IDs are made anew.
const maxDerived = 1 << 14

// Of returns the ID of the stack derived from the stack of ID parent (0
// when parent is 0: not known).
func (d *Derived) Of(parent ID) ID {
	if parent == 0 {
		return 0
	}
	if id, ok := d.ids[parent]; ok {
		return id
	}
	if d.ids == nil || len(d.ids) >= maxDerived {
		d.ids = make(map[ID]ID)
	}
	id := NewID()
	d.ids[parent] = id
	return id
}

// Mode selects which samples a recording keeps.
type Mode string

// Modes.
const (
	// ModeWall keeps every sample (wall-clock time).
	ModeWall Mode = "wall"
	// ModeCPU keeps the samples of threads on a CPU running Ruby or C
	// code or GC (see Keeps).
	ModeCPU Mode = "cpu"
	// ModeGVL keeps the samples of the thread that holds the GVL.
	ModeGVL Mode = "gvl"
)

// ParseMode parses "wall", "cpu" or "gvl" ("" is wall).
func ParseMode(s string) (Mode, error) {
	switch Mode(s) {
	case "", ModeWall:
		return ModeWall, nil
	case ModeCPU, ModeGVL:
		return Mode(s), nil
	}
	return "", fmt.Errorf("unknown mode %q: want wall, cpu or gvl", s)
}

// Keeps reports whether a recording in mode m keeps sample s. Mode cpu
// keeps a thread on a CPU (OnCPU) that holds the GVL (running), is in GC,
// or released the GVL (blocked: a C function's blocking region that runs
// on a CPU, or a thread whose activity is unknown); a thread waiting for
// the GVL is not doing its work, whatever the kernel says.
func (m Mode) Keeps(s *Sample) bool {
	switch m {
	case ModeCPU:
		return s.OnCPU && s.Activity != ActivityGVLWait
	case ModeGVL:
		return s.GVL
	}
	return true
}

// Frame is one stack frame.
type Frame struct {
	Name string `json:"name"` // "Outer::Inner#level3", "block in Foo#bar", "Array#each"
	Path string `json:"path"` // iseq path; a C or internal frame takes its Ruby caller's
	Line int    `json:"line"` // line being executed; 0 when unknown
	Kind Kind   `json:"kind"` // KindRuby, KindCFunc, KindGC, KindGVL or KindTorn
	// InternalPath and InternalLine are where a Ruby frame of a method
	// defined inside Ruby itself ("<internal:kernel>", as Kernel#loop on
	// 3.3) is executing. Such a frame is shown as Ruby 3.4's backtraces
	// show it, like a C frame: Path and Line are its Ruby caller's.
	// Empty for every other frame.
	InternalPath string `json:"internal_path,omitempty"`
	InternalLine int    `json:"internal_line,omitempty"`
}

// InternalPrefix starts the path of the methods Ruby defines in Ruby
// inside itself (kernel.rb, numeric.rb, array.rb, ...).
const InternalPrefix = "<internal:"

// AtCaller reports whether the frame shows its Ruby caller's path and
// line rather than its own: a C frame, or a frame of a method defined in
// <internal:...>.
func (f *Frame) AtCaller() bool { return f.Kind == KindCFunc || f.InternalPath != "" }

// Func is a function's identity: a Ruby frame's function is its name and
// path; a C, internal (see Frame.InternalPath) or GC frame's function is
// its name alone, because its path is its caller's (Array#each called
// from two files is one function).
type Func struct {
	Name, Path string
}

// Func returns the function the frame runs in.
func (f *Frame) Func() Func {
	if (f.Kind == KindRuby || f.Kind == "") && f.InternalPath == "" {
		return Func{f.Name, f.Path}
	}
	return Func{Name: f.Name}
}

// Where a thread's name comes from (Thread.NameSource).
const (
	// NameRuby: Thread#name, whole.
	NameRuby = "ruby"
	// NameStart: a thread without a Ruby name is named as Ruby names its
	// native thread, "FILE:LINE" of the block it started with (FILE the
	// base name), whole (the kernel keeps 15 bytes of it).
	NameStart = "start"
	// NameKernel: the kernel's name of the native thread (/proc comm),
	// which keeps 15 bytes of a longer name.
	NameKernel = "kernel"
)

// KernelNameMax is how many bytes of a thread's name the kernel keeps.
const KernelNameMax = 15

// Thread is one Ruby thread's stack at one moment.
type Thread struct {
	TID int `json:"tid"` // Linux thread id, 0 when unknown
	// ThreadID is the Ruby thread's identity for its whole life (the
	// address of its rb_thread_t), 0 when unknown. Under M:N threads
	// (RUBY_MN_THREADS=1) a Ruby thread moves between native threads and
	// may have none: its TID changes or is 0, its ThreadID stays.
	ThreadID uint64 `json:"thread_id,omitempty"`
	Name     string `json:"name"` // see NameSource
	// NameSource says where Name comes from: NameRuby, NameStart or
	// NameKernel ("" when the thread has no name).
	NameSource string `json:"name_source,omitempty"`
	Main       bool   `json:"main"` // the process's main thread
	GVL        bool   `json:"gvl"`  // it owns the GVL (read from the lock itself)
	// State is the thread's status in Thread#status's words: run,
	// sleep, aborting or dead (unknown when it cannot be read).
	State string `json:"state"`
	// KernelState is the kernel's state of the native thread ("R", "S",
	// "D", ... as in /proc/PID/task/TID/stat), where it was read.
	KernelState string `json:"kernel_state,omitempty"`
	// Activity is why the thread is where it is: ActivityRunning,
	// ActivityGVLWait, ActivityBlocked, ActivityGC or ActivityUnknown.
	Activity Activity `json:"activity"`
	Frames   []Frame  `json:"frames"`
	// Stack is Frames' identity (see ID); 0 when not known.
	Stack ID `json:"-"`
	// Error, when set, says why the stack stops early (frames past it could
	// not be read, as in a core file that lacks part of the memory).
	Error string `json:"error,omitempty"`
}

// NameMayBeCut reports whether the thread's name is the kernel's and as
// long as the kernel keeps: a longer name was cut to it.
func (t *Thread) NameMayBeCut() bool {
	return t.NameSource == NameKernel && len(t.Name) == KernelNameMax
}

// DisplayName is the thread's name for people: a kernel name that may
// have been cut ends with "…", never passing for the whole name.
func (t *Thread) DisplayName() string {
	if t.NameMayBeCut() {
		return t.Name + "…"
	}
	return t.Name
}

// Sample is one thread's stack taken by the sampler.
type Sample struct {
	Time       time.Time
	Pid        int
	TID        int    // the native thread it ran on then, 0 when none or unknown
	ThreadID   uint64 // see Thread.ThreadID; 0 in recordings that predate it
	ThreadName string
	// OnCPU: the thread was on a CPU. In Mode cpu, at the tick's deadline
	// by the kernel's context-switch records; otherwise its kernel state
	// was R, which includes runnable threads waiting for a CPU.
	OnCPU    bool
	Activity Activity // ActivityRunning, ...; "" in recordings that predate it
	GVL      bool     // the thread owned the GVL
	Frames   []Frame  // innermost first
	Stack    ID       // Frames' identity (see ID); 0 when not known
}

// ThreadKey identifies a Ruby thread among samples: its process and its
// ThreadID, or its TID for samples without a ThreadID (recordings that
// predate it). Outputs group samples by thread with it, so that a Ruby
// thread that moves between native threads stays one.
type ThreadKey struct {
	Pid int
	ID  uint64 // Sample.ThreadID
	TID int    // Sample.TID when ID is 0, else 0
}

// Key returns the key of s's thread.
func (s *Sample) Key() ThreadKey {
	if s.ThreadID != 0 {
		return ThreadKey{Pid: s.Pid, ID: s.ThreadID}
	}
	return ThreadKey{Pid: s.Pid, TID: s.TID}
}

// NoTID is shown for a thread's tid when it has had no native thread (a
// Ruby thread under M:N threads waiting for one).
const NoTID = "no tid"

// TIDText is how outputs show a tid: the number, or NoTID for 0.
func TIDText(tid int) string {
	if tid == 0 {
		return NoTID
	}
	return strconv.Itoa(tid)
}

// Package stack holds the data that flows from the Ruby walker to the
// sampler, the raw recording and the outputs: frames, thread stacks and
// samples.
package stack

import "time"

// Frame kinds.
const (
	KindRuby  = "ruby"  // an iseq frame (method, block, <main>, ...)
	KindCFunc = "cfunc" // a C-function frame (Array#each)
	KindGC    = "gc"    // the synthetic "(garbage collection)" frame
)

// Frame is one stack frame.
type Frame struct {
	Name string `json:"name"` // "Outer::Inner#level3", "block in Foo#bar", "Array#each"
	Path string `json:"path"` // iseq path; a C frame takes its Ruby caller's
	Line int    `json:"line"` // line being executed; 0 when unknown
	Kind string `json:"kind"` // KindRuby, KindCFunc or KindGC
}

// Func is a function's identity: a Ruby frame's function is its name and
// path; a C or GC frame's function is its name alone, because its path is
// its caller's (Array#each called from two files is one function).
type Func struct {
	Name, Path string
}

// Func returns the function the frame runs in.
func (f *Frame) Func() Func {
	if f.Kind == KindRuby || f.Kind == "" {
		return Func{f.Name, f.Path}
	}
	return Func{Name: f.Name}
}

// Thread is one Ruby thread's stack at one moment.
type Thread struct {
	TID    int     `json:"tid"`   // Linux thread id, 0 when unknown
	Name   string  `json:"name"`  // Ruby thread name, else the native name
	Main   bool    `json:"main"`  // the process's main thread
	GVL    bool    `json:"gvl"`   // its execution context is the running one
	State  string  `json:"state"` // Ruby status: running, stopped, killed, ...
	Frames []Frame `json:"frames"`
	// Error, when set, says why the stack stops early (frames past it could
	// not be read, as in a core file that lacks part of the memory).
	Error string `json:"error,omitempty"`
}

// Sample is one thread's stack taken by the sampler.
type Sample struct {
	Time       time.Time
	Pid        int
	TID        int
	ThreadName string
	OnCPU      bool    // the thread was running on a CPU (kernel state R)
	Frames     []Frame // innermost first
}

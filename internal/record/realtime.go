package record

import (
	"fmt"

	"github.com/rbscope/rbscope/internal/rtprio"
)

// Realtime says whether sampling runs at real-time priority (SCHED_FIFO,
// see rtprio): RealtimeOff (the default) never, RealtimeOn always (refused
// where it may not), RealtimeAuto where rbscope may and the rate is at most
// AutoRealtimeMaxRate.
//
// Why it matters: on a kernel that preempts ordinary threads lazily (Linux
// 6.13+ with preempt=lazy or none), a sampler woken on a CPU busy with the
// target waits until the target's next return from a system call, or the
// scheduler's tick. On a machine busier than its cores the samples then
// land on the target's system calls far more often than its time there:
// measured on this project's 2-core VM, a real Rails app under load showed
// Process.clock_gettime (ActiveSupport's CPU clock, a system call around
// every instrumented event) in 5-19 % of the samples against stackprof's
// 0.1-0.8 %, and a GC loop 4.5-6.5 points too much GC (Ruby's GC clock is
// a system call at every marking and sweeping step); at real-time priority
// every top-10 function was within 1.8 points. A real-time sampler
// preempts at once, wherever the target is.
//
// Why not by default: a thread of rbscope's that spins (a bug, or the Go
// runtime's own spinning) at real-time priority takes its CPU from every
// ordinary process, the target included. One recording in a loaded CI run
// of this project's suite, with auto on, stayed at 94 % of a CPU for
// minutes after its --duration, unexplained: until that is understood,
// real-time priority is the user's choice.
type Realtime int

// The Realtime choices.
const (
	RealtimeOff Realtime = iota
	RealtimeOn
	RealtimeAuto
)

// AutoRealtimeMaxRate is the highest rate at which RealtimeAuto raises
// the priority: above it a sampler ahead of every ordinary thread takes a
// real share of a CPU (see the README's --realtime figures), which the
// user asks for with --realtime.
const AutoRealtimeMaxRate = 1000

// String is the flag's spelling.
func (r Realtime) String() string {
	switch r {
	case RealtimeOn:
		return "true"
	case RealtimeAuto:
		return "auto"
	}
	return "false"
}

// Set parses the flag: true/on, false/off, auto.
func (r *Realtime) Set(s string) error {
	switch s {
	case "auto":
		*r = RealtimeAuto
	case "true", "on", "1":
		*r = RealtimeOn
	case "false", "off", "0", "":
		*r = RealtimeOff
	default:
		return fmt.Errorf("%q: give true, false or auto", s)
	}
	return nil
}

// Type names the flag's value in --help.
func (r *Realtime) Type() string { return "true|false|auto" }

// resolveRealtime says whether t samples at real-time priority: for
// RealtimeOn it fails, naming what refused, where the priority cannot be
// had; RealtimeAuto takes it where it can, at rates up to
// AutoRealtimeMaxRate; RealtimeOff never.
func (t Target) resolveRealtime() (bool, error) {
	switch t.Realtime {
	case RealtimeOn:
		if err := rtprio.Check(); err != nil {
			return false, err
		}
		return true, nil
	case RealtimeOff:
		return false, nil
	}
	if t.Rate > AutoRealtimeMaxRate {
		return false, nil
	}
	return rtprio.Check() == nil, nil
}

// CheckRealtime refuses, up front, a --realtime that cannot be had
// (before a terminal is taken over or a process opened).
func (t Target) CheckRealtime() error {
	_, err := t.resolveRealtime()
	return err
}

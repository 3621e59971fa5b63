package record

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/rbscope/rbscope/internal/output"
	"github.com/rbscope/rbscope/internal/procfs"
	"github.com/rbscope/rbscope/internal/recording"
	"github.com/rbscope/rbscope/internal/sampler"
	"github.com/rbscope/rbscope/internal/stack"
)

// finish closes the raw recording, prints the summary and renders the
// profile.
func (r *rec) finish(st sampler.Stats) error {
	if r.child != nil && st.Exited {
		// The sampler saw it exit (a zombie): the watcher is about to
		// notice too.
		select {
		case <-r.child.Done():
		case <-time.After(2 * time.Second):
		}
	}
	if r.child.exited() {
		r.child.reap()
	}
	rst := recording.Stats{Late: int64(st.Late + st.Missed), End: st.End, Errors: map[string]int64{}}
	for k, n := range st.Errors {
		if n > 0 {
			rst.Errors[sampler.ErrorKind(k).String()] = int64(n)
		}
	}
	for _, sp := range st.Threads {
		if len(sp.Unread) > 0 {
			rst.Unread = append(rst.Unread, recording.UnreadThread{Pid: sp.Pid, TID: sp.TID, Name: sp.Name, ByActivity: sp.Unread})
		}
	}
	rst.Torn = TornThreads(st)
	if err := r.raw.Close(rst); err != nil && r.rawErr == nil {
		r.rawErr = err
	}
	r.con.clear()
	r.warnCPU(st)
	r.summarize(st)
	if r.rawErr != nil {
		return fmt.Errorf("write raw recording %s: %w", r.cfg.Raw, r.rawErr)
	}
	r.con.say("raw recording: %s", r.cfg.Raw)
	if st.Samples == 0 {
		return fmt.Errorf("no samples were taken (errors: %s); nothing to render", st.ErrorSummary())
	}
	return r.render(st)
}

// summarize says why the recording ended and what it took.
func (r *rec) summarize(st sampler.Stats) {
	cause := context.Cause(r.ctx)
	exited := st.Exited || errors.Is(cause, errChildExited)
	switch {
	case exited && r.cfg.Launch():
		r.con.say("%s exited%s; writing what was sampled", r.cfg.Command[0], r.child.exitNote())
	case exited:
		r.con.say("process %d exited; writing what was sampled", r.pid)
	case errors.Is(cause, context.Canceled) || cause == nil:
	case r.rawErr == nil:
		r.con.say("%v; writing what was sampled", cause)
	}
	r.con.say("%d samples of %d threads in %.1fs (%d ticks, %d late, %d missed); errors: %s",
		st.Samples, len(st.Threads), st.End.Sub(st.Start).Seconds(), st.Ticks, st.Late, st.Missed, st.ErrorSummary())
	if torn := TornThreads(st); len(torn) > 0 {
		r.con.say("stacks that changed while read (kept under a (stack changed while read) frame): %s", TornSummary(torn))
	}
	if cpu, ok := sampler.SelfCPU(); ok && st.End.Sub(st.Start) >= 100*time.Millisecond {
		// The whole run (opening the target included), then sampling
		// alone: what a long recording costs.
		wall := st.End.Sub(st.Start).Seconds()
		perTick := ""
		if st.Ticks > 0 {
			perTick = fmt.Sprintf(", %.0f µs per tick", float64(st.CPU.Microseconds())/float64(st.Ticks))
		}
		r.con.say("own CPU use: %.3fs (%.1f%% of one core); while sampling %.2f%% of one core%s",
			cpu.Seconds(), 100*cpu.Seconds()/wall, 100*st.CPU.Seconds()/wall, perTick)
	}
	r.busyHint()
	if st.ErrorCount() > 0 && st.LastError != nil && st.Errors[sampler.KindOther]+st.Errors[sampler.KindPermission] > 0 {
		r.con.say("last error: %v", st.LastError)
	}
	if r.cfg.Subprocesses {
		if sk := r.tree.Skipped(); len(sk) > 0 {
			r.con.say("%d non-Ruby subprocesses skipped", len(sk))
		}
	}
}

// render reads the raw recording back and writes the profile. A torn
// block (a full disk, say) keeps what was recorded before it.
func (r *rec) render(st sampler.Stats) error {
	rd, err := recording.Open(r.cfg.Raw)
	if err != nil {
		return fmt.Errorf("read back raw recording: %w", err)
	}
	defer rd.Close()
	o := output.Options{RateHz: r.cfg.Rate, Start: st.Start, Threads: r.cfg.Threads}
	// The trailer just written holds the unread samples, as for report.
	mode, _ := r.cfg.SampleMode() // checked when the recording began
	o.Unread = UnreadOptions(rd, mode)
	// Sampling is over: a stop signal now ends the output (a wait for a
	// FIFO's reader), and rbscope with it.
	octx, ocancel := context.WithCancelCause(context.Background())
	defer ocancel(nil)
	defer r.sig.duringOutput(ocancel)()
	wo := output.WriteOptions{Context: octx, Say: func(msg string) { r.con.say("%s", msg) }}
	n, f, err := output.RenderFile(r.cfg.Format, o, rd.Samples(), r.cfg.Output, wo)
	r.rendered = err == nil
	if derr := rd.Damage(); derr != nil {
		r.con.say("warning: raw recording is damaged after %d samples: %v", n, derr)
	}
	if err != nil {
		return fmt.Errorf("render %s: %w (the samples are in the raw recording: rbscope report --input %s -o FILE)",
			r.cfg.Format, err, r.cfg.Raw)
	}
	if !output.StdoutPath(r.cfg.Output) {
		if f.Replaced {
			// Under sudo, the profile belongs to the user who asked
			// for it (never a device or someone else's link target
			// written in place).
			chownToSudoUser(f.Path)
		}
		r.con.say("wrote %s (%d samples) to %s", r.cfg.Format, n, r.cfg.Output)
	}
	return nil
}

// UnreadOptions returns a function giving a recording's unread samples
// (in its trailer, known once its samples are read) for the outputs
// (output.Options.Unread), those mode keeps.
func UnreadOptions(rd *recording.Reader, mode stack.Mode) func() []output.UnreadThread {
	return func() []output.UnreadThread {
		st, ok := rd.Stats()
		if !ok {
			return nil
		}
		var out []output.UnreadThread
		for _, u := range st.Unread {
			if by := unreadKept(u.ByActivity, mode); len(by) > 0 {
				out = append(out, output.UnreadThread{Pid: u.Pid, TID: u.TID, Name: u.Name, ByActivity: by})
			}
		}
		return out
	}
}

// unreadKept returns the activities of by that mode keeps (Mode.Keeps of
// a sample in that activity: the GVL holder is running or in GC; an
// unread sample's CPU state was not read, and a holder counts as on a
// CPU).
func unreadKept(by map[stack.Activity]int, mode stack.Mode) map[stack.Activity]int {
	out := map[stack.Activity]int{}
	for act, n := range by {
		holder := act == stack.ActivityRunning || act == stack.ActivityGC
		s := stack.Sample{Activity: act, GVL: holder, OnCPU: holder}
		if n > 0 && mode.Keeps(&s) {
			out[act] = n
		}
	}
	return out
}

// busyHint says, when the machine had more tasks wanting a CPU than it has
// CPUs while rbscope sampled at ordinary priority, that the samples lean
// towards the target's system calls, and what avoids it (see Realtime).
func (r *rec) busyHint() {
	if r.realtime {
		return
	}
	load, err := procfs.LoadAvg()
	if err != nil || load < float64(runtime.NumCPU()) {
		return
	}
	r.con.say("the machine was busy (load average %.1f on %d CPUs): an ordinary sampler then waits for a CPU, "+
		"and its samples lean towards the target's system calls; --realtime avoids that", load, runtime.NumCPU())
}

// TornThreads lists the threads with samples whose stack changed while
// read, the one that held the GVL most first (then by share torn).
func TornThreads(st sampler.Stats) []recording.TornThread {
	var out []recording.TornThread
	for _, sp := range st.Threads {
		if sp.Torn == 0 {
			continue
		}
		n := sp.Samples
		for _, u := range sp.Unread {
			n += u
		}
		out = append(out, recording.TornThread{Pid: sp.Pid, TID: sp.TID, Name: sp.Name, Torn: sp.Torn, Samples: n, GVL: sp.GVL})
	}
	slices.SortFunc(out, func(a, b recording.TornThread) int {
		if a.GVL != b.GVL {
			return cmp.Compare(b.GVL, a.GVL)
		}
		return cmp.Compare(float64(b.Torn)/float64(b.Samples), float64(a.Torn)/float64(a.Samples))
	})
	return out
}

// TornSummary says, per thread (at most four, the GVL's main holder
// first), what share of its samples changed while read.
func TornSummary(ts []recording.TornThread) string {
	var parts []string
	for i, t := range ts {
		if i == 4 {
			parts = append(parts, fmt.Sprintf("%d more threads", len(ts)-i))
			break
		}
		name := t.Name
		if name == "" {
			name = fmt.Sprintf("tid %d", t.TID)
		}
		parts = append(parts, fmt.Sprintf("%s %.1f%% of its %d samples (GVL held in %d)", name, 100*float64(t.Torn)/float64(t.Samples), t.Samples, t.GVL))
	}
	return strings.Join(parts, ", ")
}

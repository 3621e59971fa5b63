package sampler

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"time"

	"github.com/rbscope/rbscope/internal/procfs"
	"github.com/rbscope/rbscope/internal/ruby"
	"github.com/rbscope/rbscope/internal/stack"
	"github.com/rbscope/rbscope/internal/target"
)

// Pauser stops a process for the duration of one sample; *target.Pauser
// implements it.
type Pauser interface {
	Pause(pid int) (resume func() error, err error)
}

// ThreadPauser stops only some threads of a process for one sample;
// *target.Pauser implements it.
type ThreadPauser interface {
	PauseThreads(pid int, tids []int) (resume func() error, err error)
}

// RubyOptions tunes a RubySource.
type RubyOptions struct {
	// Pauser, when set, stops the process while its stacks are read
	// (blocking mode: consistent stacks, a short pause of the target per
	// sample). Nil reads the running process (nonblocking mode). When it
	// is also a ThreadPauser, only the threads that run Ruby are stopped.
	Pauser Pauser
	// NoGC leaves out the GC pseudo-frames (the samples keep activity gc).
	NoGC bool
}

// RubySource samples every Ruby thread of one process.
type RubySource struct {
	p      *ruby.Process
	pid    int
	pauser Pauser
	states *taskStates
	noGC   bool
	out    []stack.Sample
	// rubyTIDs are the Ruby threads of the last sample, the ones a
	// ThreadPauser stops (empty: stop every thread).
	rubyTIDs []int
	// sampledTIDs are the threads of the last sample, whose kernel states
	// the next one reads (see refreshRuby).
	sampledTIDs []int
}

// NewRubySource samples the Ruby process p.
func NewRubySource(p *ruby.Process, opts RubyOptions) *RubySource {
	pid := p.Target().Pid()
	// Stacks of a paused target are read once; of a running one, read
	// twice and compared (torn reads are detected, never emitted).
	p.SetStopped(opts.Pauser != nil)
	return &RubySource{p: p, pid: pid, pauser: opts.Pauser, noGC: opts.NoGC, states: newTaskStates(pid)}
}

// Process is the Ruby process sampled.
func (s *RubySource) Process() *ruby.Process { return s.p }

// Sample takes one sample of every Ruby thread. The kernel state of every
// thread (for OnCPU) is read before the process is paused. The returned
// slice is reused by the next call.
func (s *RubySource) Sample(ctx context.Context) ([]stack.Sample, error) {
	if err := s.states.refreshRuby(s.sampledTIDs); err != nil {
		return nil, err
	}
	now := time.Now()
	threads, err := s.snapshot()
	if err != nil {
		return nil, err
	}
	s.out = s.out[:0]
	s.sampledTIDs = s.sampledTIDs[:0]
	var failed *ThreadErrors
	for i := range threads {
		th := &threads[i]
		if th.TID != 0 {
			s.sampledTIDs = append(s.sampledTIDs, th.TID)
		}
		if th.Error != "" {
			// A thread that changed under the walker (created, ending,
			// or read without pausing): its partial stack would distort
			// the profile, so it is counted as an error instead.
			if failed == nil {
				failed = &ThreadErrors{Pid: s.pid}
			}
			failed.Threads = append(failed.Threads, ThreadError{TID: th.TID, Name: th.Name, Err: th.Error})
			continue
		}
		kstate := s.states.state(th.TID)
		ruby.KernelActivity(th, kstate)
		frames := th.Frames
		if s.noGC {
			frames = stack.WithoutGC(frames)
		}
		s.out = append(s.out, stack.Sample{
			Time:       now,
			Pid:        s.pid,
			TID:        th.TID,
			ThreadName: th.Name,
			OnCPU:      kstate == 'R',
			Activity:   th.Activity,
			GVL:        th.GVL,
			Frames:     frames,
		})
	}
	if failed != nil {
		return s.out, failed
	}
	return s.out, nil
}

// ThreadError is one thread whose stack could not be read in a sample.
type ThreadError struct {
	TID  int
	Name string
	Err  string
}

// ThreadErrors is returned with the other threads' samples when some
// threads of a sample could not be read. It counts as an inconsistent
// read (ErrUnmapped).
type ThreadErrors struct {
	Pid     int
	Threads []ThreadError
}

func (e *ThreadErrors) Error() string {
	if len(e.Threads) == 1 {
		t := e.Threads[0]
		return fmt.Sprintf("process %d thread %d (%s): %s", e.Pid, t.TID, t.Name, t.Err)
	}
	return fmt.Sprintf("process %d: %d threads could not be read, first %d: %s", e.Pid, len(e.Threads), e.Threads[0].TID, e.Threads[0].Err)
}

// Inconsistent marks the error as a read that raced with the target.
func (e *ThreadErrors) Inconsistent() bool { return true }

// snapshot reads every thread's stack, pausing the process around it in
// blocking mode: only the threads that ran Ruby in the last sample when
// the pauser can (a Ruby thread found running is then paused with the
// others and read again). The process is resumed however the walk ends (a
// panic included).
func (s *RubySource) snapshot() (threads []stack.Thread, err error) {
	if s.pauser == nil {
		return s.p.Snapshot()
	}
	tp, onlyRuby := s.pauser.(ThreadPauser)
	for attempt := 0; ; attempt++ {
		if onlyRuby && len(s.rubyTIDs) > 0 {
			threads, err = s.pausedSnapshot(func() (func() error, error) { return tp.PauseThreads(s.pid, s.rubyTIDs) })
		} else {
			threads, err = s.pausedSnapshot(func() (func() error, error) { return s.pauser.Pause(s.pid) })
		}
		if err != nil || !onlyRuby {
			return threads, err
		}
		// A Ruby thread that was not stopped (new since the last sample,
		// or of unknown tid) was read running: take the sample again,
		// pausing it too (every thread when a tid is unknown).
		known := s.rubyTIDs
		var tids []int
		missed := false
		for _, th := range threads {
			if th.TID == 0 {
				tids, missed = nil, true
				break
			}
			if !slices.Contains(known, th.TID) {
				missed = true
			}
			tids = append(tids, th.TID)
		}
		s.rubyTIDs = tids
		if len(known) == 0 || !missed || attempt > 0 {
			return threads, nil
		}
	}
}

// pausedSnapshot reads every thread's stack between pause and its resume
// function, which runs however the walk ends (a panic included).
func (s *RubySource) pausedSnapshot(pause func() (func() error, error)) (threads []stack.Thread, err error) {
	resume, err := pause()
	if err != nil {
		return nil, fmt.Errorf("pause: %w", err)
	}
	defer func() {
		if rerr := resume(); rerr != nil && err == nil {
			threads, err = nil, fmt.Errorf("resume: %w", rerr)
		}
	}()
	return s.p.Snapshot()
}

// Close releases the files kept open for reading thread states.
func (s *RubySource) Close() error {
	s.states.close()
	return nil
}

// taskStates reads the kernel state of every thread of a process from
// /proc/PID/task/TID/stat, keeping each file open and re-reading it with
// pread (procfs regenerates the contents at offset 0).
type taskStates struct {
	pid    int
	dir    string
	files  map[int]*os.File
	cur    map[int]byte
	seen   map[int]bool
	buf    []byte
	listed time.Time // when the thread list was last read
	relist bool      // a thread unknown to the list was seen
	tids   []int
}

// relistEvery bounds how long a thread list is reused. Listing
// /proc/PID/task costs as much as reading a few threads' states, so it is
// done only this often, or when the walker reports a thread the list
// does not have (a new thread's first sample then has no state).
const relistEvery = 100 * time.Millisecond

func newTaskStates(pid int) *taskStates {
	return &taskStates{
		pid: pid, dir: "/proc/" + strconv.Itoa(pid) + "/task/",
		files: map[int]*os.File{}, cur: map[int]byte{}, seen: map[int]bool{},
		buf: make([]byte, 1024),
	}
}

func (ts *taskStates) refresh() error {
	if ts.relist || time.Since(ts.listed) >= relistEvery {
		if err := ts.list(); err != nil {
			return err
		}
	}
	alive := 0
	for _, tid := range ts.tids {
		f := ts.files[tid]
		if f == nil {
			continue
		}
		k, err := f.ReadAt(ts.buf, 0)
		if k == 0 && err != nil {
			// The thread exited.
			f.Close()
			delete(ts.files, tid)
			delete(ts.cur, tid)
			continue
		}
		alive++
		ts.cur[tid] = procfs.StateLetter(ts.buf[:k])
	}
	if alive == 0 {
		// Every thread gone: the process exited, or the list is stale.
		if err := ts.list(); err != nil {
			return err
		}
	}
	return nil
}

// note tells the cache which threads the walker saw; an unknown one
// makes the next refresh re-list the threads.
func (ts *taskStates) note(tid int) {
	if tid != 0 && ts.files[tid] == nil {
		ts.relist = true
	}
}

// list re-reads the thread list, opening the stat file of new threads
// and closing those of exited ones.
func (ts *taskStates) list() error {
	ts.listed = time.Now()
	ts.relist = false
	d, err := os.Open(ts.dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return target.ErrProcessExited{Pid: ts.pid}
		}
		return fmt.Errorf("list threads of process %d: %w", ts.pid, err)
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return fmt.Errorf("list threads of process %d: %w", ts.pid, err)
	}
	if len(names) == 0 {
		return target.ErrProcessExited{Pid: ts.pid}
	}
	clear(ts.seen)
	ts.tids = ts.tids[:0]
	for _, n := range names {
		tid, err := strconv.Atoi(n)
		if err != nil {
			continue
		}
		ts.seen[tid] = true
		if ts.files[tid] == nil {
			f, err := os.Open(ts.dir + n + "/stat")
			if err != nil {
				continue // exited meanwhile
			}
			ts.files[tid] = f
		}
		ts.tids = append(ts.tids, tid)
	}
	for tid, f := range ts.files {
		if !ts.seen[tid] {
			f.Close()
			delete(ts.files, tid)
			delete(ts.cur, tid)
		}
	}
	return nil
}

func (ts *taskStates) state(tid int) byte { return ts.cur[tid] }

func (ts *taskStates) close() {
	for tid, f := range ts.files {
		f.Close()
		delete(ts.files, tid)
	}
}

// OpenRuby opens live process pid as a Ruby process, retrying until Ruby
// has initialized (a freshly started or exec'd process is not ready at
// once), the process exits, ctx is done or timeout passes. Inconsistent
// reads (a race with the running process) are retried a few times even
// with a zero timeout. It returns the last error on failure.
func OpenRuby(ctx context.Context, pid int, opts ruby.Options, timeout time.Duration) (*ruby.Process, error) {
	deadline := time.Now().Add(timeout)
	delay := 5 * time.Millisecond
	for attempt := 1; ; attempt++ {
		p, err := openRubyOnce(pid, opts)
		if err == nil {
			return p, nil
		}
		// Even without a timeout, a read that raced with the running
		// process (a thread being created, say) is retried a few times.
		transient := Classify(err) == ErrUnmapped && attempt < 12
		if target.IsExited(err) || (time.Now().After(deadline) && !transient) {
			return nil, err
		}
		var perm target.ErrPermission
		if errors.As(err, &perm) {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w (last error: %w)", ctx.Err(), err)
		case <-time.After(delay):
		}
		delay = min(2*delay, 100*time.Millisecond)
	}
}

func openRubyOnce(pid int, opts ruby.Options) (*ruby.Process, error) {
	t, err := target.OpenLive(pid)
	if err != nil {
		return nil, err
	}
	p, err := ruby.Open(t, opts)
	if err != nil {
		t.Close()
		return nil, err
	}
	// A process that is still starting may have a VM without threads
	// yet: check that a snapshot works.
	if _, err := p.Snapshot(); err != nil {
		t.Close()
		return nil, fmt.Errorf("first snapshot: %w", err)
	}
	return p, nil
}

package ruby

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rbscope/rbscope/internal/target"
)

// Consistency says whether the memory a Process reads can change while
// it is read: it decides whether the walker checks its reads against
// each other and reads again what changed (Running), or trusts them
// (Stopped). It is part of the request (Spec), never guessed from the
// target.
type Consistency int

const (
	// Running: a live process that runs on while it is read. Reads that
	// raced with it are detected and taken again; a caller that pauses
	// every Ruby thread for a snapshot asks for that snapshot Stopped
	// (Process.SnapshotWith).
	Running Consistency = iota + 1
	// Stopped: an image that does not change while it is read: a core
	// file, a copy of a stack taken when it was consistent, or a live
	// process whose Ruby threads the caller paused for one snapshot.
	Stopped
	// HolderStopped: for one snapshot, the caller keeps the thread that
	// holds the GVL stopped, and only it (Req.Holder; see SnapshotWith).
	HolderStopped
)

// Spec names what Open opens and how.
type Spec struct {
	// Pid is the live process to open (read with process_vm_readv)
	// when Target is nil; its Consistency is Running.
	Pid int
	// Target is a process image the caller has open (a core file, a
	// live target, a copy): Open reads it as Consistency says, neither
	// retries nor closes it.
	Target      target.Target
	Consistency Consistency
	// Options are the facts the caller knows and the choices it makes.
	Options
	// Wait is how long a live process (Pid) that is not ready yet (just
	// started or exec'd: its VM has no thread yet, its libruby is not
	// mapped yet) is tried again. Reads that raced with the running
	// process are tried again even when Wait is 0 (see Retry).
	Wait time.Duration
	// Once opens a live process in a single attempt, for a caller that
	// tries again on its own schedule (the agent, at its next scan).
	Once bool
}

// Open finds the Ruby VM in the process or image s names: the one way
// rbscope opens a Ruby, with one retry policy (Retry) and one wording of
// its errors (the process, and what failed in it). A live process (Pid)
// is opened only once a first snapshot of its threads works, and its
// target is closed when Open fails.
func Open(ctx context.Context, s Spec) (*Process, error) {
	if s.Target != nil {
		if s.Consistency != Running && s.Consistency != Stopped {
			return nil, fmt.Errorf("open process %d: the request does not say whether its memory may change while it is read (Spec.Consistency)", s.Target.Pid())
		}
		p, err := openTarget(s.Target, s.Options, s.Consistency)
		if err != nil {
			return nil, openError(s.Target, err)
		}
		return p, nil
	}
	if s.Pid <= 0 {
		return nil, fmt.Errorf("open process %d: not a process id", s.Pid)
	}
	if s.Once {
		return openLive(s.Pid, s.Options)
	}
	var p *Process
	err := Retry(ctx, s.Wait, func() (err error) {
		p, err = openLive(s.Pid, s.Options)
		return err
	})
	return p, err
}

// openLive is one attempt to open live process pid, errors worded.
func openLive(pid int, opts Options) (*Process, error) {
	t, err := target.OpenLive(pid)
	if err != nil {
		return nil, err // it names the process
	}
	p, err := openTarget(t, opts, Running)
	if err == nil {
		// A process that is still starting may have a VM without
		// threads yet: check that a snapshot works.
		if _, serr := p.Snapshot(); serr != nil {
			err = fmt.Errorf("first snapshot: %w", serr)
		}
	}
	if err != nil {
		t.Close()
		return nil, openError(t, err)
	}
	return p, nil
}

// openError words a failure to find Ruby in t: the process and what went
// wrong, as every command says it.
func openError(t target.Target, err error) error {
	var nu target.NotUserProcessError
	switch {
	case errors.As(err, &nu):
		return err
	case errors.Is(err, ErrNotRuby):
		return fmt.Errorf("process %d (%s): %w", t.Pid(), t.Executable(), err)
	}
	return fmt.Errorf("find the Ruby VM in process %d: %w", t.Pid(), err)
}

// retryTries is how many times Retry tries a read that raced with the
// running process.
const retryTries = 12

// Retry calls try until it succeeds, and returns its last error when it
// fails for good: any failure once wait has passed (a process still
// starting fails in many ways until it is ready), except a read that
// raced with the running process (target.ErrUnmapped: a thread being
// created; ErrInconsistent: a stack that changed while it was read),
// which is tried up to retryTries times whatever wait; never again once
// the process is gone or the kernel refused. Tries are 5 ms apart at
// first, doubling up to 100 ms (at most about 0.75 s in all for reads
// that raced), and stop when ctx is done.
func Retry(ctx context.Context, wait time.Duration, try func() error) error {
	deadline := time.Now().Add(wait)
	delay := 5 * time.Millisecond
	for attempt := 1; ; attempt++ {
		err := try()
		if err == nil {
			return nil
		}
		raced := errors.Is(err, target.ErrUnmapped) || errors.Is(err, ErrInconsistent)
		switch {
		case errors.Is(err, target.ErrExited), errors.Is(err, target.ErrDenied):
			return err
		case time.Now().After(deadline) && !(raced && attempt < retryTries):
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last error: %w)", ctx.Err(), err)
		case <-time.After(delay):
		}
		delay = min(2*delay, 100*time.Millisecond)
	}
}

package record

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/rbscope/rbscope/internal/sampler"
	"github.com/rbscope/rbscope/internal/stack"
)

// StopSignals end a recording the way Ctrl-C does: sampling stops, the
// process is resumed and the output is written. SIGHUP is among them: an
// ssh connection that drops must not lose the recording.
var StopSignals = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP}

// signals watches the stop signals and job control for one recording.
type signals struct {
	stop chan os.Signal
	tstp chan os.Signal
	cont chan os.Signal
	gate gate

	mu  sync.Mutex
	got os.Signal // the stop signal that ended the recording
}

func watchSignals() *signals {
	s := &signals{
		stop: make(chan os.Signal, 2),
		tstp: make(chan os.Signal, 1),
		cont: make(chan os.Signal, 1),
	}
	signal.Notify(s.stop, StopSignals...)
	signal.Notify(s.tstp, syscall.SIGTSTP)
	signal.Notify(s.cont, syscall.SIGCONT)
	return s
}

// run handles signals until ctx ends: the first stop signal is passed to
// onStop (once); a second one kills rbscope the default way (the kernel
// then resumes a paused target). SIGTSTP suspends rbscope only once no
// sample is being taken, so the target is never left paused.
func (s *signals) run(ctx context.Context, onStop func(os.Signal)) {
	for {
		select {
		case sig := <-s.stop:
			signal.Stop(s.stop)
			s.mu.Lock()
			s.got = sig
			s.mu.Unlock()
			onStop(sig)
		case <-s.tstp:
			s.suspend(ctx)
		case <-ctx.Done():
			return
		}
	}
}

// suspend stops rbscope like an uncaught SIGTSTP would, but between two
// samples: it takes the gate (waiting for a sample in progress to resume
// the target), stops this process, and when continued lets sampling go
// on.
func (s *signals) suspend(ctx context.Context) {
	s.gate.mu.Lock()
	defer s.gate.mu.Unlock()
	for len(s.cont) > 0 { // a SIGCONT from before is not ours
		<-s.cont
	}
	// Only rbscope: a launched command in the same process group got
	// its own SIGTSTP from the terminal, or none when it was sent to
	// rbscope alone.
	_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
	select {
	case <-s.cont:
	case <-ctx.Done():
	}
}

// outputGrace is how long a stop signal during the output waits for
// rbscope to end by itself before the signal ends it the default way.
const outputGrace = 2 * time.Second

// duringOutput makes every stop signal from now on, the first one
// included, cancel the output (cancel, with the signal as the cause):
// once sampling is over a stop signal ends rbscope, never just the
// recording. Should the output not end within outputGrace (a write the
// kernel does not interrupt), the signal is raised again with its
// default action. It returns the function that stops this.
func (s *signals) duringOutput(cancel context.CancelCauseFunc) (stop func()) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, StopSignals...)
	done := make(chan struct{})
	go func() {
		select {
		case sig := <-ch:
			cancel(fmt.Errorf("interrupted by %v", sig))
			select {
			case <-done:
			case <-time.After(outputGrace):
				signal.Reset(sig)
				if ss, ok := sig.(syscall.Signal); ok {
					_ = syscall.Kill(os.Getpid(), ss)
				}
			}
		case <-done:
		}
	}()
	return func() {
		signal.Stop(ch)
		close(done)
	}
}

// signal returns the stop signal received, nil for none.
func (s *signals) signal() os.Signal {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.got
}

func (s *signals) close() {
	signal.Stop(s.stop)
	signal.Stop(s.tstp)
	signal.Stop(s.cont)
}

// gate lets the sampler take a sample only while rbscope is not being
// suspended: a sample holds it from pause to resume.
type gate struct{ mu sync.Mutex }

// wrap returns src with every sample taken under the gate.
func (g *gate) wrap(src sampler.Source) sampler.Source {
	return sampler.SourceFunc(func(ctx context.Context) ([]stack.Sample, error) {
		g.mu.Lock()
		defer g.mu.Unlock()
		return src.Sample(ctx)
	})
}

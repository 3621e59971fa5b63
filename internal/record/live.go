package record

import (
	"context"

	"github.com/rbscope/rbscope/internal/ruby"
	"github.com/rbscope/rbscope/internal/sampler"
	"github.com/rbscope/rbscope/internal/stack"
	"github.com/rbscope/rbscope/internal/target"
)

// OpenLive opens the running process t.Pid as a Ruby process, for a live
// view (top) that samples it with SampleLive (ruby.Open).
func OpenLive(ctx context.Context, t Target) (*ruby.Process, error) {
	return ruby.Open(ctx, ruby.Spec{Pid: t.Pid, Options: ruby.Options{Version: t.RubyVersion}})
}

// SampleLive samples proc at t.Rate until ctx ends or the process exits,
// pausing it for each sample unless t.Nonblocking, and gives every batch
// to sink. It runs on the calling goroutine, which also does the
// pausing. cfg.Rate and cfg.Realtime are taken from t (t.Realtime
// resolved: see Realtime).
func SampleLive(ctx context.Context, proc *ruby.Process, t Target, cfg sampler.Config, sink func([]stack.Sample)) (sampler.Stats, error) {
	ro := sampler.RubyOptions{WatchCPU: cfg.AsksCPU()}
	if !t.Nonblocking {
		pauser := target.NewThreadPauser()
		defer pauser.Close()
		ro.Pauser = pauser
	}
	src := sampler.NewRubySource(proc, ro)
	defer src.Close()
	rt, err := t.resolveRealtime()
	if err != nil {
		return sampler.Stats{}, err
	}
	cfg.Rate, cfg.Realtime = t.Rate, rt
	return sampler.Run(ctx, src, cfg, sink)
}

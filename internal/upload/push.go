package upload

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// PushProfile sends one finished, gzipped pprof profile covering [from,
// until) to the server in cfg, under cfg's app name and tags, retrying
// transient failures with backoff until ctx ends. It is for profiles made
// elsewhere than an Uploader's samples: rbscope alloc's allocation
// profiles (alloc_objects, alloc_space).
func PushProfile(ctx context.Context, cfg Config, from, until time.Time, data []byte) error {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return fmt.Errorf("upload config: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	u := &Uploader{cfg: cfg, name: seriesName(cfg.AppName, cfg.Tags), ctx: ctx, cancel: cancel}
	m := meta{Name: u.name, From: from.UnixNano(), Until: until.UnixNano(), Rate: cfg.SampleRate}
	var e422 errTransient422
	for attempt := 0; ; attempt++ {
		err := u.push(m, data)
		if err == nil {
			return nil
		}
		var perm errPermanent
		if errors.As(err, &perm) || (errors.As(err, &e422) && attempt >= max422Retries) {
			return fmt.Errorf("push to %s: %w", cfg.URL, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("push to %s: %w (gave up: %v)", cfg.URL, err, ctx.Err())
		case <-time.After(backoff(attempt)):
		}
	}
}

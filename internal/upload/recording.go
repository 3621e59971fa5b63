package upload

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/rbscope/rbscope/internal/stack"
)

// PushRecording pushes a finished recording: it reads samples with next
// until io.EOF, cuts them into intervals by their own timestamps
// (cfg.Replay), pushes them and waits for delivery until ctx is done.
// Unlike a live Uploader it reads only as fast as the server takes the
// profiles, so a recording larger than the queue loses nothing.
// cfg.SampleRate should be the recording's rate. Pyroscope refuses
// profiles older than its -validation.reject-older-than (1h by default);
// those come back as Stats.Rejected.
func PushRecording(ctx context.Context, cfg Config, next func() (stack.Sample, error)) (Stats, error) {
	cfg.Replay = true
	cfg.backpressure = true
	u, err := New(cfg)
	if err != nil {
		return Stats{}, err
	}
	var readErr error
	for n := 1; ; n++ {
		s, err := next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			readErr = fmt.Errorf("read recording: %w", err)
			break
		}
		u.Add(s)
		if n%256 == 0 && !u.waitBacklog(ctx) {
			readErr = fmt.Errorf("push recording: %w after %d samples", ctx.Err(), n)
			break
		}
	}
	closeErr := u.Close(ctx)
	st := u.Stats()
	if err := errors.Join(readErr, closeErr); err != nil {
		return st, err
	}
	if st.Rejected > 0 {
		return st, fmt.Errorf("server refused %d of %d profiles (%d samples)", st.Rejected, st.Pushed+st.Rejected, st.DroppedSamples)
	}
	return st, nil
}

// waitBacklog waits until at most two intervals wait for the encoder
// (which, replaying, itself waits for room in the memory queue); false
// when ctx ended first.
func (u *Uploader) waitBacklog(ctx context.Context) bool {
	for {
		u.mu.Lock()
		n := len(u.cut)
		u.mu.Unlock()
		if n <= 2 {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(5 * time.Millisecond):
		}
	}
}

package upload

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/rbscope/rbscope/internal/stack"
)

// PushRecording pushes a finished recording: it reads samples with next
// until io.EOF, cuts them into intervals by their own timestamps
// (cfg.Replay), pushes them and waits for delivery until ctx is done.
// cfg.SampleRate should be the recording's rate. Pyroscope refuses
// profiles older than its -validation.reject-older-than (1h by default);
// those come back as Stats.Rejected.
func PushRecording(ctx context.Context, cfg Config, next func() (stack.Sample, error)) (Stats, error) {
	cfg.Replay = true
	u, err := New(cfg)
	if err != nil {
		return Stats{}, err
	}
	var readErr error
	for {
		s, err := next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			readErr = fmt.Errorf("read recording: %w", err)
			break
		}
		u.Add(s)
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

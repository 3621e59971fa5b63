package upload

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/pprof/profile"

	"github.com/rbscope/rbscope/internal/stack"
)

// interval is the samples of one pushed profile.
type interval struct {
	start, end time.Time // the wall-clock interval, aligned
	stamp      time.Time // the profile's timestamp: unique per uploader
	samples    []stack.Sample
}

// encodeProfile builds the gzip'd pprof profile of one interval with the
// same writer as `rbscope record --format pprof` (sample types
// samples/count and cpu/nanoseconds, period 1/rate), then relabels it for
// Pyroscope, which makes series of string labels only: pid and thread_name
// (the thread's name, else "tid-N") become string labels, tid is dropped
// (one series per thread id would explode cardinality). n is the number of
// samples in it (samples without frames are not).
func encodeProfile(iv interval, rate int) (data []byte, n int, err error) {
	b, err := NewBuilder(KindCPU, rate, iv.start)
	if err != nil {
		return nil, 0, err
	}
	for _, s := range iv.samples {
		b.Add(s)
	}
	if b.Samples() == 0 {
		return nil, 0, nil
	}
	p, err := b.Profile(iv.end, iv.stamp)
	if err != nil {
		return nil, 0, err
	}
	var buf bytes.Buffer
	if err := p.Write(&buf); err != nil {
		return nil, 0, fmt.Errorf("write pprof: %w", err)
	}
	return buf.Bytes(), b.Samples(), nil
}

// relabel turns the pprof writer's labels (thread, activity; numeric pid,
// tid) into Pyroscope series labels (pid, thread_name, activity).
func relabel(p *profile.Profile) {
	for _, s := range p.Sample {
		var pid, tid int64
		if v := s.NumLabel["pid"]; len(v) > 0 {
			pid = v[0]
		}
		if v := s.NumLabel["tid"]; len(v) > 0 {
			tid = v[0]
		}
		var thread string
		if v := s.Label["thread"]; len(v) > 0 {
			thread = strings.ToValidUTF8(v[0], "?")
		}
		if thread == "" && tid != 0 {
			thread = "tid-" + strconv.FormatInt(tid, 10)
		}
		act := s.Label["activity"]
		s.Label = map[string][]string{"pid": {strconv.FormatInt(pid, 10)}}
		if thread != "" {
			s.Label["thread_name"] = []string{thread}
		}
		if len(act) > 0 && act[0] != "" {
			// running, gvl_wait, blocked, gc: a fleet can chart GVL wait.
			s.Label["activity"] = act[:1]
		}
		s.NumLabel, s.NumUnit = nil, nil
	}
}

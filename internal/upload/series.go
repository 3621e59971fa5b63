package upload

import (
	"bytes"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/pprof/profile"

	"github.com/rbscope/rbscope/internal/output"
	"github.com/rbscope/rbscope/internal/stack"
)

// ProfileKind is what one pushed profile measures.
type ProfileKind int

// Profile kinds. Pyroscope names the series after the pprof sample types:
// cpu/nanoseconds becomes process_cpu, wall/nanoseconds wall.
const (
	// KindCPU counts the samples given as CPU time (sample types
	// samples/count and cpu/nanoseconds): give it only on-CPU samples.
	KindCPU ProfileKind = iota
	// KindWall counts them as wall-clock time (samples/count and
	// wall/nanoseconds): every sample, waiting ones included.
	KindWall
)

func (k ProfileKind) String() string {
	if k == KindWall {
		return "wall"
	}
	return "cpu"
}

// Builder accumulates the samples of one interval into one profile,
// merging equal stacks as they come (memory grows with distinct stacks,
// not with samples). Not safe for concurrent use.
type Builder struct {
	w     output.Writer
	kind  ProfileKind
	start time.Time
	n     int
}

// NewBuilder starts a profile of kind at rate Hz covering an interval
// that starts at start.
func NewBuilder(kind ProfileKind, rate int, start time.Time) (*Builder, error) {
	w, err := output.New("pprof", output.Options{RateHz: float64(rate), Start: start})
	if err != nil {
		return nil, fmt.Errorf("pprof writer: %w", err)
	}
	return &Builder{w: w, kind: kind, start: start}, nil
}

// Add adds one sample; a sample without frames is not added (false).
func (b *Builder) Add(s stack.Sample) bool {
	if len(s.Frames) == 0 {
		return false
	}
	b.w.Add(s)
	b.n++
	return true
}

// Samples is the number of samples added.
func (b *Builder) Samples() int { return b.n }

// Profile builds the profile, its interval ending at until and its
// timestamp stamp (start when zero), relabeled for Pyroscope (labels pid,
// thread_name, activity). Nil when no sample was added.
func (b *Builder) Profile(until, stamp time.Time) (*profile.Profile, error) {
	if b.n == 0 {
		return nil, nil
	}
	var buf bytes.Buffer
	if _, err := b.w.WriteTo(&buf); err != nil {
		return nil, err
	}
	p, err := profile.Parse(&buf)
	if err != nil {
		return nil, fmt.Errorf("reparse pprof: %w", err)
	}
	relabel(p)
	if b.kind == KindWall {
		p.SampleType[1] = &profile.ValueType{Type: "wall", Unit: "nanoseconds"}
		p.PeriodType = &profile.ValueType{Type: "wall", Unit: "nanoseconds"}
	}
	p.TimeNanos = stamp.UnixNano()
	if stamp.IsZero() {
		p.TimeNanos = b.start.UnixNano()
	}
	p.DurationNanos = until.Sub(b.start).Nanoseconds()
	if err := p.CheckValid(); err != nil {
		return nil, fmt.Errorf("build pprof: %w", err)
	}
	return p, nil
}

// AddProfileFor queues a finished profile covering [from, until) under a
// series of its own: service name app and labels (added to the
// uploader's tags, over them where both have a key). It is AddProfile for
// an uploader that pushes many processes' profiles through one queue
// (rbscope agent): the queue, its bound and its counters are shared. app
// and the labels are checked as series names and tags are, except that
// pid may be a label; values are cleaned (see CleanLabelValue) by the
// caller.
func (u *Uploader) AddProfileFor(app string, labels map[string]string, from, until time.Time, p *profile.Profile, n int) error {
	if err := validateAppName(app); err != nil {
		return err
	}
	tags := make(map[string]string, len(u.cfg.Tags)+len(labels))
	for k, v := range u.cfg.Tags {
		tags[k] = v
	}
	for k, v := range labels {
		if k != "pid" {
			if err := validateTag(k, v); err != nil {
				return err
			}
		}
		tags[k] = v
	}
	return u.addProfile(seriesName(app, tags), from, until, p, n)
}

// CleanLabelValue makes s a valid label value: characters a series name
// cannot hold (",{}=") become "_", and "" becomes "unknown".
func CleanLabelValue(s string) string {
	s = strings.Map(func(r rune) rune {
		if strings.ContainsRune(",{}=", r) || r < ' ' {
			return '_'
		}
		return r
	}, s)
	if s == "" {
		return "unknown"
	}
	return s
}

// DefaultAppName names an application after its program: the script of
// "ruby bin/shop.rb" or "ruby3.1 bin/shop.rb" ("shop"), the command of "bundle exec puma" or
// "/usr/bin/puma" ("puma"); "ruby" when there is none.
func DefaultAppName(command []string) string {
	name := ""
	if len(command) > 0 {
		switch base := filepath.Base(command[0]); {
		case strings.HasPrefix(base, "ruby"), base == "bundle", base == "bundler":
			// ruby, ruby3.1 (Debian's), ruby-3.3: the script names it.
			for _, a := range command[1:] {
				if !strings.HasPrefix(a, "-") && a != "exec" {
					name = a
					break
				}
			}
		default:
			name = command[0]
		}
	}
	name = strings.TrimSuffix(filepath.Base(name), ".rb")
	var b strings.Builder
	for _, r := range name {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_', r == '.', r == '-':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	if s := strings.Trim(b.String(), "._-"); s != "" {
		return s
	}
	return "ruby"
}

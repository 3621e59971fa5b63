package record

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/rbscope/rbscope/internal/output"
	"github.com/rbscope/rbscope/internal/sampler"
	"github.com/rbscope/rbscope/internal/stack"
)

// UsageError is an error in how rbscope was called (a bad flag value, a
// missing target): the CLI exits with status 2 for it, 1 for any other.
type UsageError struct{ Err error }

func (e UsageError) Error() string { return e.Err.Error() }
func (e UsageError) Unwrap() error { return e.Err }

// Usagef returns a UsageError with a formatted message.
func Usagef(format string, args ...any) error {
	return UsageError{fmt.Errorf(format, args...)}
}

// IsUsage reports whether err is (or wraps) a UsageError.
func IsUsage(err error) bool {
	var u UsageError
	return errors.As(err, &u)
}

// Target names the process to sample and how: the flags every live
// subcommand shares.
type Target struct {
	Pid          int           // --pid: a running process
	Command      []string      // -- CMD ARGS: a command to launch (record only)
	Rate         float64       // --rate: samples per second
	Nonblocking  bool          // --nonblocking: never pause the process
	Realtime     Realtime      // --realtime: sample at real-time priority (off by default)
	RubyVersion  string        // --ruby-version: assumed when not detected
	Subprocesses bool          // --subprocesses: also sample Ruby descendants
	StartTimeout time.Duration // launch mode: how long Ruby may take to start
}

// Launch reports whether the target is a command to start.
func (t Target) Launch() bool { return len(t.Command) > 0 }

// Validate checks the target; every error is a UsageError.
func (t Target) Validate() error {
	switch {
	case t.Pid != 0 && t.Launch():
		return Usagef("give either --pid or a command after --, not both")
	case t.Pid < 0:
		return Usagef("invalid pid %d", t.Pid)
	case t.Pid == 0 && !t.Launch():
		return Usagef("no process given: --pid PID")
	case !(t.Rate > 0 && t.Rate <= sampler.MaxRate): // NaN too
		return Usagef("--rate %s: give a rate above 0 and at most %d samples per second",
			strconv.FormatFloat(t.Rate, 'f', -1, 64), sampler.MaxRate)
	case t.StartTimeout < 0:
		return Usagef("negative --start-timeout %v", t.StartTimeout)
	}
	return nil
}

// Sink receives every sample while a recording runs, from the sampler's
// goroutine (Add must not block), and is finished once when sampling
// ends, before the profile is rendered.
type Sink interface {
	Add(s stack.Sample)
	Finish() error
}

// Config is one recording.
type Config struct {
	Target
	Duration time.Duration // stop after this long; 0: until stopped
	OnCPU    bool          // --on-cpu: the same as Mode cpu
	Mode     stack.Mode    // which samples to keep: wall (""), cpu, gvl
	NoGC     bool          // leave out the GC pseudo-frames
	Threads  bool          // collapsed: root each stack at its thread
	Format   string        // output format (output.Formats)
	Output   string        // output path; "": rbscope-<time>-<pid>.<ext>
	Raw      string        // raw recording path; "": a new file in the cache directory
	Silent   bool          // no progress or summary on Stderr
	Stderr   io.Writer     // progress and messages
	Version  string        // rbscope's version, for the raw header

	// Sinks, when set, returns the extra sinks of a recording of command
	// (the target's command line): an uploader.
	Sinks func(command []string) ([]Sink, error)
}

// Validate checks the configuration; every error is a UsageError.
func (c Config) Validate() error {
	if c.Pid == 0 && !c.Launch() {
		return Usagef("nothing to record: give --pid PID or a command after -- (rbscope record -- ruby app.rb)")
	}
	if err := c.Target.Validate(); err != nil {
		return err
	}
	if c.Duration < 0 {
		return Usagef("negative --duration %v", c.Duration)
	}
	if _, err := output.New(c.Format, output.Options{}); err != nil {
		return UsageError{err}
	}
	if _, err := c.SampleMode(); err != nil {
		return err
	}
	return nil
}

// SampleMode is Mode, with OnCPU as another name for Mode cpu.
func (c Config) SampleMode() (stack.Mode, error) {
	mode, err := stack.ParseMode(string(c.Mode))
	if err != nil {
		return "", Usagef("--mode: %v", err)
	}
	if c.OnCPU {
		if mode != stack.ModeWall && mode != stack.ModeCPU {
			return "", Usagef("--on-cpu is --mode cpu: it contradicts --mode %s", mode)
		}
		mode = stack.ModeCPU
	}
	return mode, nil
}

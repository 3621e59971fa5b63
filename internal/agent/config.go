package agent

import (
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"time"

	"github.com/rbscope/rbscope/internal/sampler"
)

// Defaults for the zero values of Config.
const (
	DefaultRate         = sampler.DefaultRate
	DefaultInterval     = 10 * time.Second
	DefaultBuffer       = 64 << 20
	DefaultRescan       = 500 * time.Millisecond
	DefaultOpenTimeout  = 5 * time.Second
	DefaultFlushTimeout = 30 * time.Second
	DefaultMetricsAddr  = "127.0.0.1:9465"
)

// Config says what to profile and where to push.
type Config struct {
	// URL is the Pyroscope server's base URL.
	URL string
	// Rate is the sampling rate in Hz, one clock for every target
	// (DefaultRate when 0).
	Rate float64
	// Interval is the length of one pushed profile (DefaultInterval).
	Interval time.Duration
	// Buffer bounds the bytes of profiles waiting to be pushed, for the
	// whole host (DefaultBuffer); the oldest go first when it is full.
	Buffer int64
	// Tags label every profile (--tag k=v).
	Tags map[string]string
	// Include, when set, profiles only processes whose command line
	// (arguments joined by spaces) matches; Exclude leaves out those that
	// match.
	Include, Exclude *regexp.Regexp
	// Users, when not empty, profiles only processes whose real user id
	// is one of these.
	Users []int
	// Cgroup, when set, profiles only processes whose cgroup path (see
	// procfs.CgroupPath) matches.
	Cgroup *regexp.Regexp
	// Alloc also counts every profiled process's allocations, with
	// eBPF uprobes in alloc's default mode (short counting windows scaled
	// by Ruby's own counter), and pushes an allocation profile
	// (alloc_objects, alloc_space) per Interval. Needs root (BPF).
	Alloc bool
	// Realtime runs the clock, the one thread that wakes at each tick and
	// reads every target, at real-time priority (SCHED_FIFO 1; root or
	// CAP_SYS_NICE); uploads and scans stay ordinary. On a host whose CPUs
	// are busy, an ordinary clock woken at a tick waits for the kernel to
	// preempt a target, on a lazily preempting kernel mostly at the
	// target's next system call: the cpu profiles then lean towards the
	// code before system calls (Process.clock_gettime, IO). New refuses it
	// where the priority may not be raised.
	Realtime bool
	// MaxProcesses caps the processes profiled at once (0: no cap).
	MaxProcesses int
	// Rescan is how often /proc is listed (DefaultRescan).
	Rescan time.Duration
	// OpenTimeout is how long a new Ruby process may take to become
	// readable before it is left alone (DefaultOpenTimeout); it gets
	// another chance when it execs.
	OpenTimeout time.Duration
	// FlushTimeout bounds the last pushes when Run ends (DefaultFlushTimeout).
	FlushTimeout time.Duration
	// MetricsAddr is where /metrics is served ("" for nowhere; port 0
	// picks one, see Agent.MetricsAddr).
	MetricsAddr string
	// Logger receives structured logs (default: slog.Default()).
	Logger *slog.Logger
}

func (c Config) withDefaults() (Config, error) {
	if c.URL == "" {
		return c, errors.New("no Pyroscope URL (--upload)")
	}
	if c.Rate == 0 {
		c.Rate = DefaultRate
	}
	if c.Rate < 0 || c.Rate > 1000 {
		return c, fmt.Errorf("rate %g Hz is outside 0..1000", c.Rate)
	}
	if c.Interval == 0 {
		c.Interval = DefaultInterval
	}
	if c.Interval < time.Second {
		return c, fmt.Errorf("interval %v is shorter than a second", c.Interval)
	}
	if c.Buffer == 0 {
		c.Buffer = DefaultBuffer
	}
	if c.Buffer < 0 {
		return c, fmt.Errorf("buffer %d bytes is negative", c.Buffer)
	}
	if c.MaxProcesses < 0 {
		return c, fmt.Errorf("max processes %d is negative", c.MaxProcesses)
	}
	if c.Rescan <= 0 {
		c.Rescan = DefaultRescan
	}
	if c.OpenTimeout <= 0 {
		c.OpenTimeout = DefaultOpenTimeout
	}
	if c.FlushTimeout <= 0 {
		c.FlushTimeout = DefaultFlushTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c, nil
}

package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"os/user"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/rbscope/rbscope/internal/agent"
	"github.com/rbscope/rbscope/internal/upload"
)

type agentFlags struct {
	url, include, exclude, cgroup, metrics, logFormat, logLevel string
	users, tags                                                 []string
	rate                                                        float64
	interval, rescan, flushTimeout                              time.Duration
	buffer                                                      int64
	maxProcs                                                    int
	alloc, realtime                                             bool
}

func init() {
	var o agentFlags
	cmd := &cobra.Command{
		Use:   "agent --upload URL",
		Short: "Profile every Ruby process on this host, all the time, into Pyroscope",
		Long: `Run as one long-lived process per host (a systemd unit, or a DaemonSet
container with hostPID and CAP_SYS_PTRACE): find every Ruby process, those
running now and those started later (within --rescan of their exec or fork,
Puma's forked workers included), sample them all on one clock at --rate Hz,
and push per process, every --interval, a cpu and a wall profile with the
activity label (running, gvl_wait, blocked, gc) to Pyroscope.

Targets are never paused: every read is nonblocking. A process that exits
is dropped; one that execs is looked at anew. Profiles wait in one buffer
for the whole host (--buffer) while the server is down; when it is full the
oldest are dropped and counted (rbscope_agent_dropped_profiles_total).

With --alloc, each process's allocations are counted too (eBPF uprobes, as
rbscope alloc's default mode: short counting windows, about 3 % of the time,
scaled by Ruby's own allocation counter) and one allocation profile
(alloc_objects, alloc_space, by class and stack) is pushed per --interval.

Labels: service_name (PYROSCOPE_APPLICATION_NAME or OTEL_SERVICE_NAME in the
process's environment, else the script's name), pid, ruby_version, hostname,
container_id and pod_uid when it runs in one, and each --tag. Counters for
Prometheus are served on --metrics-addr/metrics. SIGTERM or SIGINT pushes
the last profiles (for at most --flush-timeout) and exits. Credentials come
from the environment, as for record --upload.`,
		Example: `  rbscope agent --upload http://pyroscope:4040
  rbscope agent --upload http://pyroscope:4040 --tag env=prod --include puma --max-processes 100
  rbscope agent --upload http://pyroscope:4040 --alloc --interval 30s --realtime
  rbscope agent --upload http://127.0.0.1:4040 --user www-data --cgroup 'system.slice/shop'`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			return o.run()
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.url, "upload", "", "the Pyroscope server's URL (required)")
	f.Float64Var(&o.rate, "rate", agent.DefaultRate, "samples per second, for every process")
	f.DurationVar(&o.interval, "interval", agent.DefaultInterval, "length of one pushed profile")
	f.Int64Var(&o.buffer, "buffer", agent.DefaultBuffer, "bytes of profiles kept while the server is unreachable, for the whole host")
	f.StringArrayVar(&o.tags, "tag", nil, "label every profile with key=value (repeatable)")
	f.StringVar(&o.include, "include", "", "profile only processes whose command line matches this regular expression")
	f.StringVar(&o.exclude, "exclude", "", "leave out processes whose command line matches this regular expression")
	f.StringArrayVar(&o.users, "user", nil, "profile only processes of this user (name or uid; repeatable)")
	f.StringVar(&o.cgroup, "cgroup", "", "profile only processes whose cgroup path matches this regular expression")
	f.BoolVar(&o.alloc, "alloc", false, "also count allocations (eBPF) and push an allocation profile per interval")
	f.BoolVar(&o.realtime, "realtime", false, "run the sampling clock at real-time priority (SCHED_FIFO 1; root or CAP_SYS_NICE):\n"+
		"on a host whose CPUs are busy, an ordinary clock's reads wait for the targets' next\n"+
		"system calls and the cpu profiles lean towards the code before them")
	f.IntVar(&o.maxProcs, "max-processes", 0, "profile at most this many processes at once (0: no limit)")
	f.DurationVar(&o.rescan, "rescan", agent.DefaultRescan, "how often to look for new processes")
	f.DurationVar(&o.flushTimeout, "flush-timeout", agent.DefaultFlushTimeout, "how long to keep pushing after SIGTERM")
	f.StringVar(&o.metrics, "metrics-addr", agent.DefaultMetricsAddr, "serve Prometheus /metrics here (\"\" for nowhere)")
	f.StringVar(&o.logFormat, "log-format", "text", "log format: text or json")
	f.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	rootCmd.AddCommand(cmd)
}

func (o *agentFlags) config() (agent.Config, error) {
	if o.url == "" {
		return agent.Config{}, usage("give the Pyroscope server: rbscope agent --upload URL")
	}
	cfg := agent.Config{
		URL: o.url, Rate: o.rate, Interval: o.interval, Buffer: o.buffer, MaxProcesses: o.maxProcs,
		Rescan: o.rescan, FlushTimeout: o.flushTimeout, MetricsAddr: o.metrics, Tags: map[string]string{},
		Alloc: o.alloc, Realtime: o.realtime,
	}
	if o.rate <= 0 || o.rate > 1000 {
		return cfg, usage("--rate %g: want 0 < rate <= 1000", o.rate)
	}
	if o.interval < time.Second {
		return cfg, usage("--interval %v: one second at least", o.interval)
	}
	if o.buffer <= 0 {
		return cfg, usage("--buffer %d: want a positive number of bytes", o.buffer)
	}
	for _, t := range o.tags {
		k, v, err := upload.ParseTag(t)
		if err != nil {
			return cfg, usage("--tag: %w", err)
		}
		cfg.Tags[k] = v
	}
	for _, r := range []struct {
		flag, expr string
		dst        **regexp.Regexp
	}{{"include", o.include, &cfg.Include}, {"exclude", o.exclude, &cfg.Exclude}, {"cgroup", o.cgroup, &cfg.Cgroup}} {
		if r.expr == "" {
			continue
		}
		re, err := regexp.Compile(r.expr)
		if err != nil {
			return cfg, usage("--%s: %w", r.flag, err)
		}
		*r.dst = re
	}
	for _, u := range o.users {
		uid, err := strconv.Atoi(u)
		if err != nil {
			usr, lerr := user.Lookup(u)
			if lerr != nil {
				return cfg, usage("--user %s: %w", u, lerr)
			}
			uid, _ = strconv.Atoi(usr.Uid)
		}
		cfg.Users = append(cfg.Users, uid)
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return cfg, usage("--log-level %q: want debug, info, warn or error", o.logLevel)
	}
	hopts := &slog.HandlerOptions{Level: level}
	switch strings.ToLower(o.logFormat) {
	case "text":
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, hopts))
	case "json":
		cfg.Logger = slog.New(slog.NewJSONHandler(os.Stderr, hopts))
	default:
		return cfg, usage("--log-format %q: want text or json", o.logFormat)
	}
	return cfg, nil
}

func (o *agentFlags) run() error {
	cfg, err := o.config()
	if err != nil {
		return err
	}
	a, err := agent.New(cfg)
	if err != nil {
		return fmt.Errorf("start agent: %w", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	return a.Run(ctx)
}

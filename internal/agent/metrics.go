package agent

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metric is one series the agent exports, read from Stats at each scrape.
type metric struct {
	desc  *prometheus.Desc
	typ   prometheus.ValueType
	value func(*Stats) float64
}

func counter(name, help string, f func(*Stats) float64) metric {
	return metric{prometheus.NewDesc("rbscope_agent_"+name, help, nil, nil), prometheus.CounterValue, f}
}

func gauge(name, help string, f func(*Stats) float64) metric {
	return metric{prometheus.NewDesc("rbscope_agent_"+name, help, nil, nil), prometheus.GaugeValue, f}
}

// collector exports the agent's Stats (the process's own CPU, RSS and
// file descriptors come from the standard process collector).
type collector struct {
	a       *Agent
	metrics []metric
	errors  *prometheus.Desc
	skipped *prometheus.Desc
}

func newCollector(a *Agent) *collector {
	f := func(v int64) float64 { return float64(v) }
	return &collector{
		a: a,
		metrics: []metric{
			gauge("processes_tracked", "Ruby processes being profiled now.", func(s *Stats) float64 { return float64(s.Tracked) }),
			counter("processes_discovered_total", "Ruby processes found that pass the filters.", func(s *Stats) float64 { return f(s.Discovered) }),
			counter("processes_opened_total", "Ruby processes opened for profiling.", func(s *Stats) float64 { return f(s.Opened) }),
			counter("processes_exited_total", "Profiled processes that exited.", func(s *Stats) float64 { return f(s.Exited) }),
			counter("processes_reexeced_total", "Profiled processes that exec'd (looked at anew).", func(s *Stats) float64 { return f(s.Reexecs) }),
			counter("process_checks_total", "Process images examined for being Ruby (once per image).", func(s *Stats) float64 { return f(s.RubyChecks) }),
			gauge("host_processes", "Processes in /proc at the last listing.", func(s *Stats) float64 { return f(s.HostProcesses) }),
			counter("scans_total", "Listings of /proc.", func(s *Stats) float64 { return f(s.Scans) }),
			counter("scan_seconds_total", "Time spent listing /proc, examining and opening processes.", func(s *Stats) float64 { return s.ScanTime.Seconds() }),
			counter("ticks_total", "Ticks of the sampling clock.", func(s *Stats) float64 { return f(s.Ticks) }),
			counter("process_ticks_total", "Processes sampled, summed over ticks.", func(s *Stats) float64 { return f(s.TargetTicks) }),
			counter("tick_seconds_total", "Time spent sampling, summed over ticks.", func(s *Stats) float64 { return s.TickTime.Seconds() }),
			counter("samples_total", "Thread samples taken.", func(s *Stats) float64 { return f(s.Samples) }),
			counter("profiles_total", "Profiles built and queued.", func(s *Stats) float64 { return f(s.Profiles) }),
			counter("profile_errors_total", "Profiles that could not be built or queued.", func(s *Stats) float64 { return f(s.ProfileErrors) }),
			counter("pushes_total", "Profiles the server accepted.", func(s *Stats) float64 { return f(s.Upload.Pushed) }),
			counter("pushed_samples_total", "Samples in the profiles the server accepted.", func(s *Stats) float64 { return f(s.Upload.PushedSamples) }),
			counter("push_retries_total", "Failed pushes tried again.", func(s *Stats) float64 { return f(s.Upload.Retried) }),
			counter("push_rejected_total", "Profiles the server refused (4xx), not retried.", func(s *Stats) float64 { return f(s.Upload.Rejected) }),
			counter("dropped_profiles_total", "Profiles dropped: the buffer was full, or refused.", func(s *Stats) float64 { return f(s.Upload.Dropped) }),
			counter("dropped_samples_total", "Samples in the dropped profiles.", func(s *Stats) float64 { return f(s.Upload.DroppedSamples) }),
			gauge("queued_profiles", "Profiles waiting to be pushed.", func(s *Stats) float64 { return float64(s.Upload.Queued) }),
			gauge("queued_bytes", "Bytes of profiles waiting to be pushed.", func(s *Stats) float64 { return f(s.Upload.QueuedBytes) }),
			gauge("buffer_bytes", "The bound on queued bytes (--buffer).", func(s *Stats) float64 { return f(s.Buffer) }),
			counter("runtime_symbol_loads_total", "Ruby binaries whose symbols were read from their files.", func(s *Stats) float64 { return f(s.Runtime.SymbolLoads) }),
			counter("runtime_symbol_hits_total", "Ruby binaries whose symbols were shared from another process.", func(s *Stats) float64 { return f(s.Runtime.SymbolHits) }),
			counter("runtime_layout_resolutions_total", "Ruby builds whose version and struct layout were resolved.", func(s *Stats) float64 { return f(s.Runtime.LayoutResolutions) }),
			counter("runtime_layout_hits_total", "Processes whose version and layout were shared from another of their build.", func(s *Stats) float64 { return f(s.Runtime.LayoutHits) }),
			gauge("alloc_processes", "Processes whose allocations are counted now (--alloc).", func(s *Stats) float64 { return float64(s.AllocTracked) }),
			counter("alloc_profiles_total", "Allocation profiles queued (--alloc).", func(s *Stats) float64 { return f(s.AllocProfiles) }),
			counter("alloc_errors_total", "Processes whose allocations could not be counted (--alloc).", func(s *Stats) float64 { return f(s.AllocErrors) }),
			gauge("runtime_builds", "Ruby builds known.", func(s *Stats) float64 { return float64(s.Runtime.Builds) }),
		},
		errors:  prometheus.NewDesc("rbscope_agent_sample_errors_total", "Failed samples by kind.", []string{"kind"}, nil),
		skipped: prometheus.NewDesc("rbscope_agent_processes_skipped_total", "Processes not profiled, by reason.", []string{"reason"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range c.metrics {
		ch <- m.desc
	}
	ch <- c.errors
	ch <- c.skipped
}

// Collect implements prometheus.Collector.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	st := c.a.Stats()
	for _, m := range c.metrics {
		ch <- prometheus.MustNewConstMetric(m.desc, m.typ, m.value(&st))
	}
	for _, k := range []string{"exited", "inconsistent", "permission", "other", "moved_on"} {
		ch <- prometheus.MustNewConstMetric(c.errors, prometheus.CounterValue, float64(st.Errors[k]), k)
	}
	for reason, n := range map[string]int64{
		"not_ruby": st.NotRuby, "filtered": st.Filtered, "denied": st.Denied,
		"not_readable": st.GaveUp, "max_processes": st.OverLimit,
	} {
		ch <- prometheus.MustNewConstMetric(c.skipped, prometheus.CounterValue, float64(n), reason)
	}
}

// metricsHandler serves /metrics in Prometheus's text format: the
// agent's counters, and the process's own CPU, RSS and file descriptors.
func (a *Agent) metricsHandler() http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(newCollector(a),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{Namespace: "rbscope_agent"}),
		collectors.NewGoCollector())
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	return mux
}

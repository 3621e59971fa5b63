// Package agent profiles every Ruby process on a host, all the time, into
// Pyroscope: the library behind `rbscope agent`.
//
// Three parts, each on its own goroutine:
//
//   - Discovery lists /proc every Rescan, tells Ruby processes from others
//     cheaply (the executable's name, else a libruby mapping; a negative
//     answer is kept per process image, so a non-Ruby process is looked at
//     once, and again only after it execs), applies the filters, opens the
//     Ruby ones (sharing symbols and layouts per Ruby build through one
//     ruby.Runtimes) and hands them to the clock. A process that execs is
//     dropped and looked at anew; one that exits is dropped.
//   - The clock (sampler.Run) wakes Rate times a second and samples every
//     target in turn with nonblocking reads only: the agent never pauses a
//     target. Each target's samples go straight into its cpu and wall
//     profile builders (equal stacks merged as they come).
//   - Every Interval, aligned to the wall clock, each target's profiles are
//     finished and queued, labelled service_name, pid, ruby_version,
//     hostname and the user's tags (see labelsFor), in one upload.Uploader
//     for the whole host: one bounded queue, the oldest profiles dropped
//     and counted when it is full.
//
// Counters for Prometheus are served on MetricsAddr (see metrics.go).
package agent

// Package procfs reads what rbscope needs from Linux's /proc: a process's
// stat line (state, parent, CPU times, identity), its command line, the
// status fields that say who traces it and how it is confined, and the
// facts that explain a refused access (Yama's ptrace_scope, seccomp, PID
// and user namespaces).
//
// It is the only place that parses these files; every other package asks
// it.
package procfs

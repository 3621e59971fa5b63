// Package postmortem turns the core of a crashing Ruby process into a
// report of every Ruby thread's stack, from inside the kernel's
// core_pattern pipe.
//
// The kernel runs the handler (rbscope core-handler) when a process dies
// from a signal that dumps core, with the core on standard input and, while
// the dump is in progress, /proc/PID of the dying process still in place.
// Handle captures what /proc says (command line, mappings, the process's
// root directory, kept open so that its binaries stay readable after the
// process is gone), streams the core to a file under a size cap, walks the
// Ruby threads' stacks in it and writes a JSON and a text report. Non-Ruby
// processes leave one log line or are handed to a chained handler.
//
// Everything is bounded: a global deadline, a cap on the core's size, a
// floor on the file system's free space, and a retention limit on the
// number of reports kept. Every outcome, including every error, is logged
// to handler.log in the report directory, since nobody reads the standard
// error of a program the kernel runs.
package postmortem

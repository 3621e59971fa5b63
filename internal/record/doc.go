// Package record owns one recording: it attaches to a process (or
// launches a command and supervises it), runs the sampler, feeds every
// sample to the sinks (the raw recording, an uploader, a live view),
// handles the signals that end or suspend a recording, and renders the
// profile at the end.
//
// The CLI maps its flags to a Config and calls Run. Target is the part of
// the Config that every live subcommand shares (record, top, alloc):
// which process, how fast, blocking or not; Validate is the one check of
// it, and its errors are UsageErrors (exit status 2).
package record

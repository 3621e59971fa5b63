// Package recording reads and writes rbscope's raw recording format: the
// samples of one `rbscope record` run, streamed to disk as they are taken
// so that a recording cut short (crash, kill -9, full disk) stays readable
// up to its last flushed block, and re-rendered later by `rbscope report`.
//
// # File layout (version 3; versions 1 and 2 are read too)
//
//	magic    8 bytes  "RBSCOPE\x00"
//	version  4 bytes  little-endian uint32 (3)
//	blocks   one or more independent gzip members, back to back
//
// The first block holds only the header record; every later block holds
// whole records, so each block decodes on its own and a file cut at a block
// boundary loses nothing but the trailer. Inside a block, each record is a
// one-byte kind followed by its payload (integers are unsigned or zig-zag
// varints, strings are referenced by index):
//
//	'H' header    uvarint length, JSON Header
//	'S' string    uvarint length, bytes; gets the next string index
//	'F' frame     name string, path string, uvarint line, kind string,
//	              then (version 2) internal path string, uvarint
//	              internal line; gets the next frame index
//	'T' thread    varint pid, varint tid, name string, then (version 3)
//	              uvarint Ruby thread id (stack.Sample.ThreadID); gets
//	              the next thread index (a renamed thread, or one that
//	              moved to another native thread, gets a new index)
//	'X' sample    varint time delta in ns from the previous sample (the
//	              first from Header.Start), uvarint thread, byte flags
//	              (bit 0: on CPU), uvarint frame count, uvarint frames
//	              (innermost first)
//	'E' trailer   uvarint length, JSON trailer (Stats and per-thread
//	              metadata); written by Writer.Close, always last
//
// Strings, frames and threads are interned per file: each is written once,
// in the block where it is first used, before the first record that refers
// to it.
package recording

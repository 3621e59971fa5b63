// Package heap reads a Ruby process's object heap from outside: the
// objspace's sorted list of heap pages, each page's slots, and for every
// live slot its type, its class (RBasic.klass, named through package ruby)
// and the bytes it holds: the slot itself plus, for strings, arrays,
// hashes and objects (3.0-3.1, and 3.3-3.4 through the shape tree), the buffer
// Ruby malloc'd for it. It also writes heap dumps in ObjectSpace.dump_all's
// format (dump.go) and compares censuses (Grow).
//
// A census streams the heap in batches of pages (one process_vm_readv per
// batch) through two fixed buffers, so that rbscope's memory stays bounded
// whatever the size of the heap. While the process runs, each batch is read
// twice and a slot whose bytes differ between the two reads is counted as
// changed, never attributed; with Stop the whole process is paused for an
// exact census.
//
// Supported: Ruby 3.0 to 3.4, with offsets from DWARF when the build has
// it, else from small per-version tables that every page proves (its body
// header points back at it, its slots fill the page exactly) and, for the
// objspace's page list, a search by shape (see offsets.go).
package heap

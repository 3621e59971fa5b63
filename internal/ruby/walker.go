package ruby

import (
	"github.com/rbscope/rbscope/internal/stack"
	"github.com/rbscope/rbscope/internal/target"
)

// A Process's work is split by what it lasts for. Process holds what is
// true of one process for as long as it is profiled (its target, where its
// VM is, the name caches, each thread's last stack, the GC epoch); its
// Runtime what is true of its Ruby build. Each snapshot is taken by the
// process's walker: the thread list, each thread's state and frames, and
// the scratch of that work. The walker names frames through the process's
// namer, which decodes iseqs, methods, classes and strings and records
// the witnesses of the names it caches (witness.go). Both are reused from
// snapshot to snapshot (a Process is not for concurrent use) and reach
// the process's state through the *Process they embed.

// walker takes a process's snapshots (see above).
type walker struct {
	*Process

	reqBuf      []target.Read
	fdsBuf      []frameData
	cachedBuf   []bool
	pendingBuf  []int
	frameBuf    []stack.Frame // a stack being named (see keepFrames)
	regionsAt   int64         // when this tick's region batch began (offCPU's clock; 0: not usable)
	envs        map[uint64]*frameData
	walkFds     []frameData // the frames of the walk in progress
	envsIndexed bool        // envs indexes walkFds
	envSuspect  bool        // the walk in progress found a frame without its method entry
	ownerTmp    frameData
	stopped     bool // the target does not run while this snapshot reads it
	// knownThreadList's reads of the GC count and the ractor count.
	tickGC  [8]byte
	tickCnt [4]byte
	// ractors is the VM's ractor count read by this snapshot (0: not
	// known).
	ractors   int
	copy2     []byte        // first copy of a control-frame region
	frameReqs []target.Read // readFrames' reads, reused
	frameCFPs [3][8]byte    // readFrames' cfp reads
	frameDone bool          // the last frame named is past its last instruction
	tickReqs  []target.Read
	onlyRefs  []threadRef // SnapshotThread's thread (see onlyThread)
	// merged reads the thread list's requests (their order does not
	// matter) in page spans: fewer remote iovecs per tick.
	merged target.Coalescer
	// Per-snapshot buffers, reused (see scratch.go).
	scratch   scratch
	refsBuf   []threadRef
	checksBuf []regionCheck
	// guessRegions' reads, one guess per thread of the tick, and whether
	// this snapshot makes them (the target runs and every thread is read).
	guessReqs []target.Read
	guesses   []regionGuess
	guessing  bool
	guessTick uint32
	gcFresh   bool // the GC flags were read with the thread list
	checkWits []witness
	checkOK   []bool
	checkTodo []nameCheck
}

// namer names what a walker's frames point to (see above).
type namer struct {
	*Process

	// Witnesses of cached names (see witness.go).
	rec      *witness // the witness being recorded, if any
	witBuf   []byte
	witReqs  []target.Read
	witSpans []witSpan
	witOK    []bool
	// witMerged reads the witnesses' spans (their order does not
	// matter) in page spans: names cached on few pages cost one remote
	// iovec per page, not per span.
	witMerged target.Coalescer
	witStack  []*witness // scratch witnesses, by nesting depth
	witOuter  []*witness // the recording each one interrupted
}

// opener finds a process's Ruby (its binaries, version, layout and VM)
// for Open; it keeps nothing once Open returns.
type opener struct {
	*Process
}

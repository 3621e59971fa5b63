package recording

import (
	"compress/gzip"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/rbscope/rbscope/internal/stack"
)

// Magic starts every raw recording.
const Magic = "RBSCOPE\x00"

// FormatVersion is the version of the format this package writes; the
// reader reads every version from MinFormatVersion to it.
const FormatVersion = 3

// MinFormatVersion is the oldest version the reader reads.
const MinFormatVersion = 1

// Record kinds.
const (
	recHeader  = 'H'
	recString  = 'S'
	recFrame   = 'F'
	recThread  = 'T'
	recSample  = 'X'
	recTrailer = 'E'
)

// Flush policy defaults: a block is written when it holds FlushSamples
// samples or FlushInterval after its first sample, whichever comes first.
const (
	FlushSamples  = 512
	FlushInterval = time.Second
)

// Header describes a recording; it is written first.
type Header struct {
	RateHz         float64   `json:"rate_hz"`                   // sampling rate asked for
	Start          time.Time `json:"start"`                     // when sampling started
	RbscopeVersion string    `json:"rbscope_version,omitempty"` // rbscope's version
	Pids           []int     `json:"pids,omitempty"`            // the profiled process(es)
	Command        []string  `json:"command,omitempty"`         // target command line
	RubyVersion    string    `json:"ruby_version,omitempty"`    // "3.1.2"
	LayoutSource   string    `json:"layout_source,omitempty"`   // "builtin:3.1.2", "dwarf:..."
	Hostname       string    `json:"hostname,omitempty"`        // machine the target ran on
	// Options are free-form recording settings ("on_cpu": "true", ...).
	Options map[string]string `json:"options,omitempty"`
}

// Stats are end-of-recording counters, written in the trailer by Close.
type Stats struct {
	Samples int64            `json:"samples"`          // samples written (set by Writer.Close)
	Late    int64            `json:"late"`             // samples taken later than scheduled
	Errors  map[string]int64 `json:"errors,omitempty"` // failed samples, by kind
	End     time.Time        `json:"end"`              // when sampling stopped
	// Unread lists the threads with samples not written because their
	// stack could not be read, by the activity they were in.
	Unread []UnreadThread `json:"unread,omitempty"`
	// Torn lists the threads with samples written under a
	// (stack changed while read) frame (nonblocking), the thread that
	// held the GVL most first.
	Torn []TornThread `json:"torn,omitempty"`
}

// TornThread counts one thread's samples whose stack kept changing while
// it was read (written with the frames that held still under a
// (stack changed while read) frame), out of its samples (unread ones
// included), and those in which it held the GVL.
type TornThread struct {
	Pid     int    `json:"pid"`
	TID     int    `json:"tid"`
	Name    string `json:"name,omitempty"`
	Torn    int    `json:"torn"`
	Samples int    `json:"samples"`
	GVL     int    `json:"gvl"`
}

// UnreadThread counts one thread's samples whose stack could not be read
// (torn by the running thread), by activity (read before the stack).
type UnreadThread struct {
	Pid        int                    `json:"pid"`
	TID        int                    `json:"tid"`
	Name       string                 `json:"name,omitempty"`
	ByActivity map[stack.Activity]int `json:"by_activity"`
}

// ThreadInfo is per-thread metadata, gathered while writing.
type ThreadInfo struct {
	Pid int `json:"pid"`
	TID int `json:"tid"`
	// ThreadID is the Ruby thread's identity (stack.Sample.ThreadID); a
	// Ruby thread that moves between native threads (M:N) has one
	// ThreadInfo per tid, all with its ThreadID. 0 before version 3.
	ThreadID uint64    `json:"thread_id,omitempty"`
	Name     string    `json:"name"`
	Samples  int64     `json:"samples"`
	First    time.Time `json:"first"` // time of its first sample
	Last     time.Time `json:"last"`  // time of its last sample
}

type trailer struct {
	Stats   Stats        `json:"stats"`
	Threads []ThreadInfo `json:"threads"`
}

type threadKey struct {
	pid, tid int
	id       uint64
	name     string
}

// prevStack is a thread's previous stack, its identity and its frame
// ids.
type prevStack struct {
	frames []stack.Frame // the sample's own frames when id is known, else own
	id     stack.ID
	ids    []uint64
	own    []stack.Frame // a copy of frames whose id is not known
}

// Writer streams samples into a raw recording. It is safe for use by
// several goroutines.
type Writer struct {
	mu  sync.Mutex
	f   *os.File
	gz  *gzip.Writer
	buf []byte // records of the block being built

	strings map[string]uint64
	frames  map[stack.Frame]uint64
	threads map[threadKey]uint64
	tinfo   []ThreadInfo
	prev    []prevStack // per thread index
	ids     []uint64

	prevNanos int64
	pending   int
	lastFlush time.Time
	samples   int64
	err       error // first write error; sticky
	closed    bool
	timer     *time.Timer // flushes a pending block when no Add comes

	// FlushSamples and FlushInterval set the flush policy; Create sets
	// them to the package defaults. Change them before the first Add.
	FlushSamples  int
	FlushInterval time.Duration
}

// Create creates (truncating) the file at path, creating its directory if
// needed, and writes the magic, version and header h, flushed to disk at
// once. Claim the file first (Claim, ClaimDefault) when another recording
// may be given the same path. A zero h.Start is set to now and an empty h.Hostname to this host's.
func Create(path string, h Header) (*Writer, error) {
	if h.Start.IsZero() {
		h.Start = time.Now()
	}
	if h.Hostname == "" {
		h.Hostname, _ = os.Hostname()
	}
	hj, err := json.Marshal(h)
	if err != nil {
		return nil, fmt.Errorf("encode header: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("create recording directory: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("create recording: %w", err)
	}
	w := &Writer{
		f:             f,
		strings:       make(map[string]uint64),
		frames:        make(map[stack.Frame]uint64),
		threads:       make(map[threadKey]uint64),
		prevNanos:     h.Start.UnixNano(),
		lastFlush:     time.Now(),
		FlushSamples:  FlushSamples,
		FlushInterval: FlushInterval,
	}
	var pre [12]byte
	copy(pre[:], Magic)
	binary.LittleEndian.PutUint32(pre[8:], FormatVersion)
	if _, err := f.Write(pre[:]); err != nil {
		f.Close()
		return nil, fmt.Errorf("write magic: %w", err)
	}
	w.gz, err = gzip.NewWriterLevel(f, gzip.BestSpeed)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("create compressor: %w", err)
	}
	w.buf = append(w.buf, recHeader)
	w.buf = binary.AppendUvarint(w.buf, uint64(len(hj)))
	w.buf = append(w.buf, hj...)
	if err := w.flushLocked(); err != nil {
		f.Close()
		return nil, fmt.Errorf("write header: %w", err)
	}
	return w, nil
}

// Path is the name of the file being written.
func (w *Writer) Path() string { return w.f.Name() }

func (w *Writer) str(s string) uint64 {
	if id, ok := w.strings[s]; ok {
		return id
	}
	id := uint64(len(w.strings))
	w.strings[s] = id
	w.buf = append(w.buf, recString)
	w.buf = binary.AppendUvarint(w.buf, uint64(len(s)))
	w.buf = append(w.buf, s...)
	return id
}

func (w *Writer) frame(f stack.Frame) uint64 {
	if id, ok := w.frames[f]; ok {
		return id
	}
	name, path, kind := w.str(f.Name), w.str(f.Path), w.str(string(f.Kind))
	ipath := w.str(f.InternalPath)
	id := uint64(len(w.frames))
	w.frames[f] = id
	w.buf = append(w.buf, recFrame)
	w.buf = binary.AppendUvarint(w.buf, name)
	w.buf = binary.AppendUvarint(w.buf, path)
	line := f.Line
	if line < 0 {
		line = 0
	}
	w.buf = binary.AppendUvarint(w.buf, uint64(line))
	w.buf = binary.AppendUvarint(w.buf, kind)
	w.buf = binary.AppendUvarint(w.buf, ipath)
	w.buf = binary.AppendUvarint(w.buf, uint64(max(f.InternalLine, 0)))
	return id
}

func (w *Writer) thread(s *stack.Sample) uint64 {
	k := threadKey{s.Pid, s.TID, s.ThreadID, s.ThreadName}
	id, ok := w.threads[k]
	if !ok {
		name := w.str(s.ThreadName)
		id = uint64(len(w.threads))
		w.threads[k] = id
		w.tinfo = append(w.tinfo, ThreadInfo{Pid: s.Pid, TID: s.TID, ThreadID: s.ThreadID, Name: s.ThreadName, First: s.Time})
		w.prev = append(w.prev, prevStack{})
		w.buf = append(w.buf, recThread)
		w.buf = binary.AppendVarint(w.buf, int64(s.Pid))
		w.buf = binary.AppendVarint(w.buf, int64(s.TID))
		w.buf = binary.AppendUvarint(w.buf, name)
		w.buf = binary.AppendUvarint(w.buf, s.ThreadID)
	}
	ti := &w.tinfo[id]
	ti.Samples++
	ti.Last = s.Time
	return id
}

// frameIDs returns the frame ids of s, a sample of the thread whose
// previous stack is prev, and makes s's stack the previous one. The ids
// are prev's until the next call for that thread.
func (w *Writer) frameIDs(prev *prevStack, s *stack.Sample) []uint64 {
	if stack.Same(s.Stack, prev.id) {
		return prev.ids // the same stack: the same ids
	}
	// The outer frames of a thread's stack rarely change between samples:
	// reuse the ids of the frames shared with its previous stack, compared
	// from the outside in, and look up only the others.
	n, pn := len(s.Frames), len(prev.frames)
	ids := slices.Grow(w.ids[:0], n)[:n]
	j := 0
	for j < n && j < pn && s.Frames[n-1-j] == prev.frames[pn-1-j] {
		ids[n-1-j] = prev.ids[pn-1-j]
		j++
	}
	for k := n - 1 - j; k >= 0; k-- {
		ids[k] = w.frame(s.Frames[k])
	}
	if prev.id = s.Stack; prev.id != 0 {
		prev.frames = s.Frames // shared, never modified (stack.ID)
	} else {
		// The caller may reuse its slice: keep a copy.
		prev.own = append(prev.own[:0], s.Frames...)
		prev.frames = prev.own
	}
	prev.ids = append(prev.ids[:0], ids...)
	w.ids = ids
	return prev.ids
}

// Add appends one sample. The block being built is written to disk when
// it holds FlushSamples samples, or FlushInterval after its first sample
// (by a timer if no Add comes). After a write error every call returns it.
func (w *Writer) Add(s stack.Sample) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return w.err
	}
	if w.closed {
		return errors.New("add sample: recording closed")
	}
	if len(s.Frames) > MaxFrames {
		return fmt.Errorf("add sample: %d frames, more than %d", len(s.Frames), MaxFrames)
	}
	// Interned definitions go into the buffer before the sample that
	// uses them; collect the frame ids first.
	tid := w.thread(&s)
	ids := w.frameIDs(&w.prev[tid], &s)
	ns := s.Time.UnixNano()
	w.buf = append(w.buf, recSample)
	w.buf = binary.AppendVarint(w.buf, ns-w.prevNanos)
	w.prevNanos = ns
	w.buf = binary.AppendUvarint(w.buf, tid)
	flags := sampleFlags(&s)
	w.buf = append(w.buf, flags)
	w.buf = binary.AppendUvarint(w.buf, uint64(len(ids)))
	for _, id := range ids {
		w.buf = binary.AppendUvarint(w.buf, id)
	}
	w.samples++
	w.pending++
	if w.pending >= w.FlushSamples || time.Since(w.lastFlush) >= w.FlushInterval {
		return w.flushLocked()
	}
	if w.pending == 1 && w.FlushInterval > 0 {
		// Samples must not wait in memory for the next Add, which may
		// be long in coming (an idle target with --on-cpu).
		if w.timer == nil {
			w.timer = time.AfterFunc(w.FlushInterval, w.timedFlush)
		} else {
			w.timer.Reset(w.FlushInterval)
		}
	}
	return nil
}

func (w *Writer) timedFlush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil && !w.closed && w.pending > 0 {
		w.flushLocked() // an error is kept in w.err for the next call
	}
}

// Flush writes the samples added so far as one block.
func (w *Writer) Flush() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return w.err
	}
	if w.closed {
		return nil
	}
	return w.flushLocked()
}

func (w *Writer) flushLocked() error {
	w.lastFlush = time.Now()
	if len(w.buf) == 0 {
		return nil
	}
	w.gz.Reset(w.f)
	if _, err := w.gz.Write(w.buf); err != nil {
		w.err = fmt.Errorf("write block: %w", err)
		return w.err
	}
	if err := w.gz.Close(); err != nil {
		w.err = fmt.Errorf("write block: %w", err)
		return w.err
	}
	w.buf = w.buf[:0]
	w.pending = 0
	return nil
}

// Close writes the pending samples and the trailer (st with Samples set to
// the number of samples written, End set to now if zero, and per-thread
// metadata), and closes the file.
func (w *Writer) Close(st Stats) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return errors.New("close recording: already closed")
	}
	w.closed = true
	if w.timer != nil {
		w.timer.Stop()
	}
	if w.err != nil {
		w.f.Close()
		return w.err
	}
	st.Samples = w.samples
	if st.End.IsZero() {
		st.End = time.Now()
	}
	tj, err := json.Marshal(trailer{Stats: st, Threads: w.tinfo})
	if err != nil {
		w.f.Close()
		return fmt.Errorf("encode trailer: %w", err)
	}
	w.buf = append(w.buf, recTrailer)
	w.buf = binary.AppendUvarint(w.buf, uint64(len(tj)))
	w.buf = append(w.buf, tj...)
	if err := w.flushLocked(); err != nil {
		w.f.Close()
		return err
	}
	if err := w.f.Close(); err != nil {
		return fmt.Errorf("close recording: %w", err)
	}
	return nil
}

// A sample's flags byte: bit 0 on a CPU, bits 1-3 the activity (0 when
// unknown, as in recordings made before activities existed), bit 4 the
// GVL's owner.
const (
	flagOnCPU    = 1
	flagActShift = 1
	flagActMask  = 7
	flagGVL      = 1 << 4
)

// activityCodes numbers the activities in the flags byte (0: none).
var activityCodes = []stack.Activity{"", stack.ActivityRunning, stack.ActivityGVLWait, stack.ActivityBlocked, stack.ActivityGC, stack.ActivityUnknown}

func sampleFlags(s *stack.Sample) byte {
	var flags byte
	if s.OnCPU {
		flags |= flagOnCPU
	}
	for i, a := range activityCodes {
		if a == s.Activity {
			flags |= byte(i) << flagActShift
			break
		}
	}
	if s.GVL {
		flags |= flagGVL
	}
	return flags
}

func activityOf(flags byte) stack.Activity {
	if i := int(flags>>flagActShift) & flagActMask; i < len(activityCodes) {
		return activityCodes[i]
	}
	return stack.ActivityUnknown
}

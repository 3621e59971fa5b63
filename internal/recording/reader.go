package recording

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/rbscope/rbscope/internal/stack"
)

// Limits that bound a reader's memory on hostile or corrupt input.
const (
	maxBlock       = 64 << 20  // decompressed bytes in one block
	maxStringBytes = 256 << 20 // interned string bytes in one file
	maxRecordJSON  = 16 << 20  // header or trailer JSON
)

// MaxFrames is the deepest stack a recording holds.
const MaxFrames = 1 << 17

// ErrTruncated is wrapped by the error Next returns when the recording
// ends inside a block (a torn write).
var ErrTruncated = errors.New("truncated")

// Reader reads a raw recording.
type Reader struct {
	br     *bufio.Reader
	closer io.Closer
	gz     *gzip.Reader

	h        Header
	version  uint32 // the file's format version
	block    []byte
	pos      int
	blockNum int
	off      int64 // file offset of the next block; counts bytes consumed

	strs      []string
	strBytes  int
	frames    []stack.Frame
	threads   []ThreadInfo
	prevNanos int64
	// last holds, per thread (indexed as threads), the frame ids of its
	// previous sample and the frames made for them: a thread's stack is
	// often the same from one sample to the next (a loop, a wait), and
	// its frames are then shared instead of made again (50 frames: 2 KB
	// per sample).
	last []lastStack
	kept int      // entries of last holding a stack (at most maxKeptStacks)
	ids  []uint64 // scratch: the ids of the sample being read

	trailer   *trailer
	truncated bool
	err       error // sticky: io.EOF or the error that stopped reading
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n *int64
}

func (c countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	*c.n += int64(n)
	return n, err
}

// Open opens the raw recording at path and reads its header.
func Open(path string) (*Reader, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open recording: %w", err)
	}
	r, err := NewReader(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	r.closer = f
	return r, nil
}

// NewReader reads a raw recording's header from rd.
func NewReader(rd io.Reader) (*Reader, error) {
	r := &Reader{}
	r.br = bufio.NewReaderSize(countingReader{rd, &r.off}, 64<<10)
	var pre [12]byte
	if n, err := io.ReadFull(r.br, pre[:]); err != nil {
		switch {
		case n > 0 && !strings.HasPrefix(Magic, string(pre[:min(n, len(Magic))])):
			// Too short to be a recording, and not the start of one.
			return nil, errors.New("read magic: not an rbscope recording")
		case n == 0 && err == io.EOF:
			return nil, fmt.Errorf("read magic: %w: the file is empty", ErrTruncated)
		case errors.Is(err, io.ErrUnexpectedEOF):
			return nil, fmt.Errorf("read magic: %w: file is %d bytes", ErrTruncated, n)
		}
		return nil, fmt.Errorf("read magic: %w", err)
	}
	if string(pre[:8]) != Magic {
		return nil, errors.New("read magic: not an rbscope recording")
	}
	r.version = binary.LittleEndian.Uint32(pre[8:])
	if r.version < MinFormatVersion || r.version > FormatVersion {
		return nil, fmt.Errorf("read header: unsupported format version %d (this rbscope reads %d to %d)", r.version, MinFormatVersion, FormatVersion)
	}
	if err := r.nextBlock(); err != nil {
		if err == io.EOF {
			err = fmt.Errorf("%w: no header block", ErrTruncated)
		}
		return nil, fmt.Errorf("read header: %w", err)
	}
	if r.pos >= len(r.block) || r.block[r.pos] != recHeader {
		return nil, errors.New("read header: first record is not a header")
	}
	r.pos++
	hj, err := r.bytes(maxRecordJSON)
	if err != nil {
		return nil, fmt.Errorf("read header: %w", err)
	}
	if err := json.Unmarshal(hj, &r.h); err != nil {
		return nil, fmt.Errorf("decode header: %w", err)
	}
	r.prevNanos = r.h.Start.UnixNano()
	return r, nil
}

// Header is the recording's header.
func (r *Reader) Header() Header { return r.h }

// Truncated reports whether the recording ended without its trailer (the
// writer was killed or stopped before Close). Meaningful once Next has
// returned an error.
func (r *Reader) Truncated() bool { return r.truncated }

// Stats returns the trailer's stats; ok is false until Next has reached the
// trailer, and stays false for a truncated recording.
func (r *Reader) Stats() (st Stats, ok bool) {
	if r.trailer == nil {
		return Stats{}, false
	}
	return r.trailer.Stats, true
}

// Threads returns per-thread metadata (pid, tid, name, sample count, first
// and last sample time) of the samples read so far. A renamed thread
// appears once per name.
func (r *Reader) Threads() []ThreadInfo {
	return append([]ThreadInfo(nil), r.threads...)
}

// Close closes the file opened by Open.
func (r *Reader) Close() error {
	if r.closer == nil {
		return nil
	}
	err := r.closer.Close()
	r.closer = nil
	return err
}

// nextBlock decodes the next gzip member into r.block. It returns io.EOF at
// a clean block boundary at the end of the file.
func (r *Reader) nextBlock() error {
	if _, err := r.br.Peek(1); err != nil {
		if err == io.EOF {
			return io.EOF
		}
		return fmt.Errorf("read block %d: %w", r.blockNum, err)
	}
	start := r.off - int64(r.br.Buffered())
	var err error
	if r.gz == nil {
		r.gz, err = gzip.NewReader(r.br)
	} else {
		err = r.gz.Reset(r.br)
	}
	if err == nil {
		r.gz.Multistream(false)
		buf := bytes.NewBuffer(r.block[:0])
		var n int64
		n, err = io.Copy(buf, io.LimitReader(r.gz, maxBlock+1))
		if err == nil && n > maxBlock {
			err = fmt.Errorf("block larger than %d bytes", maxBlock)
		}
		r.block = buf.Bytes()
	}
	if err != nil {
		r.block, r.pos = r.block[:0], 0
		if errors.Is(err, io.ErrUnexpectedEOF) || err == io.EOF {
			return fmt.Errorf("read block %d at offset %d: %w: %w", r.blockNum, start, ErrTruncated, err)
		}
		return fmt.Errorf("read block %d at offset %d: corrupt: %w", r.blockNum, start, err)
	}
	r.pos = 0
	r.blockNum++
	return nil
}

var errShort = errors.New("record runs past the end of its block")

func (r *Reader) uvarint() (uint64, error) { return readNum(r, binary.Uvarint) }

func (r *Reader) varint() (int64, error) { return readNum(r, binary.Varint) }

// readNum decodes the number at the reader's position with decode and moves
// past it.
func readNum[T uint64 | int64](r *Reader, decode func([]byte) (T, int)) (T, error) {
	v, n := decode(r.block[r.pos:])
	if n <= 0 {
		return 0, errShort
	}
	r.pos += n
	return v, nil
}

func (r *Reader) bytes(limit int) ([]byte, error) {
	n, err := r.uvarint()
	if err != nil {
		return nil, err
	}
	if n > uint64(limit) || n > uint64(len(r.block)-r.pos) {
		return nil, errShort
	}
	b := r.block[r.pos : r.pos+int(n)]
	r.pos += int(n)
	return b, nil
}

func (r *Reader) strRef() (string, error) {
	id, err := r.uvarint()
	if err != nil {
		return "", err
	}
	if id >= uint64(len(r.strs)) {
		return "", fmt.Errorf("string %d not defined", id)
	}
	return r.strs[id], nil
}

// maxKeptStacks bounds the threads whose last stack the reader keeps.
const maxKeptStacks = 4096

// lastStack is a thread's previous stack, as ids and as frames, and the
// frames' identity.
type lastStack struct {
	ids    []uint64
	frames []stack.Frame
	id     stack.ID
}

// Next returns the next sample. Its Frames may be shared with earlier
// samples of the same thread: they must not be modified (appending is
// fine: the slice is full). At the end it returns io.EOF; when the
// recording was cut at a block boundary, Truncated reports true. A
// recording torn inside a block, or corrupt, yields an error (wrapping
// ErrTruncated for a torn one) after the samples of every whole block
// before it. Every call after an error returns the same error.
func (r *Reader) Next() (stack.Sample, error) {
	for r.err == nil {
		if r.pos >= len(r.block) {
			if r.trailer != nil {
				r.err = io.EOF
				break
			}
			if err := r.nextBlock(); err != nil {
				r.truncated = true
				r.err = err
			}
			continue
		}
		kind := r.block[r.pos]
		r.pos++
		s, ok, err := r.record(kind)
		if err != nil {
			r.truncated = r.trailer == nil
			r.err = fmt.Errorf("decode block %d: %w", r.blockNum-1, err)
			break
		}
		if ok {
			return s, nil
		}
	}
	return stack.Sample{}, r.err
}

// Samples returns a sample source for output.Render that keeps what a
// damaged recording holds: it yields what Next yields, but where Next
// would return an error (a torn or corrupt block) it returns io.EOF, and
// Damage then reports that error.
func (r *Reader) Samples() func() (stack.Sample, error) {
	return func() (stack.Sample, error) {
		s, err := r.Next()
		if err != nil && err != io.EOF {
			return s, io.EOF
		}
		return s, err
	}
}

// Damage is the error that stopped reading before the end of the last
// whole block (a torn or corrupt block), or nil. A recording cut at a
// block boundary is not damaged, only Truncated.
func (r *Reader) Damage() error {
	if r.err == nil || r.err == io.EOF {
		return nil
	}
	return r.err
}

// record decodes one record of the given kind; ok reports a sample.
func (r *Reader) record(kind byte) (s stack.Sample, ok bool, err error) {
	switch kind {
	case recString:
		err = r.stringRecord()
	case recFrame:
		err = r.frameRecord()
	case recThread:
		err = r.threadRecord()
	case recSample:
		s, err = r.sampleRecord()
		return s, err == nil, err
	case recTrailer:
		err = r.trailerRecord()
	case recHeader:
		return s, false, errors.New("second header")
	default:
		return s, false, fmt.Errorf("unknown record kind %#x", kind)
	}
	return s, false, err
}

// stringRecord decodes a string record into the string table.
func (r *Reader) stringRecord() error {
	b, err := r.bytes(maxBlock)
	if err != nil {
		return err
	}
	if r.strBytes += len(b); r.strBytes > maxStringBytes {
		return fmt.Errorf("more than %d bytes of strings", maxStringBytes)
	}
	r.strs = append(r.strs, string(b))
	return nil
}

// frameRecord decodes a frame record into the frame table.
func (r *Reader) frameRecord() (err error) {
	var f stack.Frame
	if f.Name, err = r.strRef(); err != nil {
		return err
	}
	if f.Path, err = r.strRef(); err != nil {
		return err
	}
	if f.Line, err = r.lineNumber("line"); err != nil {
		return err
	}
	kind, err := r.strRef()
	if err != nil {
		return err
	}
	f.Kind = stack.Kind(kind)
	if r.version >= 2 {
		if f.InternalPath, err = r.strRef(); err != nil {
			return err
		}
		if f.InternalLine, err = r.lineNumber("internal line"); err != nil {
			return err
		}
	}
	r.frames = append(r.frames, f)
	return nil
}

// lineNumber decodes a frame's line number (what names it in errors).
func (r *Reader) lineNumber(what string) (int, error) {
	line, err := r.uvarint()
	if err != nil {
		return 0, err
	}
	if line > 1<<31-1 {
		return 0, fmt.Errorf("%s %d out of range", what, line)
	}
	return int(line), nil
}

// threadRecord decodes a thread record into the thread table.
func (r *Reader) threadRecord() error {
	pid, err := r.varint()
	if err != nil {
		return err
	}
	tid, err := r.varint()
	if err != nil {
		return err
	}
	name, err := r.strRef()
	if err != nil {
		return err
	}
	var id uint64
	if r.version >= 3 {
		if id, err = r.uvarint(); err != nil {
			return err
		}
	}
	r.threads = append(r.threads, ThreadInfo{Pid: int(pid), TID: int(tid), ThreadID: id, Name: name})
	r.last = append(r.last, lastStack{})
	return nil
}

// sampleRecord decodes a sample record, counting it in its thread's
// ThreadInfo.
func (r *Reader) sampleRecord() (s stack.Sample, err error) {
	d, err := r.varint()
	if err != nil {
		return s, err
	}
	r.prevNanos += d
	ti, err := r.uvarint()
	if err != nil {
		return s, err
	}
	if ti >= uint64(len(r.threads)) {
		return s, fmt.Errorf("thread %d not defined", ti)
	}
	if r.pos >= len(r.block) {
		return s, errShort
	}
	flags := r.block[r.pos]
	r.pos++
	n, err := r.uvarint()
	if err != nil {
		return s, err
	}
	if n > uint64(len(r.block)-r.pos) { // every frame id takes a byte at least
		return s, errShort
	}
	if n > MaxFrames {
		return s, fmt.Errorf("sample of %d frames, more than %d", n, MaxFrames)
	}
	ids := r.ids[:0]
	for range n {
		id, err := r.uvarint()
		if err != nil {
			return s, err
		}
		if id >= uint64(len(r.frames)) {
			return s, fmt.Errorf("frame %d not defined", id)
		}
		ids = append(ids, id)
	}
	r.ids = ids
	frames, id := r.stackOf(ti, ids)
	t := &r.threads[ti]
	s = stack.Sample{
		Time:       time.Unix(0, r.prevNanos),
		Pid:        t.Pid,
		TID:        t.TID,
		ThreadID:   t.ThreadID,
		ThreadName: t.Name,
		OnCPU:      flags&flagOnCPU != 0,
		Activity:   activityOf(flags),
		GVL:        flags&flagGVL != 0,
		Frames:     frames,
		Stack:      id,
	}
	if t.Samples == 0 {
		t.First = s.Time
	}
	t.Samples++
	t.Last = s.Time
	return s, nil
}

// stackOf returns the frames of ids, a sample of thread ti, and their
// identity: the thread's last stack when ids are its last ids, else a new
// slice with a new ID, kept as its last.
func (r *Reader) stackOf(ti uint64, ids []uint64) ([]stack.Frame, stack.ID) {
	last := &r.last[ti]
	frames := last.frames
	if frames == nil || !slices.Equal(ids, last.ids) {
		frames = make([]stack.Frame, len(ids))
		for i, id := range ids {
			frames[i] = r.frames[id]
		}
		if last.frames == nil {
			if r.kept >= maxKeptStacks {
				// Many threads (a recording of thread churn):
				// start over rather than keep a stack for each.
				clear(r.last)
				r.kept = 0
			}
			r.kept++
		}
		last.ids = append(last.ids[:0], ids...)
		last.frames, last.id = frames, stack.NewID()
	}
	return frames, last.id
}

// trailerRecord decodes the trailer; nothing may follow it.
func (r *Reader) trailerRecord() error {
	b, err := r.bytes(maxRecordJSON)
	if err != nil {
		return err
	}
	var tr trailer
	if err := json.Unmarshal(b, &tr); err != nil {
		return fmt.Errorf("decode trailer: %w", err)
	}
	r.trailer = &tr
	r.pos = len(r.block) // nothing may follow the trailer
	return nil
}

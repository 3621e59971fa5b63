package upload

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// meta describes one queued profile: everything the push needs but the
// profile itself.
type meta struct {
	Name    string `json:"name"`    // series name, "app{k=v}"
	From    int64  `json:"from"`    // interval start, unix nanoseconds
	Until   int64  `json:"until"`   // interval end, unix nanoseconds
	Rate    int    `json:"rate"`    // sample rate, Hz
	Samples int    `json:"samples"` // samples in the profile
}

// entry is one queued profile, in memory (data) or in the queue dir (path).
type entry struct {
	seq  uint64
	meta meta
	data []byte
	path string
	size int64
}

// queue is the FIFO of encoded profiles waiting to be pushed: memory
// first, then the queue dir, both capped; when neither has room the oldest
// entries go.
type queue struct {
	mu       sync.Mutex
	entries  []*entry
	memBytes int64
	dskBytes int64
	memCap   int64
	dskCap   int64
	dir      string
	nextSeq  uint64
	notify   chan struct{}
	diskErr  error    // last disk failure, reported once
	lock     *os.File // holds the queue dir's flock
	inflight *entry   // the entry being pushed, never dropped
	logf     func(string, ...any)
}

func newQueue(dir string, memCap, dskCap int64, logf func(string, ...any)) (*queue, error) {
	q := &queue{memCap: memCap, dskCap: dskCap, dir: dir, nextSeq: 1, notify: make(chan struct{}, 1), logf: logf}
	if dir == "" {
		return q, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create queue dir: %w", err)
	}
	// One uploader per directory: two would reuse each other's file
	// names and send each other's profiles twice.
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock queue dir: %w", err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		lock.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("queue dir %s is in use by another rbscope: give each its own", dir)
		}
		return nil, fmt.Errorf("lock queue dir: %w", err)
	}
	q.lock = lock
	if err := q.load(); err != nil {
		q.close()
		return nil, fmt.Errorf("load queue dir: %w", err)
	}
	return q, nil
}

// close releases the queue dir (its files stay).
func (q *queue) close() {
	if q.lock != nil {
		_ = q.lock.Close()
		q.lock = nil
	}
}

const (
	fileMagic   = "RBQ1"
	fileExt     = ".rbq"
	maxMetaSize = 64 << 10
)

// encodeEntry is a queue file's content: magic, little-endian uint32 meta
// length, JSON meta, profile.
func encodeEntry(m meta, data []byte) ([]byte, error) {
	j, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encode queue entry: %w", err)
	}
	b := make([]byte, 0, 8+len(j)+len(data))
	b = append(b, fileMagic...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(j)))
	b = append(b, j...)
	return append(b, data...), nil
}

// decodeEntry parses a queue file's content.
func decodeEntry(b []byte) (meta, []byte, error) {
	var m meta
	if len(b) < 8 || string(b[:4]) != fileMagic {
		return m, nil, errors.New("not a queue file")
	}
	n := binary.LittleEndian.Uint32(b[4:8])
	if n > maxMetaSize || uint64(n) > uint64(len(b)-8) {
		return m, nil, fmt.Errorf("queue file header length %d out of range", n)
	}
	if err := json.Unmarshal(b[8:8+n], &m); err != nil {
		return m, nil, fmt.Errorf("decode queue file header: %w", err)
	}
	if m.Name == "" || m.Rate <= 0 || m.Samples < 0 || m.Until < m.From {
		return m, nil, errors.New("queue file header incomplete")
	}
	return m, b[8+n:], nil
}

func (q *queue) fileName(seq uint64) string {
	return filepath.Join(q.dir, fmt.Sprintf("%020d%s", seq, fileExt))
}

// load adopts the profiles a previous run left in the queue dir, oldest
// first.
func (q *queue) load() error {
	des, err := os.ReadDir(q.dir)
	if err != nil {
		return err
	}
	type found struct {
		seq  uint64
		path string
	}
	var fs []found
	for _, de := range des {
		name := de.Name()
		if !strings.HasSuffix(name, fileExt) || !de.Type().IsRegular() {
			continue
		}
		seq, err := strconv.ParseUint(strings.TrimSuffix(name, fileExt), 10, 64)
		if err != nil {
			continue
		}
		fs = append(fs, found{seq, filepath.Join(q.dir, name)})
	}
	sort.Slice(fs, func(i, j int) bool { return fs[i].seq < fs[j].seq })
	for _, f := range fs {
		m, size, err := readMeta(f.path)
		if err != nil {
			q.logf("dropping unreadable queued profile %s: %v", f.path, err)
			_ = os.Remove(f.path)
			continue
		}
		q.entries = append(q.entries, &entry{seq: f.seq, meta: m, path: f.path, size: size})
		q.dskBytes += size
		q.nextSeq = f.seq + 1
	}
	return nil
}

func readMeta(path string) (meta, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return meta{}, 0, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return meta{}, 0, err
	}
	head := make([]byte, 8)
	if _, err := io.ReadFull(f, head); err != nil {
		return meta{}, 0, fmt.Errorf("read header: %w", err)
	}
	n := binary.LittleEndian.Uint32(head[4:])
	if n > maxMetaSize {
		return meta{}, 0, fmt.Errorf("header length %d out of range", n)
	}
	buf := make([]byte, 8+int(n))
	copy(buf, head)
	if _, err := io.ReadFull(f, buf[8:]); err != nil {
		return meta{}, 0, fmt.Errorf("read header: %w", err)
	}
	m, _, err := decodeEntry(buf)
	return m, st.Size(), err
}

// push appends a profile, dropping the oldest entries when neither memory
// nor disk has room. It returns what it dropped.
func (q *queue) push(m meta, data []byte) (dropped []meta) {
	q.mu.Lock()
	defer q.mu.Unlock()
	size := int64(len(data))
	e := &entry{seq: q.nextSeq, meta: m, size: size}
	q.nextSeq++
	for {
		if q.memBytes+size <= q.memCap {
			e.data = data
			q.memBytes += size
			break
		}
		if q.dir != "" && q.dskBytes+fileSize(m, data) <= q.dskCap {
			if err := q.writeFile(e, data); err == nil {
				q.dskBytes += e.size
				break
			} else if q.diskErr == nil {
				q.diskErr = err
				q.logf("cannot spill to queue dir, keeping profiles in memory only: %v", err)
			}
		}
		// Drop the oldest entry that is not being pushed right now (its
		// push may well succeed).
		victim := -1
		for i, x := range q.entries {
			if x != q.inflight {
				victim = i
				break
			}
		}
		if victim < 0 {
			return append(dropped, m) // larger than the whole queue
		}
		dropped = append(dropped, q.removeLocked(victim).meta)
	}
	q.entries = append(q.entries, e)
	select {
	case q.notify <- struct{}{}:
	default:
	}
	return dropped
}

func (q *queue) writeFile(e *entry, data []byte) error {
	b, err := encodeEntry(e.meta, data)
	if err != nil {
		return err
	}
	path := q.fileName(e.seq)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("write queue file: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("rename queue file: %w", err)
	}
	e.path = path
	e.size = int64(len(b))
	return nil
}

// removeLocked takes entry i out of the queue and frees its storage.
func (q *queue) removeLocked(i int) *entry {
	e := q.entries[i]
	q.entries = append(q.entries[:i], q.entries[i+1:]...)
	if e.data != nil {
		q.memBytes -= e.size
	} else {
		q.dskBytes -= e.size
		_ = os.Remove(e.path)
	}
	return e
}

// head returns the oldest entry, or nil.
func (q *queue) head() *entry {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.entries) == 0 {
		return nil
	}
	return q.entries[0]
}

// read returns an entry's profile.
func (q *queue) read(e *entry) ([]byte, error) {
	q.mu.Lock()
	data, path := e.data, e.path
	q.mu.Unlock()
	if data != nil {
		return data, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read queued profile: %w", err)
	}
	_, data, err = decodeEntry(b)
	if err != nil {
		return nil, fmt.Errorf("read queued profile %s: %w", path, err)
	}
	return data, nil
}

// begin marks e as being pushed; end clears the mark.
func (q *queue) begin(e *entry) {
	q.mu.Lock()
	q.inflight = e
	q.mu.Unlock()
}

func (q *queue) end() {
	q.mu.Lock()
	q.inflight = nil
	q.mu.Unlock()
}

// remove takes e out of the queue unless something else already did; it
// reports whether it did.
func (q *queue) remove(e *entry) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	for i, x := range q.entries {
		if x == e {
			q.removeLocked(i)
			return true
		}
	}
	return false
}

// spill moves every in-memory entry to the queue dir (at Close, so a later
// run sends them); it returns the entries it could not keep.
func (q *queue) spill() (lost []meta) {
	q.mu.Lock()
	defer q.mu.Unlock()
	kept := q.entries[:0]
	for _, e := range q.entries {
		if e.data == nil {
			kept = append(kept, e)
			continue
		}
		data := e.data
		if q.dir != "" && q.dskBytes+fileSize(e.meta, data) <= q.dskCap {
			if err := q.writeFile(e, data); err == nil {
				q.memBytes -= int64(len(data))
				q.dskBytes += e.size
				e.data = nil
				kept = append(kept, e)
				continue
			}
		}
		q.memBytes -= e.size
		lost = append(lost, e.meta)
	}
	q.entries = kept
	return lost
}

// stats returns the number of entries, their bytes and their samples.
func (q *queue) stats() (n int, size int64, samples int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, e := range q.entries {
		samples += int64(e.meta.Samples)
	}
	return len(q.entries), q.memBytes + q.dskBytes, samples
}

// fileSize is the size of the queue file holding m and data.
func fileSize(m meta, data []byte) int64 {
	j, err := json.Marshal(m)
	if err != nil {
		return 1 << 62
	}
	return int64(8 + len(j) + len(data))
}

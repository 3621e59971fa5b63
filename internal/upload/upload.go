package upload

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/pprof/profile"

	"github.com/rbscope/rbscope/internal/stack"
)

// Stats counts what an Uploader did with its samples and profiles.
type Stats struct {
	Samples        int64 // samples given to Add (before Close)
	Empty          int64 // samples with no frames, not pushed
	Pushed         int64 // profiles the server accepted
	PushedSamples  int64 // samples in them
	Retried        int64 // failed pushes that were tried again
	Rejected       int64 // profiles the server refused (4xx), not retried
	Dropped        int64 // profiles dropped: queue full, rejected, or unsent at Close
	DroppedSamples int64 // samples in them
	Queued         int   // profiles waiting to be pushed
	QueuedBytes    int64 // their size, memory and disk
	QueuedSamples  int64 // samples in them
}

// Uploader pushes samples to Pyroscope, one profile per interval. Its
// methods are safe for concurrent use.
type Uploader struct {
	cfg  Config
	name string
	q    *queue

	mu         sync.Mutex
	cur        *interval
	cut        []interval
	cutSamples int
	closed     bool
	lastStamp  time.Time // the last profile timestamp used
	// stamps are the last timestamps of AddProfileFor's series.
	stamps map[string]time.Time

	encWake  chan struct{}
	encStop  chan struct{}
	encDone  chan struct{}
	sendStop chan struct{} // closed when the sender should quit at once
	drain    chan struct{} // closed when the sender should quit once empty
	sendDone chan struct{}
	ctx      context.Context // cancels in-flight pushes
	cancel   context.CancelFunc
	once     sync.Once

	lastDropWarn time.Time   // guarded by mu
	abort        atomic.Bool // Close's deadline passed

	samples, empty, pushed, pushedSamples atomic.Int64
	retried, rejected                     atomic.Int64
	dropped, droppedSamples               atomic.Int64
}

// New validates cfg, adopts profiles a previous run left in cfg.QueueDir
// and starts pushing in the background. Credentials come from the
// environment (see the package comment).
func New(cfg Config) (*Uploader, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("upload config: %w", err)
	}
	q, err := newQueue(cfg.QueueDir, cfg.MaxMemoryBytes, cfg.MaxQueueBytes, cfg.Logf)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	u := &Uploader{
		cfg:      cfg,
		name:     seriesName(cfg.AppName, cfg.Tags),
		q:        q,
		encWake:  make(chan struct{}, 1),
		encStop:  make(chan struct{}),
		encDone:  make(chan struct{}),
		sendStop: make(chan struct{}),
		drain:    make(chan struct{}),
		sendDone: make(chan struct{}),
		ctx:      ctx,
		cancel:   cancel,
	}
	if n, _, _ := q.stats(); n > 0 {
		cfg.Logf("%d profiles left queued in %s by an earlier run: sending them first", n, cfg.QueueDir)
	}
	go u.encoder()
	go u.sender()
	return u, nil
}

// SeriesName is the ingest name profiles are pushed under:
// "app{hostname=...,k=v}".
func (u *Uploader) SeriesName() string { return u.name }

// Add queues one sample. It never blocks on the network or the disk; after
// Close it does nothing. The uploader keeps s.Frames until the sample's
// interval is encoded: the caller must not modify it afterwards.
func (u *Uploader) Add(s stack.Sample) {
	t := s.Time
	if t.IsZero() {
		t = time.Now()
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed {
		return
	}
	u.samples.Add(1)
	if u.cur == nil || !t.Before(u.cur.end) || len(u.cur.samples) >= u.cfg.MaxIntervalSamples {
		u.cutLocked()
		start := t.Truncate(u.cfg.Interval)
		// Pyroscope keeps one profile per series and timestamp (which
		// makes retries idempotent): a second profile of one interval (its
		// late samples, or the rest after an early cut) needs a timestamp
		// of its own, a millisecond being the server's resolution.
		stamp := t.Truncate(time.Millisecond)
		if !stamp.After(u.lastStamp) {
			stamp = u.lastStamp.Add(time.Millisecond)
		}
		u.lastStamp = stamp
		u.cur = &interval{start: start, end: start.Add(u.cfg.Interval), stamp: stamp}
	}
	u.cur.samples = append(u.cur.samples, s)
}

// cutLocked hands the current interval to the encoder.
func (u *Uploader) cutLocked() {
	if u.cur == nil || len(u.cur.samples) == 0 {
		u.cur = nil
		return
	}
	u.cut = append(u.cut, *u.cur)
	u.cutSamples += len(u.cur.samples)
	u.cur = nil
	// The encoder keeps up unless the machine is starved; bound the
	// backlog anyway.
	for len(u.cut) > 1 && u.cutSamples > 4*u.cfg.MaxIntervalSamples {
		n := len(u.cut[0].samples)
		u.cutSamples -= n
		u.cut = u.cut[1:]
		u.dropped.Add(1)
		u.droppedSamples.Add(int64(n))
		u.cfg.Logf("encoder backlog full: dropped an interval of %d samples", n)
	}
	select {
	case u.encWake <- struct{}{}:
	default:
	}
}

// encoder turns cut intervals into queued profiles, and cuts the current
// interval once the wall clock has passed its end.
func (u *Uploader) encoder() {
	defer close(u.encDone)
	tick := u.cfg.Interval / 4
	if tick > time.Second {
		tick = time.Second
	}
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		stop := false
		select {
		case <-u.encWake:
		case <-t.C:
			if !u.cfg.Replay {
				u.mu.Lock()
				if u.cur != nil && time.Since(u.cur.end) > tick {
					u.cutLocked()
				}
				u.mu.Unlock()
			}
		case <-u.encStop:
			stop = true
		}
		u.mu.Lock()
		if stop {
			u.cutLocked()
		}
		cut := u.cut
		u.cut, u.cutSamples = nil, 0
		u.mu.Unlock()
		for _, iv := range cut {
			if u.abort.Load() {
				// Close's deadline passed: no time left to encode.
				u.dropped.Add(1)
				u.droppedSamples.Add(int64(len(iv.samples)))
				continue
			}
			u.encode(iv)
		}
		if stop {
			return
		}
	}
}

func (u *Uploader) encode(iv interval) {
	data, n, err := encodeProfile(iv, u.cfg.SampleRate)
	u.empty.Add(int64(len(iv.samples) - n))
	if err != nil {
		u.dropped.Add(1)
		u.droppedSamples.Add(int64(n))
		u.cfg.Logf("dropping an interval: %v", err)
		return
	}
	if n == 0 {
		return
	}
	u.enqueue(meta{Name: u.name, From: iv.start.UnixNano(), Until: iv.end.UnixNano(), Rate: u.cfg.SampleRate, Samples: n}, data)
}

// AddProfile queues a finished profile covering [from, until), made
// elsewhere than from samples (rbscope alloc's allocation profile of one
// interval), to be pushed like the sampled intervals: in the background,
// retried while the server is down, kept in QueueDir. Its timestamp is
// set to from, moved on to stay unique per uploader (Pyroscope keeps one
// profile per series and timestamp). n is what Stats counts it as
// (samples, allocations). It never blocks on the network; after Close it
// does nothing.
func (u *Uploader) AddProfile(from, until time.Time, p *profile.Profile, n int) error {
	return u.addProfile(u.name, from, until, p, n)
}

// maxStamps bounds the series whose last timestamps an uploader keeps.
const maxStamps = 1 << 14

// addProfile queues p under series name, its timestamp moved on past the
// series' last one.
func (u *Uploader) addProfile(name string, from, until time.Time, p *profile.Profile, n int) error {
	u.mu.Lock()
	if u.closed {
		u.mu.Unlock()
		return nil
	}
	stamp := from.Truncate(time.Millisecond)
	if name == u.name {
		if !stamp.After(u.lastStamp) {
			stamp = u.lastStamp.Add(time.Millisecond)
		}
		u.lastStamp = stamp
	} else {
		if u.stamps == nil {
			u.stamps = map[string]time.Time{}
		}
		if last, ok := u.stamps[name]; ok && !stamp.After(last) {
			stamp = last.Add(time.Millisecond)
		}
		if len(u.stamps) >= maxStamps {
			// Series not pushed to for an hour are past Pyroscope's
			// ingestion window anyway.
			for k, t := range u.stamps {
				if time.Since(t) > time.Hour {
					delete(u.stamps, k)
				}
			}
		}
		u.stamps[name] = stamp
	}
	u.mu.Unlock()
	u.samples.Add(int64(n))
	p = p.Copy()
	p.TimeNanos = stamp.UnixNano()
	p.DurationNanos = until.Sub(from).Nanoseconds()
	var buf bytes.Buffer
	if err := p.Write(&buf); err != nil {
		u.dropped.Add(1)
		u.droppedSamples.Add(int64(n))
		return fmt.Errorf("encode profile: %w", err)
	}
	u.enqueue(meta{Name: name, From: from.UnixNano(), Until: until.UnixNano(), Rate: u.cfg.SampleRate, Samples: n}, buf.Bytes())
	return nil
}

// enqueue queues one encoded profile, dropping the oldest when the queue
// is full.
func (u *Uploader) enqueue(m meta, data []byte) {
	if u.cfg.backpressure {
		// PushRecording: wait for room rather than drop (Close's deadline
		// ends the wait).
		for !u.abort.Load() {
			qn, size, _ := u.q.stats()
			if qn == 0 || size+int64(len(data)) <= u.cfg.MaxMemoryBytes {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	if lost := u.q.push(m, data); len(lost) > 0 {
		var samples int64
		for _, l := range lost {
			samples += int64(l.Samples)
		}
		u.dropped.Add(int64(len(lost)))
		u.droppedSamples.Add(samples)
		u.mu.Lock()
		warn := time.Since(u.lastDropWarn) > 10*time.Second
		if warn {
			u.lastDropWarn = time.Now()
		}
		u.mu.Unlock()
		if warn {
			qn, qb, _ := u.q.stats()
			u.cfg.Logf("queue full (%d profiles, %d bytes): dropping the oldest profiles; %d profiles (%d samples) dropped so far",
				qn, qb, u.dropped.Load(), u.droppedSamples.Load())
		}
	}
}

// errPermanent marks a push the server refused for good.
type errPermanent struct{ err error }

func (e errPermanent) Error() string { return e.err.Error() }
func (e errPermanent) Unwrap() error { return e.err }

// sender pushes the queue's head until stopped, retrying with backoff.
func (u *Uploader) sender() {
	defer close(u.sendDone)
	attempt := 0
	down := false   // the last push failed
	warned := false // and the outage was reported
	var lastWarn, lastDownWarn time.Time
	draining := false
	var refused422 retries422
	for {
		e := u.q.head()
		if e == nil {
			if draining {
				return
			}
			select {
			case <-u.q.notify:
			case <-u.drain:
				draining = true
			case <-u.sendStop:
				return
			}
			continue
		}
		u.q.begin(e)
		data, err := u.q.read(e)
		if err != nil {
			u.q.end()
			if u.q.remove(e) {
				u.dropped.Add(1)
				u.droppedSamples.Add(int64(e.meta.Samples))
				u.cfg.Logf("dropping a queued profile: %v", err)
			}
			continue
		}
		err = u.push(e.meta, data)
		if err == nil {
			u.q.remove(e) // before end, so no push can drop it instead
			u.pushed.Add(1)
			u.pushedSamples.Add(int64(e.meta.Samples))
		}
		u.q.end()
		var perm errPermanent
		err = refused422.check(e, err)
		switch {
		case err == nil:
			if down && warned {
				n, _, _ := u.q.stats()
				u.cfg.Logf("server at %s is back: pushing again (%d profiles queued)", u.cfg.URL, n)
			}
			down, warned, attempt = false, false, 0
			continue
		case errors.As(err, &perm):
			if u.q.remove(e) {
				u.rejected.Add(1)
				u.dropped.Add(1)
				u.droppedSamples.Add(int64(e.meta.Samples))
			}
			if time.Since(lastWarn) > time.Minute || u.rejected.Load() == 1 {
				lastWarn = time.Now()
				u.cfg.Logf("server refused a profile, not retrying (%d refused so far): %v", u.rejected.Load(), err)
			}
			continue
		}
		select {
		case <-u.sendStop:
			return
		default:
		}
		u.retried.Add(1)
		// One warning a minute at most, however flaky the server.
		if time.Since(lastDownWarn) > time.Minute {
			n, _, _ := u.q.stats()
			verb := "cannot push to"
			if warned {
				verb = "still cannot push to"
			}
			u.cfg.Logf("%s %s (%v): keeping %d profiles queued and retrying; profiling goes on", verb, u.cfg.URL, err, n)
			lastDownWarn, warned = time.Now(), true
		}
		down = true
		t := time.NewTimer(backoff(attempt))
		attempt++
		select {
		case <-t.C:
		case <-u.sendStop:
			t.Stop()
			return
		}
	}
}

// backoff is the wait before retry number attempt: exponential from 250ms
// to 30s, with jitter over its upper half.
func backoff(attempt int) time.Duration {
	const base, maxWait = 250 * time.Millisecond, 30 * time.Second
	d := maxWait
	if attempt < 7 {
		d = min(base<<attempt, maxWait)
	}
	return d/2 + rand.N(d/2+1)
}

// push sends one profile to the ingest API.
func (u *Uploader) push(m meta, data []byte) error {
	q := url.Values{}
	q.Set("name", m.Name)
	q.Set("from", strconv.FormatInt(m.From/int64(time.Second), 10))
	q.Set("until", strconv.FormatInt((m.Until+int64(time.Second)-1)/int64(time.Second), 10))
	q.Set("sampleRate", strconv.Itoa(m.Rate))
	q.Set("spyName", "rbscope")
	q.Set("format", "pprof")
	ctx, cancel := context.WithTimeout(u.ctx, u.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.cfg.URL+"/ingest?"+q.Encode(), bytes.NewReader(data))
	if err != nil {
		return errPermanent{fmt.Errorf("build request: %w", err)}
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	u.cfg.auth.apply(req)
	resp, err := u.cfg.HTTPClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return nil
	}
	err = fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(body))
	switch {
	case resp.StatusCode == http.StatusUnprocessableEntity && bytes.Contains(body, []byte("invalid_argument")):
		// Pyroscope's validation failures (a profile outside its
		// ingestion window, too many labels) come as 422 invalid_argument.
		return errPermanent{err}
	case resp.StatusCode == http.StatusUnprocessableEntity:
		// Pyroscope answers 422 to every other ingest failure, transient
		// ones included ("empty ring" while it starts): retried, a few
		// times.
		return errTransient422{err}
	case resp.StatusCode >= 400 && resp.StatusCode < 500 &&
		resp.StatusCode != http.StatusRequestTimeout && resp.StatusCode != http.StatusTooManyRequests:
		return errPermanent{err}
	default:
		return err
	}
}

// errTransient422 is a 422 answer: retried at most max422Retries times.
type errTransient422 struct{ err error }

func (e errTransient422) Error() string { return e.err.Error() }
func (e errTransient422) Unwrap() error { return e.err }

// max422Retries bounds the retries of a 422 answer (about a minute of
// backoff): long enough for a starting server, short enough that a
// profile the server will never take does not hold up the queue.
const max422Retries = 8

// retries422 counts the 422 answers for the entry the last one was for.
type retries422 struct {
	last *entry // the entry the last 422 answer was for
	n    int
}

// check returns a push's error err for entry e, made permanent
// (errPermanent) when it is a 422 answer past the max422Retries retries
// of the same entry.
func (r *retries422) check(e *entry, err error) error {
	var e422 errTransient422
	if errors.As(err, &e422) {
		if e == r.last {
			r.n++
		} else {
			r.last, r.n = e, 1
		}
		if r.n > max422Retries {
			err = errPermanent{err}
		}
	}
	return err
}

// Stats returns the counters so far.
func (u *Uploader) Stats() Stats {
	n, size, samples := u.q.stats()
	return Stats{
		Samples:        u.samples.Load(),
		Empty:          u.empty.Load(),
		Pushed:         u.pushed.Load(),
		PushedSamples:  u.pushedSamples.Load(),
		Retried:        u.retried.Load(),
		Rejected:       u.rejected.Load(),
		Dropped:        u.dropped.Load(),
		DroppedSamples: u.droppedSamples.Load(),
		Queued:         n,
		QueuedBytes:    size,
		QueuedSamples:  samples,
	}
}

// Close stops accepting samples, pushes the last partial interval and
// everything queued, and returns when all is sent or ctx is done. What it
// could not send stays in QueueDir for the next run (or is dropped without
// one); the error says how much. Close is idempotent.
func (u *Uploader) Close(ctx context.Context) error {
	var err error
	u.once.Do(func() { err = u.close(ctx) })
	return err
}

func (u *Uploader) close(ctx context.Context) error {
	u.mu.Lock()
	u.closed = true
	u.mu.Unlock()
	close(u.encStop)
	select {
	case <-u.encDone:
	case <-ctx.Done():
	}
	close(u.drain)
	select {
	case <-u.sendDone:
	case <-ctx.Done():
	}
	close(u.sendStop)
	u.abort.Store(true)
	u.cancel()
	<-u.sendDone
	<-u.encDone
	defer u.q.close()
	n, _, samples := u.q.stats()
	if n == 0 {
		return nil
	}
	lost := u.q.spill()
	var lostSamples int64
	for _, l := range lost {
		lostSamples += int64(l.Samples)
	}
	u.dropped.Add(int64(len(lost)))
	u.droppedSamples.Add(lostSamples)
	kept := n - len(lost)
	switch {
	case len(lost) == 0:
		return fmt.Errorf("%d profiles (%d samples) not pushed in time: kept in %s for the next run", n, samples, u.cfg.QueueDir)
	case kept == 0:
		return fmt.Errorf("%d profiles (%d samples) not pushed in time: dropped", n, samples)
	default:
		return fmt.Errorf("%d profiles (%d samples) not pushed in time: %d kept in %s, %d dropped", n, samples, kept, u.cfg.QueueDir, len(lost))
	}
}

package recording

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/rbscope/rbscope/internal/stack"
	"github.com/rbscope/rbscope/internal/testutil"
)

var t0 = time.Date(2026, 11, 21, 8, 30, 0, 123456789, time.UTC)

// sampleN is the deterministic i-th sample of the synthetic recordings: two
// processes, three threads (one renamed half-way), stacks of varying depth
// mixing ruby, cfunc and gc frames, some empty.
func sampleN(i int) stack.Sample {
	tid := 100 + i%3
	name := []string{"main", "alpha-worker", "beta"}[i%3]
	if tid == 102 && i > 30 {
		name = "beta-renamed"
	}
	pid := 4242
	if i%7 == 0 {
		pid = 4343
	}
	var frames []stack.Frame
	depth := i % 6
	for d := 0; d < depth; d++ {
		frames = append(frames, stack.Frame{
			Name: fmt.Sprintf("Outer::Inner#level%d", (i+d)%4),
			Path: "/app/lib/outer.rb",
			Line: 10 + (i+d)%5,
			Kind: stack.KindRuby,
		})
	}
	if depth > 0 && i%5 == 3 {
		// A method defined inside Ruby, shown at its caller's place.
		frames[0].InternalPath, frames[0].InternalLine = "<internal:kernel>", 180+i%7
	}
	if depth > 0 && i%4 == 0 {
		frames = append([]stack.Frame{{Name: "Array#each", Path: "/app/lib/outer.rb", Line: 11, Kind: stack.KindCFunc}}, frames...)
	}
	if i%11 == 5 {
		frames = append([]stack.Frame{{Name: "(garbage collection)", Kind: stack.KindGC}}, frames...)
	}
	if depth > 0 {
		frames = append(frames, stack.Frame{Name: "<main>", Path: "/app/main.rb", Line: 3, Kind: stack.KindRuby})
	}
	// Times go mostly forward, sometimes back a little (threads sampled
	// out of order), and span more than a second.
	dt := time.Duration(i)*10*time.Millisecond + time.Duration(i%3)*time.Microsecond - time.Duration(i%5)*3*time.Millisecond
	// Ruby threads keep their identity; alpha-worker (M:N) has no
	// native thread at times.
	id := uint64(0x55d0_c8a3_b000 + tid*0x400)
	if tid == 101 && i%10 == 1 && i >= 60 { // past testdata/v1.raw.gz
		tid = 0
	}
	return stack.Sample{
		Time:       t0.Add(dt),
		Pid:        pid,
		TID:        tid,
		ThreadID:   id,
		ThreadName: name,
		OnCPU:      i%2 == 0,
		Activity:   append([]stack.Activity{""}, stack.Activities...)[i%(len(stack.Activities)+1)],
		GVL:        i%3 == 0,
		Frames:     frames,
	}
}

func testHeader() Header {
	return Header{
		RateHz:         100,
		Start:          t0,
		RbscopeVersion: "0.1.0-test",
		Pids:           []int{4242, 4343},
		Command:        []string{"ruby", "app.rb", "--port", "8080"},
		RubyVersion:    "3.1.2",
		LayoutSource:   "builtin:3.1.2",
		Hostname:       "testhost",
		Options:        map[string]string{"on_cpu": "false"},
	}
}

func sameSample(t *testing.T, i int, got, want stack.Sample) {
	t.Helper()
	if !got.Time.Equal(want.Time) {
		t.Fatalf("sample %d: time %v, want %v", i, got.Time, want.Time)
	}
	got.Time, want.Time = time.Time{}, time.Time{}
	got.Stack, want.Stack = 0, 0 // the reader's own (TestStackIDs)
	if len(got.Frames) == 0 && len(want.Frames) == 0 {
		got.Frames, want.Frames = nil, nil
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("sample %d:\n got %+v\nwant %+v", i, got, want)
	}
}

// TestStackIDs writes stacks with the IDs a walker gives (repeated, changed,
// back to an earlier one under a new ID, a stack without an ID, one slice
// shared by two threads), and reads them back: every sample keeps its
// frames, and the reader gives a thread's sample the ID of its previous
// one exactly when its frames are the same.
func TestStackIDs(t *testing.T) {
	f := func(name string, line int) stack.Frame {
		return stack.Frame{Name: name, Path: "/s.rb", Line: line, Kind: stack.KindRuby}
	}
	a := []stack.Frame{f("Object#a", 1), f("<main>", 9)}
	b := []stack.Frame{f("Object#b", 2), f("Object#a", 1), f("<main>", 9)}
	c := []stack.Frame{f("Object#c", 3), f("<main>", 9)}
	ida, idb := stack.NewID(), stack.NewID()
	scratch := slices.Clone(c)
	type in struct {
		tid    int
		frames []stack.Frame
		id     stack.ID
	}
	seq := []in{
		{1, a, ida}, {1, a, ida}, {2, a, ida}, {1, b, idb}, {1, slices.Clone(a), stack.NewID()},
		{1, scratch, 0}, {2, a, ida}, {2, b, idb}, {1, scratch, 0}, {1, a, ida},
	}
	path := filepath.Join(t.TempDir(), "ids.raw.gz")
	w, err := Create(path, testHeader())
	if err != nil {
		t.Fatal(err)
	}
	var want []stack.Sample
	for i, x := range seq {
		s := stack.Sample{Time: t0.Add(time.Duration(i) * time.Millisecond), Pid: 5, TID: x.tid, ThreadName: "t", Frames: x.frames, Stack: x.id}
		want = append(want, s)
		want[i].Frames = slices.Clone(x.frames)
		if err := w.Add(s); err != nil {
			t.Fatal(err)
		}
		if x.id == 0 {
			// The caller reuses its slice: the writer must have kept
			// a copy of a stack without an ID.
			copy(scratch, []stack.Frame{f("Object#d", 4), f("<main>", 9)})
		}
	}
	if err := w.Close(Stats{Samples: int64(len(seq))}); err != nil {
		t.Fatal(err)
	}
	r, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	last := map[int]stack.Sample{}
	for i := range seq {
		got, err := r.Next()
		if err != nil {
			t.Fatalf("sample %d: %v", i, err)
		}
		if !slices.Equal(got.Frames, want[i].Frames) {
			t.Fatalf("sample %d: frames %v, want %v", i, got.Frames, want[i].Frames)
		}
		if got.Stack == 0 {
			t.Errorf("sample %d: no stack ID", i)
		}
		if p, ok := last[got.TID]; ok && (p.Stack == got.Stack) != slices.Equal(p.Frames, got.Frames) {
			t.Errorf("sample %d (tid %d): ID %d after %d, frames %v after %v", i, got.TID, got.Stack, p.Stack, got.Frames, p.Frames)
		}
		last[got.TID] = got
	}
}

func TestRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "rec.raw.gz")
	w, err := Create(path, testHeader())
	if err != nil {
		t.Fatal(err)
	}
	w.FlushSamples = 17 // several blocks
	const n = 200
	for i := 0; i < n; i++ {
		if err := w.Add(sampleN(i)); err != nil {
			t.Fatal(err)
		}
	}
	end := t0.Add(3 * time.Second)
	torn := []TornThread{{Pid: 4242, TID: 101, Name: "alpha-worker", Torn: 3, Samples: 60, GVL: 50}}
	if err := w.Close(Stats{Samples: 999, Late: 4, Errors: map[string]int64{"exited": 1, "read": 2}, End: end, Torn: torn}); err != nil {
		t.Fatal(err)
	}
	if err := w.Add(sampleN(0)); err == nil {
		t.Fatal("Add after Close succeeded")
	}

	r, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if h := r.Header(); !reflect.DeepEqual(h.Command, testHeader().Command) || !h.Start.Equal(t0) ||
		h.RateHz != 100 || h.RubyVersion != "3.1.2" || h.LayoutSource != "builtin:3.1.2" ||
		h.Hostname != "testhost" || !reflect.DeepEqual(h.Pids, []int{4242, 4343}) || h.Options["on_cpu"] != "false" {
		t.Fatalf("header %+v", h)
	}
	if _, ok := r.Stats(); ok {
		t.Fatal("Stats ok before the trailer was read")
	}
	for i := 0; i < n; i++ {
		s, err := r.Next()
		if err != nil {
			t.Fatalf("sample %d: %v", i, err)
		}
		sameSample(t, i, s, sampleN(i))
	}
	if _, err := r.Next(); err != io.EOF {
		t.Fatalf("after the last sample: %v, want io.EOF", err)
	}
	if r.Truncated() {
		t.Fatal("cleanly closed recording reported truncated")
	}
	st, ok := r.Stats()
	if !ok || st.Samples != n || st.Late != 4 || st.Errors["exited"] != 1 || st.Errors["read"] != 2 || !st.End.Equal(end) || !reflect.DeepEqual(st.Torn, torn) {
		t.Fatalf("stats %+v ok=%v", st, ok)
	}
	// Threads: 3 tids x pids seen, plus the renamed one.
	var beta, renamed ThreadInfo
	for _, ti := range r.Threads() {
		if ti.TID == 102 && ti.Pid == 4242 && ti.Name == "beta" {
			beta = ti
		}
		if ti.TID == 102 && ti.Pid == 4242 && ti.Name == "beta-renamed" {
			renamed = ti
		}
	}
	// tid 102 at i%3==2, pid 4242 unless i%7==0; renamed after i>30.
	var wantBeta, wantRenamed int64
	for i := 0; i < n; i++ {
		if i%3 == 2 && i%7 != 0 {
			if i > 30 {
				wantRenamed++
			} else {
				wantBeta++
			}
		}
	}
	if beta.Samples != wantBeta || renamed.Samples != wantRenamed || !beta.First.Equal(sampleN(2).Time) || !renamed.Last.Equal(sampleN(197).Time) {
		t.Fatalf("threads beta=%+v renamed=%+v, want %d and %d samples", beta, renamed, wantBeta, wantRenamed)
	}
}

// buildSmall writes a recording of n samples flushed every `every` samples
// and returns its bytes and the file size after each block.
func buildSmall(t testing.TB, n, every int) (data []byte, boundaries []int64) {
	path := filepath.Join(t.TempDir(), "small.raw.gz")
	w, err := Create(path, testHeader())
	if err != nil {
		t.Fatal(err)
	}
	w.FlushSamples = 1 << 30
	w.FlushInterval = time.Hour
	size := func() int64 {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	boundaries = append(boundaries, size())
	for i := 0; i < n; i++ {
		if err := w.Add(sampleN(i)); err != nil {
			t.Fatal(err)
		}
		if (i+1)%every == 0 {
			if err := w.Flush(); err != nil {
				t.Fatal(err)
			}
			boundaries = append(boundaries, size())
		}
	}
	if err := w.Close(Stats{Late: 1}); err != nil {
		t.Fatal(err)
	}
	data, err = os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data, boundaries
}

func TestTruncatedAtEveryOffset(t *testing.T) {
	const n, every = 12, 4
	data, bounds := buildSmall(t, n, every)
	// bounds[0] ends the header block, bounds[k] ends the block with
	// samples [0, k*every).
	for cut := 0; cut <= len(data); cut++ {
		r, err := NewReader(bytes.NewReader(data[:cut]))
		if cut < int(bounds[0]) {
			if err == nil || !strings.Contains(err.Error(), "truncated") {
				t.Fatalf("cut %d inside the header: err %v, want a truncated error", cut, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("cut %d: %v", cut, err)
		}
		var got int
		for {
			s, err := r.Next()
			if err != nil {
				whole := 0 // samples in whole blocks before the cut
				boundary := false
				for k, b := range bounds {
					if int64(cut) >= b {
						whole = k * every
					}
					boundary = boundary || int64(cut) == b
				}
				switch {
				case cut == len(data):
					if err != io.EOF || r.Truncated() || got != n {
						t.Fatalf("whole file: err %v truncated %v, %d samples", err, r.Truncated(), got)
					}
					if st, ok := r.Stats(); !ok || st.Samples != n || st.Late != 1 {
						t.Fatalf("whole file: stats %+v %v", st, ok)
					}
				case boundary:
					if err != io.EOF || !r.Truncated() || got != whole {
						t.Fatalf("cut %d at a block boundary: err %v truncated %v, %d samples, want io.EOF, true, %d", cut, err, r.Truncated(), got, whole)
					}
				default:
					if !errors.Is(err, ErrTruncated) || !strings.Contains(err.Error(), "truncated") || !r.Truncated() || got != whole {
						t.Fatalf("cut %d inside a block: err %v truncated %v, %d samples, want ErrTruncated, true, %d", cut, err, r.Truncated(), got, whole)
					}
				}
				if _, err2 := r.Next(); err2 != err {
					t.Fatalf("cut %d: second call gave %v after %v", cut, err2, err)
				}
				break
			}
			sameSample(t, got, s, sampleN(got))
			got++
		}
	}
}

func TestNotARecording(t *testing.T) {
	for _, in := range []string{"", "RBSC", "hello world, not a recording", Magic + "\x09\x00\x00\x00", Magic + "\x00\x00\x00\x00"} {
		if _, err := NewReader(strings.NewReader(in)); err == nil {
			t.Fatalf("%q: no error", in)
		}
	}
	// Shorter than the magic: another file says so, the start of a
	// recording is a truncated one.
	if _, err := NewReader(strings.NewReader("hello\n")); err == nil || !strings.Contains(err.Error(), "not an rbscope recording") {
		t.Errorf("6-byte text file: %v", err)
	}
	if _, err := NewReader(strings.NewReader(Magic[:5])); !errors.Is(err, ErrTruncated) {
		t.Errorf("the first 5 bytes of a recording: %v, want ErrTruncated", err)
	}
	_, err := NewReader(strings.NewReader(Magic + "\x09\x00\x00\x00"))
	if err == nil || !strings.Contains(err.Error(), "version 9") {
		t.Fatalf("version error %v", err)
	}
	if _, err := Open(filepath.Join(t.TempDir(), "missing.raw.gz")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
}

// asV1 is what a version 1 recording holds of s: no internal paths, no
// Ruby thread ids.
func asV1(s stack.Sample) stack.Sample {
	s.ThreadID = 0
	fs := slices.Clone(s.Frames)
	for i := range fs {
		fs[i].InternalPath, fs[i].InternalLine = "", 0
	}
	s.Frames = fs
	return s
}

// TestReadsVersion1: testdata/v1.raw.gz was written by the version 1
// writer (rbscope before internal paths) from sampleN(0..59); it still
// reads, whole.
func TestReadsVersion1(t *testing.T) {
	r, err := Open("testdata/v1.raw.gz")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	n := 0
	for {
		s, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("sample %d: %v", n, err)
		}
		sameSample(t, n, s, asV1(sampleN(n)))
		n++
	}
	if st, ok := r.Stats(); n != 60 || !ok || st.Samples != 60 || r.Truncated() {
		t.Fatalf("%d samples, stats %+v (ok %v), truncated %v", n, st, ok, r.Truncated())
	}
}

// TestClaimDefault: two recordings of one process started in the same
// second get two files, each named for the time and pid, readable by
// others as Create makes them; a claimed file cannot be claimed again
// until it is released, and released empty it is gone.
func TestClaimDefault(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	a, releaseA, err := ClaimDefault(4242, start)
	if err != nil {
		t.Fatal(err)
	}
	b, releaseB, err := ClaimDefault(4242, start)
	if err != nil {
		t.Fatal(err)
	}
	name := regexp.MustCompile(`^rbscope-20260102-030405-4242-[0-9]+\.raw\.gz$`)
	for _, p := range []string{a, b} {
		if filepath.Dir(p) != DefaultDir() || !name.MatchString(filepath.Base(p)) {
			t.Errorf("path %s, want %s/rbscope-20260102-030405-4242-*.raw.gz", p, DefaultDir())
		}
		if st, err := os.Stat(p); err != nil || st.Mode().Perm() != 0o644 {
			t.Errorf("%s: %v %v, want mode 0644", p, st, err)
		}
	}
	if a == b {
		t.Fatalf("both recordings got %s", a)
	}
	if _, err := Claim(a); !errors.Is(err, ErrInUse) {
		t.Errorf("claim of a claimed file: %v, want ErrInUse", err)
	}
	w, err := Create(a, Header{RateHz: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Close(Stats{}); err != nil {
		t.Fatal(err)
	}
	releaseA()
	releaseB()
	if _, err := os.Stat(b); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("released empty, %s is still there: %v", b, err)
	}
	release, err := Claim(a)
	if err != nil {
		t.Fatalf("claim after release: %v", err)
	}
	release()
	if _, err := Open(a); err != nil {
		t.Errorf("a released recording that was written is gone or broken: %v", err)
	}
}

// TestClaimProcesses: a file claimed by another process (an rbscope
// record writing it) cannot be claimed, and can once that process is gone;
// CheckFree says as much without claiming it.
func TestClaimProcesses(t *testing.T) {
	path := filepath.Join(t.TempDir(), "r.raw.gz")
	if err := os.WriteFile(path, []byte("an older recording"), 0o644); err != nil {
		t.Fatal(err)
	}
	holder := exec.Command("flock", "--no-fork", "--exclusive", path, "sleep", "60")
	if err := holder.Start(); err != nil {
		testutil.Missing(t, "flock(1) (util-linux): %v", err)
	}
	t.Cleanup(func() { holder.Process.Kill(); holder.Wait() })
	deadline := time.Now().Add(5 * time.Second)
	for {
		release, err := Claim(path)
		if errors.Is(err, ErrInUse) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		release()
		if time.Now().After(deadline) {
			t.Fatal("flock(1) never took the file")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := CheckFree(path); !errors.Is(err, ErrInUse) {
		t.Errorf("CheckFree of a held file: %v, want ErrInUse", err)
	}
	holder.Process.Kill()
	holder.Wait()
	if err := CheckFree(path); err != nil {
		t.Errorf("CheckFree once the other process is gone: %v", err)
	}
	release, err := Claim(path)
	if err != nil {
		t.Fatalf("claim once the other process is gone: %v", err)
	}
	release()
}

// TestKilledWriter re-executes the test binary as a writer that records
// forever, SIGKILLs it once it has flushed some blocks, and reads what it
// left.
func TestKilledWriter(t *testing.T) {
	if p := os.Getenv("RBSCOPE_RECORDING_CHILD"); p != "" {
		childWriter(p)
		return
	}
	path := filepath.Join(t.TempDir(), "killed.raw.gz")
	cmd := exec.Command(os.Args[0], "-test.run=^TestKilledWriter$", "-test.count=1")
	cmd.Env = append(os.Environ(), "RBSCOPE_RECORDING_CHILD="+path)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	sc := bufio.NewScanner(out)
	flushed := 0
	for sc.Scan() && flushed < 20 {
		flushed, _ = strconv.Atoi(sc.Text())
	}
	if flushed < 20 {
		t.Fatalf("child stopped after %d blocks: %v", flushed, sc.Err())
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	go io.Copy(io.Discard, out)
	cmd.Wait()

	r, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	got := 0
	for {
		s, err := r.Next()
		if err != nil {
			if err != io.EOF && !errors.Is(err, ErrTruncated) {
				t.Fatalf("after %d samples: %v", got, err)
			}
			break
		}
		sameSample(t, got, s, sampleN(got))
		got++
	}
	if !r.Truncated() {
		t.Fatal("killed recording not reported truncated")
	}
	if got < 20*10 {
		t.Fatalf("read %d samples, want at least the 200 of the 20 blocks the child reported", got)
	}
	t.Logf("read %d samples from the killed writer", got)
}

func childWriter(path string) {
	w, err := Create(path, testHeader())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	w.FlushSamples = 10
	for i := 0; ; i++ {
		if err := w.Add(sampleN(i)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		if (i+1)%10 == 0 {
			fmt.Println((i + 1) / 10)
		}
	}
}

func FuzzRead(f *testing.F) {
	data, _ := buildSmall(f, 12, 4)
	f.Add(data)
	f.Add(data[:len(data)/2])
	f.Add([]byte(Magic + "\x01\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, in []byte) {
		r, err := NewReader(bytes.NewReader(in))
		if err != nil {
			return
		}
		r.Header()
		for i := 0; i < 1<<16; i++ {
			if _, err := r.Next(); err != nil {
				break
			}
		}
		r.Stats()
		r.Threads()
		r.Truncated()
	})
}

func TestTimedFlush(t *testing.T) {
	path := filepath.Join(t.TempDir(), "idle.raw.gz")
	w, err := Create(path, testHeader())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close(Stats{})
	w.FlushSamples, w.FlushInterval = 1<<20, 50*time.Millisecond
	for i := 0; i < 3; i++ {
		if err := w.Add(sampleN(i)); err != nil {
			t.Fatal(err)
		}
	}
	// No further Add: the timer must write the block.
	deadline := time.Now().Add(10 * time.Second)
	for {
		r, err := Open(path)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for ; ; n++ {
			if _, err := r.Next(); err != nil {
				break
			}
		}
		r.Close()
		if n == 3 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 10 s idle, %d of 3 samples on disk", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// benchSamples are 1024 samples of 50-frame stacks on four threads: the
// outer 45 frames are the thread's own, the inner 5 change every sample,
// drawn from 300 names (strings shared, as the walker's caches give).
func benchSamples() []stack.Sample {
	names := make([]string, 300)
	for i := range names {
		names[i] = fmt.Sprintf("Module%d::Klass#method_%d", i%7, i)
	}
	out := make([]stack.Sample, 1024)
	for i := range out {
		fr := make([]stack.Frame, 50)
		for d := range fr {
			v := i % 4 // the thread: outer frames are its own
			if d < 5 {
				v = i % 37 // inner frames change from sample to sample
			}
			fr[d] = stack.Frame{
				Name: names[(d*37+v)%len(names)],
				Path: fmt.Sprintf("/app/lib/module_%d.rb", (d+v)%7),
				Line: 10 + d + v%5, Kind: stack.KindRuby,
			}
		}
		out[i] = stack.Sample{Time: t0.Add(time.Duration(i) * 10 * time.Millisecond), Pid: 4242, TID: 100 + i%4, ThreadName: "puma worker", OnCPU: i%2 == 0, Frames: fr}
	}
	return out
}

// BenchmarkWrite compares writing a sample to a raw recording with
// writing it as a line of encoding/json to a buffered file (the baseline),
// both to a file in a temporary directory; bytes/sample is the file size.
func BenchmarkWrite(b *testing.B) {
	samples := benchSamples()
	b.Run("raw", func(b *testing.B) {
		path := filepath.Join(b.TempDir(), "bench.raw.gz")
		w, err := Create(path, testHeader())
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		n := 0
		for b.Loop() {
			if err := w.Add(samples[n%len(samples)]); err != nil {
				b.Fatal(err)
			}
			n++
		}
		if err := w.Close(Stats{}); err != nil {
			b.Fatal(err)
		}
		fi, _ := os.Stat(path)
		b.ReportMetric(float64(fi.Size())/float64(n), "bytes/sample")
	})
	b.Run("json", func(b *testing.B) {
		path := filepath.Join(b.TempDir(), "bench.json")
		f, err := os.Create(path)
		if err != nil {
			b.Fatal(err)
		}
		bw := bufio.NewWriterSize(f, 64<<10)
		enc := json.NewEncoder(bw)
		b.ReportAllocs()
		n := 0
		for b.Loop() {
			if err := enc.Encode(samples[n%len(samples)]); err != nil {
				b.Fatal(err)
			}
			n++
		}
		bw.Flush()
		f.Close()
		fi, _ := os.Stat(path)
		b.ReportMetric(float64(fi.Size())/float64(n), "bytes/sample")
	})
}

// BenchmarkRead is the cost of reading back one sample of BenchmarkWrite's.
func BenchmarkRead(b *testing.B) {
	samples := benchSamples()
	path := filepath.Join(b.TempDir(), "bench.raw.gz")
	w, err := Create(path, testHeader())
	if err != nil {
		b.Fatal(err)
	}
	for i := 0; i < 20000; i++ {
		w.Add(samples[i%len(samples)])
	}
	w.Close(Stats{})
	b.ReportAllocs()
	var r *Reader
	for b.Loop() {
		if r == nil {
			if r, err = Open(path); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := r.Next(); err != nil {
			r.Close()
			r = nil
		}
	}
}

func TestSamplesKeepsPrefix(t *testing.T) {
	data, bounds := buildSmall(t, 12, 4)
	for _, c := range []struct {
		cut     int
		n       int
		damaged bool
	}{
		{len(data), 12, false},
		{int(bounds[2]), 8, false},    // at a block boundary
		{int(bounds[2]) + 7, 8, true}, // inside block 3
		{int(bounds[1]) - 1, 0, true}, // inside block 1 (its gzip trailer)
	} {
		r, err := NewReader(bytes.NewReader(data[:c.cut]))
		if err != nil {
			t.Fatal(err)
		}
		next := r.Samples()
		n := 0
		for {
			s, err := next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("cut %d: Samples returned %v", c.cut, err)
			}
			sameSample(t, n, s, sampleN(n))
			n++
		}
		if n != c.n || (r.Damage() != nil) != c.damaged || (c.damaged && !errors.Is(r.Damage(), ErrTruncated)) {
			t.Fatalf("cut %d: %d samples, damage %v; want %d, damaged %v", c.cut, n, r.Damage(), c.n, c.damaged)
		}
	}
}

// TestRepeatedStacksShared reads back a thread's repeated stack as one
// shared slice, and every stack with its own frames.
func TestRepeatedStacksShared(t *testing.T) {
	fr := func(names ...string) []stack.Frame {
		var out []stack.Frame
		for i, n := range names {
			out = append(out, stack.Frame{Name: n, Path: "/app/x.rb", Line: i + 1, Kind: stack.KindRuby})
		}
		return out
	}
	a, b := fr("Object#leaf", "Object#mid", "<main>"), fr("Object#other", "Object#mid", "<main>")
	t0 := time.Unix(1700000000, 0)
	in := []stack.Sample{
		{Time: t0, Pid: 1, TID: 10, Frames: a},
		{Time: t0.Add(time.Millisecond), Pid: 1, TID: 10, Frames: a},
		{Time: t0.Add(2 * time.Millisecond), Pid: 1, TID: 11, Frames: a},
		{Time: t0.Add(3 * time.Millisecond), Pid: 1, TID: 10, Frames: b},
		{Time: t0.Add(4 * time.Millisecond), Pid: 1, TID: 10, Frames: a},
		{Time: t0.Add(5 * time.Millisecond), Pid: 1, TID: 10, Frames: a[1:]},
	}
	r := writeAndOpen(t, in)
	var out []stack.Sample
	for {
		s, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	if len(out) != len(in) {
		t.Fatalf("%d samples read, want %d", len(out), len(in))
	}
	for i := range in {
		if out[i].TID != in[i].TID || !slices.Equal(out[i].Frames, in[i].Frames) {
			t.Errorf("sample %d: tid %d %v, want tid %d %v", i, out[i].TID, out[i].Frames, in[i].TID, in[i].Frames)
		}
		if len(out[i].Frames) != cap(out[i].Frames) {
			t.Errorf("sample %d: frames not full (len %d, cap %d): an append would write into a shared array", i, len(out[i].Frames), cap(out[i].Frames))
		}
	}
	same := func(i, j int) bool { return unsafe.SliceData(out[i].Frames) == unsafe.SliceData(out[j].Frames) }
	if !same(0, 1) {
		t.Error("a thread's repeated stack was not shared")
	}
	for _, p := range [][2]int{{0, 2}, {1, 3}, {3, 4}, {4, 5}} {
		if same(p[0], p[1]) {
			t.Errorf("samples %d and %d share frames: another thread's or another stack's", p[0], p[1])
		}
	}
}

// TestKeptStacksBounded reads a recording of more threads than the
// reader keeps stacks for: every sample comes back right, and the kept
// stacks stay bounded.
func TestKeptStacksBounded(t *testing.T) {
	t0 := time.Unix(1700000000, 0)
	n := maxKeptStacks + 100
	frames := func(i int) []stack.Frame {
		return []stack.Frame{{Name: "Object#job_" + strconv.Itoa(i%7), Path: "/app/j.rb", Line: i % 13, Kind: stack.KindRuby},
			{Name: "<main>", Path: "/app/j.rb", Line: 1, Kind: stack.KindRuby}}
	}
	var in []stack.Sample
	for i := 0; i < n; i++ {
		for k := 0; k < 2; k++ {
			in = append(in, stack.Sample{Time: t0.Add(time.Duration(2*i+k) * time.Millisecond), Pid: 1, TID: 1000 + i, Frames: frames(i)})
		}
	}
	r := writeAndOpen(t, in)
	for i := 0; i < 2*n; i++ {
		s, err := r.Next()
		if err != nil {
			t.Fatalf("sample %d: %v", i, err)
		}
		if want := frames(i / 2); s.TID != 1000+i/2 || !slices.Equal(s.Frames, want) {
			t.Fatalf("sample %d: tid %d %v, want tid %d %v", i, s.TID, s.Frames, 1000+i/2, want)
		}
		if r.kept > maxKeptStacks {
			t.Fatalf("sample %d: %d stacks kept, more than %d", i, r.kept, maxKeptStacks)
		}
	}
	if _, err := r.Next(); err != io.EOF {
		t.Fatalf("after the last sample: %v", err)
	}
}

// writeAndOpen writes samples to a new recording and opens it for
// reading (closed when the test ends).
func writeAndOpen(t *testing.T, samples []stack.Sample) *Reader {
	t.Helper()
	path := filepath.Join(t.TempDir(), "r.raw.gz")
	w, err := Create(path, testHeader())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range samples {
		if err := w.Add(s); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(Stats{}); err != nil {
		t.Fatal(err)
	}
	r, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

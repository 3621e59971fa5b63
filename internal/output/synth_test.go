package output

import (
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/stack"
)

var t0 = time.Date(2026, 11, 21, 8, 30, 0, 0, time.UTC)

const (
	appFile    = "/app/lib/outer.rb"
	mainFile   = "/app/main.rb"
	workerFile = "/app/worker.rb"
)

// Synthetic stacks, innermost first.
var (
	// stackA: 60 samples on tid 100 (main).
	stackA = []stack.Frame{
		{Name: "Outer::Inner#level3", Path: appFile, Line: 12, Kind: stack.KindRuby},
		{Name: "Array#each", Path: appFile, Line: 7, Kind: stack.KindCFunc},
		{Name: "Outer::Inner#level2", Path: appFile, Line: 7, Kind: stack.KindRuby},
		{Name: "<main>", Path: mainFile, Line: 3, Kind: stack.KindRuby},
	}
	// stackB: 30 samples on tid 101 (alpha-worker).
	stackB = []stack.Frame{
		{Name: "Kernel#sleep", Path: workerFile, Line: 5, Kind: stack.KindCFunc},
		{Name: "block in Worker#run", Path: workerFile, Line: 5, Kind: stack.KindRuby},
		{Name: "Kernel#loop", Path: workerFile, Line: 4, Kind: stack.KindCFunc},
		{Name: "Worker#run", Path: workerFile, Line: 4, Kind: stack.KindRuby},
		{Name: "block in <main>", Path: mainFile, Line: 9, Kind: stack.KindRuby},
	}
	// stackC: 10 samples on tid 100, recursive.
	stackC = []stack.Frame{
		{Name: "Object#fib", Path: mainFile, Line: 2, Kind: stack.KindRuby},
		{Name: "Object#fib", Path: mainFile, Line: 3, Kind: stack.KindRuby},
		{Name: "Object#fib", Path: mainFile, Line: 3, Kind: stack.KindRuby},
		{Name: "<main>", Path: mainFile, Line: 5, Kind: stack.KindRuby},
	}
)

// synthSamples returns 105 samples at 100 Hz from t0: in every run of ten,
// six of stackA, three of stackB, one of stackC; then five samples without
// frames on tid 102.
func synthSamples() []stack.Sample {
	var out []stack.Sample
	for i := 0; i < 100; i++ {
		s := stack.Sample{Time: t0.Add(time.Duration(i) * 10 * time.Millisecond), Pid: 4242, OnCPU: true}
		switch r := i % 10; {
		case r < 6:
			s.TID, s.ThreadName, s.Frames = 100, "main", stackA
		case r < 9:
			s.TID, s.ThreadName, s.Frames = 101, "alpha-worker", stackB
		default:
			s.TID, s.ThreadName, s.Frames = 100, "main", stackC
		}
		out = append(out, s)
	}
	for i := 100; i < 105; i++ {
		out = append(out, stack.Sample{Time: t0.Add(time.Duration(i) * 10 * time.Millisecond), Pid: 4242, TID: 102, ThreadName: "idle"})
	}
	return out
}

func synthOptions() Options { return Options{RateHz: 100, Start: t0} }

// render runs format over the synthetic samples.
func render(t testing.TB, format string, o Options) []byte {
	t.Helper()
	w, err := New(format, o)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range synthSamples() {
		w.Add(s)
	}
	var b bytesBuffer
	n, err := w.WriteTo(&b)
	if err != nil {
		t.Fatal(err)
	}
	if n != int64(len(b.b)) {
		t.Fatalf("%s: WriteTo returned %d, wrote %d bytes", format, n, len(b.b))
	}
	return b.b
}

type bytesBuffer struct{ b []byte }

func (b *bytesBuffer) Write(p []byte) (int, error) { b.b = append(b.b, p...); return len(p), nil }

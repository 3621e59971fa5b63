package output

import (
	"bytes"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/stack"
)

// TestInternalFramesShownAsCFrames: a method Ruby defines in Ruby
// (Kernel#loop in <internal:kernel> on 3.3) is shown as Ruby 3.4 shows it,
// as a C function: at its caller's place, one function whatever its
// caller. Every format renders such a frame exactly as the same frame
// made a C function.
func TestInternalFramesShownAsCFrames(t *testing.T) {
	samples := func(internal bool) []stack.Sample {
		loop := func(path string, line int) stack.Frame {
			if internal {
				return stack.Frame{Name: "Kernel#loop", Path: path, Line: line, Kind: stack.KindRuby,
					InternalPath: "<internal:kernel>", InternalLine: 187}
			}
			return stack.Frame{Name: "Kernel#loop", Path: path, Line: line, Kind: stack.KindCFunc}
		}
		var out []stack.Sample
		for i := 0; i < 20; i++ {
			file, line, tid := mainFile, 4, 100
			if i%4 == 0 {
				file, line, tid = workerFile, 9, 101
			}
			out = append(out, stack.Sample{Time: t0.Add(time.Duration(i) * 10 * time.Millisecond), Pid: 4242, TID: tid,
				ThreadName: "t", OnCPU: true, Frames: []stack.Frame{
					{Name: "block in <main>", Path: file, Line: line + 1, Kind: stack.KindRuby},
					loop(file, line),
					{Name: "<main>", Path: file, Line: line, Kind: stack.KindRuby},
				}})
		}
		return out
	}
	for _, format := range []string{"callgrind", "collapsed", "pprof", "speedscope", "summary", "summary-by-line"} {
		for _, lines := range []bool{false, true} {
			var got [2][]byte
			for k, internal := range []bool{true, false} {
				o := synthOptions()
				o.Lines, o.Threads = lines, true
				w, err := New(format, o)
				if err != nil {
					t.Fatal(err)
				}
				for _, s := range samples(internal) {
					w.Add(s)
				}
				var b bytes.Buffer
				if _, err := w.WriteTo(&b); err != nil {
					t.Fatal(err)
				}
				got[k] = b.Bytes()
			}
			if !bytes.Equal(got[0], got[1]) {
				t.Errorf("%s (lines %v): an internal frame is not shown as a C frame:\n%s\nas a C frame:\n%s", format, lines, got[0], got[1])
			}
			if bytes.Contains(got[0], []byte("<internal:")) {
				t.Errorf("%s shows the internal path:\n%s", format, got[0])
			}
		}
	}
}

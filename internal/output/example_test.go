package output_test

import (
	"io"
	"os"

	"github.com/rbscope/rbscope/internal/output"
	"github.com/rbscope/rbscope/internal/stack"
)

// Render turns samples (innermost frame first, as the sampler delivers
// them) into one of the formats; here folded stacks, root first, one line
// per distinct stack with its count.
func ExampleRender() {
	main := stack.Frame{Name: "<main>", Path: "app.rb", Line: 9, Kind: stack.KindRuby}
	work := stack.Frame{Name: "Object#work", Path: "app.rb", Line: 3, Kind: stack.KindRuby}
	each := stack.Frame{Name: "Array#each", Path: "app.rb", Line: 3, Kind: stack.KindCFunc}
	samples := []stack.Sample{
		{Pid: 42, TID: 42, ThreadName: "main", OnCPU: true, Frames: []stack.Frame{each, work, main}},
		{Pid: 42, TID: 42, ThreadName: "main", OnCPU: true, Frames: []stack.Frame{each, work, main}},
		{Pid: 42, TID: 42, ThreadName: "main", OnCPU: true, Frames: []stack.Frame{work, main}},
	}
	next := func() (stack.Sample, error) {
		if len(samples) == 0 {
			return stack.Sample{}, io.EOF
		}
		s := samples[0]
		samples = samples[1:]
		return s, nil
	}
	if _, err := output.Render("collapsed", output.Options{RateHz: 100}, next, os.Stdout); err != nil {
		panic(err)
	}
	// Output:
	// <main>;Object#work 1
	// <main>;Object#work;Array#each 2
}

package ruby_test

import (
	"context"
	"fmt"
	"log"

	"github.com/rbscope/rbscope/internal/ruby"
	"github.com/rbscope/rbscope/internal/target"
)

// Open finds the Ruby VM in a process image (a live process here; a core
// file through target.OpenCore reads the same way), and Snapshot walks
// every Ruby thread's stack, innermost frame first.
func ExampleOpen() {
	t, err := target.OpenLive(12345) // the pid of a running Ruby
	if err != nil {
		log.Fatal(err) // errors.Is(err, target.ErrDenied), target.ErrExited...
	}
	defer t.Close()
	p, err := ruby.Open(context.Background(), ruby.Spec{Target: t, Consistency: ruby.Running})
	if err != nil {
		log.Fatal(err) // errors.Is(err, ruby.ErrNotRuby), ...
	}
	threads, err := p.Snapshot()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("Ruby %s (layout %s)\n", p.Version(), p.LayoutSource())
	for _, th := range threads {
		fmt.Printf("thread %s (%d) %s\n", th.DisplayName(), th.TID, th.Activity)
		for _, f := range th.Frames {
			fmt.Printf("  %s (%s:%d)\n", f.Name, f.Path, f.Line)
		}
	}
}

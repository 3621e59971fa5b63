package procfs

import (
	"testing"

	"github.com/rbscope/rbscope/internal/testutil"
)

// BenchmarkNamespaceTIDs reads the thread id map of a Ruby in a container
// (3 threads): what a live target pays, per containerised process, each
// time its map is read again (once a second, or for an id it lacks).
func BenchmarkNamespaceTIDs(b *testing.B) {
	c := testutil.StartContainerRuby(b, "container.rb", testutil.ContainerOptions{})
	for i := 0; i < b.N; i++ {
		if m, err := NamespaceTIDs(c.Pid); err != nil || len(m) != 3 {
			b.Fatalf("%v %v", m, err)
		}
	}
}

package alloc

import (
	"testing"

	"github.com/rbscope/rbscope/internal/testutil"
)

// BenchmarkSnapshot measures one refresh: batch-reading the site and
// class maps and resolving names (cached after the first refresh), for
// the workload of alloc.rb. Run as root:
// go test -run XXX -bench Snapshot ./internal/alloc
func BenchmarkSnapshot(b *testing.B) {
	needBPF(b)
	p := startRuby(b, testutil.SystemRuby(b), script(b, "alloc.rb"), "1000")
	p.expect(b, "ready")
	tr := attachOrMissing(b, p.cmd.Process.Pid, Options{Exact: true})
	p.send(b)
	p.expect(b, "done")
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		r, err := tr.Snapshot()
		if err != nil {
			b.Fatal(err)
		}
		if len(r.BySite) < 8 {
			b.Fatalf("%d sites", len(r.BySite))
		}
	}
}

package record_test

import (
	"context"
	"log"
	"os"
	"time"

	"github.com/rbscope/rbscope/internal/record"
)

// Run records a process for a while into one of the output formats,
// as `rbscope record --pid 12345 --duration 10s --format flamegraph`
// does; a raw recording is kept beside it for `rbscope report`.
func ExampleRun() {
	err := record.Run(context.Background(), record.Config{
		Target:   record.Target{Pid: 12345, Rate: 100},
		Duration: 10 * time.Second,
		Format:   "flamegraph",
		Output:   "profile.html",
		Stderr:   os.Stderr,
	})
	if err != nil {
		log.Fatal(err)
	}
}

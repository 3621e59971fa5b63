package testutil

import (
	"fmt"
	"os"
	"testing"
)

// InCI reports whether the tests run under CI (CI=true), where a missing
// need fails a test instead of skipping it.
func InCI() bool {
	v := os.Getenv("CI")
	return v == "true" || v == "1"
}

// Missing stops the test because something it needs is not there: it fails
// under CI (a test never goes green by skipping) and skips elsewhere. need
// names what is missing and how to get it, e.g. "root (CAP_SYS_PTRACE)".
func Missing(t testing.TB, need string, args ...any) {
	t.Helper()
	msg := "missing need: " + fmt.Sprintf(need, args...)
	if InCI() {
		t.Fatal(msg + " (CI=true: failing instead of skipping)")
	}
	t.Skip(msg)
}

// NeedRoot stops the test (see Missing) unless it runs as root.
func NeedRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		Missing(t, "root (reading another process's memory needs CAP_SYS_PTRACE)")
	}
}

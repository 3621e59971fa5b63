package procfs

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// MaxEnviron bounds how much of a process's environment Environ reads.
// Linux lets an environment be as large as a quarter of the stack limit;
// the variables rbscope looks for sit among the first few kilobytes.
const MaxEnviron = 1 << 20

// Environ returns the environment process pid started with, from
// /proc/PID/environ: "KEY=VALUE" strings, as the process received them
// at exec (later setenv calls inside the process are not seen). At most
// MaxEnviron bytes are read; an entry cut by that bound is dropped.
// Reading another user's environment needs the same permission as
// reading its memory (CAP_SYS_PTRACE); a process that has exited gives
// an error or no entries, and so does one in the middle of an exec (for
// a moment after its old image is gone and before the new one's
// environment is in place).
func Environ(pid int) ([]string, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		return nil, fmt.Errorf("read environment of process %d: %w", pid, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxEnviron+1))
	if err != nil {
		return nil, fmt.Errorf("read environment of process %d: %w", pid, err)
	}
	cut := len(b) > MaxEnviron
	if cut {
		b = b[:MaxEnviron]
	}
	return ParseEnviron(b, cut), nil
}

// ParseEnviron splits the NUL-separated contents of an environ file into
// its entries; with cut (the contents were cut short) the last entry,
// unless NUL-terminated, is dropped as incomplete. Empty entries are
// skipped.
func ParseEnviron(b []byte, cut bool) []string {
	if cut {
		if i := bytes.LastIndexByte(b, 0); i >= 0 {
			b = b[:i+1]
		} else {
			b = nil
		}
	}
	var out []string
	for _, e := range bytes.Split(b, []byte{0}) {
		if len(e) > 0 {
			out = append(out, string(e))
		}
	}
	return out
}

// LookupEnv returns the value of key in env ("KEY=VALUE" entries, as
// Environ returns them) and whether it is set. When key is repeated the
// first entry wins, as glibc's getenv sees it.
func LookupEnv(env []string, key string) (string, bool) {
	if key == "" || strings.Contains(key, "=") {
		return "", false
	}
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, key); ok && strings.HasPrefix(v, "=") {
			return v[1:], true
		}
	}
	return "", false
}

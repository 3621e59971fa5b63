package procfs

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// maxCmdline bounds how much of a command line is read.
const maxCmdline = 64 << 10

// Cmdline returns the arguments of process pid from /proc/PID/cmdline;
// nil for a process without one (a kernel thread, a zombie).
func Cmdline(pid int) ([]string, error) {
	return ReadCmdline("/proc/" + strconv.Itoa(pid) + "/cmdline")
}

// ReadCmdline reads a cmdline file at path (under another /proc root, as
// a core handler sees it), at most 64 KiB of it.
func ReadCmdline(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read command line: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxCmdline))
	if err != nil {
		return nil, fmt.Errorf("read command line: %w", err)
	}
	return SplitCmdline(b), nil
}

// SplitCmdline splits the NUL-separated contents of a cmdline file.
func SplitCmdline(b []byte) []string {
	b = bytes.TrimRight(b, "\x00")
	if len(b) == 0 {
		return nil
	}
	return strings.Split(string(b), "\x00")
}

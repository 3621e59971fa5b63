package output

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/testutil"
)

func writeString(s string) func(io.Writer) error {
	return func(w io.Writer) error { _, err := io.WriteString(w, s); return err }
}

func fileType(t *testing.T, path string) os.FileMode {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Type()
}

// TestWriteFileCharDevice: a character device (a /dev/null made with
// mknod under a temp dir) is written in place and stays a device.
func TestWriteFileCharDevice(t *testing.T) {
	testutil.NeedRoot(t) // mknod
	dev := filepath.Join(t.TempDir(), "null")
	if err := syscall.Mknod(dev, syscall.S_IFCHR|0o666, 1<<8|3); err != nil {
		testutil.Missing(t, "mknod of a character device (CAP_MKNOD, a filesystem without nodev): %v", err)
	}
	if err := CheckWritable(dev); err != nil {
		t.Fatalf("CheckWritable(device) = %v", err)
	}
	f, err := WriteFile(dev, WriteOptions{}, writeString("profile\n"))
	if err != nil {
		t.Fatal(err)
	}
	if f.Replaced || fileType(t, dev) != os.ModeDevice|os.ModeCharDevice {
		t.Fatalf("device replaced: %+v, type %v", f, fileType(t, dev))
	}
}

// startReader starts a real reader process, shell command script, with
// the FIFO as $1 and its output captured; cleanup kills it.
func startReader(t *testing.T, fifo, script string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	cmd := exec.Command("sh", "-c", script, "sh", fifo)
	var out bytes.Buffer
	cmd.Stdout = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd, &out
}

// inOpen reports whether process pid is blocked in openat(2) (x86_64
// system call 257): a FIFO's reader waiting for a writer.
func inOpen(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/syscall", pid))
	return err == nil && strings.HasPrefix(string(b), "257 ")
}

// waitInOpen waits until the reader pid is blocked opening the FIFO.
func waitInOpen(t *testing.T, pid int) {
	t.Helper()
	for i := 0; !inOpen(pid); i++ {
		if i == 500 {
			t.Fatalf("reader %d never blocked opening the FIFO", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestWriteFileFIFO writes to a FIFO with real reader processes: one
// waiting before rbscope checks the output (CheckWritable must leave it
// waiting), one that comes while WriteFile waits (it says so), none (a
// bounded wait, then an error), one that exits after a few bytes and one
// that never reads (errors, never a hang or a SIGPIPE), and a wait
// canceled by its context (a stop signal). The FIFO stays a FIFO.
func TestWriteFileFIFO(t *testing.T) {
	payload := strings.Repeat("through the fifo\n", 64<<10) // 1.1 MiB: many pipe buffers
	mkfifo := func(t *testing.T) string {
		fifo := filepath.Join(t.TempDir(), "fifo")
		if err := syscall.Mkfifo(fifo, 0o600); err != nil {
			t.Fatal(err)
		}
		return fifo
	}
	type said struct {
		mu   sync.Mutex
		msgs []string
		ch   chan string
	}
	sayer := func() (*said, func(string)) {
		s := &said{ch: make(chan string, 4)}
		return s, func(m string) {
			s.mu.Lock()
			s.msgs = append(s.msgs, m)
			s.mu.Unlock()
			s.ch <- m
		}
	}
	t.Run("reader first", func(t *testing.T) {
		fifo := mkfifo(t)
		cmd, out := startReader(t, fifo, `exec cat "$1"`)
		waitInOpen(t, cmd.Process.Pid)
		if err := CheckWritable(fifo); err != nil {
			t.Fatalf("CheckWritable(fifo) = %v", err)
		}
		time.Sleep(50 * time.Millisecond)
		if !inOpen(cmd.Process.Pid) {
			t.Fatal("CheckWritable let the waiting reader through (it got an end of file)")
		}
		s, say := sayer()
		f, err := WriteFile(fifo, WriteOptions{Say: say}, writeString(payload))
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Wait(); err != nil || out.String() != payload {
			t.Errorf("reader: %v, got %d bytes, want %d", err, out.Len(), len(payload))
		}
		if len(s.msgs) != 0 {
			t.Errorf("said %q with a reader already there", s.msgs)
		}
		if f.Replaced || fileType(t, fifo) != os.ModeNamedPipe {
			t.Fatalf("fifo replaced: %+v, type %v", f, fileType(t, fifo))
		}
	})
	t.Run("reader second", func(t *testing.T) {
		fifo := mkfifo(t)
		if err := CheckWritable(fifo); err != nil {
			t.Fatalf("CheckWritable(fifo) = %v", err)
		}
		s, say := sayer()
		done := make(chan error, 1)
		go func() {
			_, err := WriteFile(fifo, WriteOptions{Say: say}, writeString(payload))
			done <- err
		}()
		msg := <-s.ch
		if !strings.Contains(msg, "waiting up to 30s for a reader of the FIFO "+fifo) {
			t.Errorf("said %q", msg)
		}
		cmd, out := startReader(t, fifo, `exec cat "$1"`)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if err := cmd.Wait(); err != nil || out.String() != payload {
			t.Errorf("reader: %v, got %d bytes, want %d", err, out.Len(), len(payload))
		}
	})
	t.Run("no reader", func(t *testing.T) {
		fifo := mkfifo(t)
		s, say := sayer()
		_, err := WriteFile(fifo, WriteOptions{ReaderWait: 200 * time.Millisecond, Say: say}, writeString(payload))
		if err == nil || !strings.Contains(err.Error(), "no reader opened the FIFO "+fifo+" within 200ms") {
			t.Errorf("WriteFile = %v, want no reader within 200ms", err)
		}
		if len(s.msgs) != 1 {
			t.Errorf("said %q, want one message", s.msgs)
		}
	})
	t.Run("reader exits early", func(t *testing.T) {
		fifo := mkfifo(t)
		cmd, out := startReader(t, fifo, `exec head -c 100 "$1"`)
		waitInOpen(t, cmd.Process.Pid)
		_, err := WriteFile(fifo, WriteOptions{}, writeString(payload))
		if err == nil || !strings.Contains(err.Error(), "the reader of the FIFO closed it after") {
			t.Errorf("WriteFile = %v, want the reader closed it", err)
		}
		if cmd.Wait(); out.String() != payload[:100] {
			t.Errorf("reader got %q", out.String())
		}
	})
	t.Run("reader never reads", func(t *testing.T) {
		fifo := mkfifo(t)
		cmd, _ := startReader(t, fifo, `exec sleep 60 < "$1"`)
		waitInOpen(t, cmd.Process.Pid)
		_, err := WriteFile(fifo, WriteOptions{ReaderWait: 300 * time.Millisecond}, writeString(payload))
		if err == nil || !strings.Contains(err.Error(), "the reader of the FIFO took nothing for 300ms") {
			t.Errorf("WriteFile = %v, want the reader took nothing", err)
		}
	})
	t.Run("canceled", func(t *testing.T) {
		fifo := mkfifo(t)
		ctx, cancel := context.WithCancelCause(context.Background())
		s, say := sayer()
		done := make(chan error, 1)
		go func() {
			_, err := WriteFile(fifo, WriteOptions{Context: ctx, Say: say}, writeString(payload))
			done <- err
		}()
		<-s.ch
		cancel(errors.New("interrupted by terminated"))
		if err := <-done; err == nil || !strings.Contains(err.Error(), "waiting for a reader of the FIFO "+fifo+": interrupted by terminated") {
			t.Errorf("WriteFile = %v, want interrupted", err)
		}
		// Canceled while the reader is not reading.
		cmd, _ := startReader(t, fifo, `exec sleep 60 < "$1"`)
		waitInOpen(t, cmd.Process.Pid)
		ctx, cancel = context.WithCancelCause(context.Background())
		time.AfterFunc(100*time.Millisecond, func() { cancel(errors.New("interrupted by interrupt")) })
		if _, err := WriteFile(fifo, WriteOptions{Context: ctx}, writeString(payload)); err == nil ||
			!strings.Contains(err.Error(), "interrupted by interrupt") {
			t.Errorf("WriteFile = %v, want interrupted", err)
		}
	})
}

// TestWriteFileSocket: a socket is refused by CheckWritable and WriteFile,
// and stays.
func TestWriteFileSocket(t *testing.T) {
	p := filepath.Join(t.TempDir(), "sock")
	l, err := net.Listen("unix", p)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := CheckWritable(p); err == nil || !strings.Contains(err.Error(), "is a socket") {
		t.Errorf("CheckWritable(socket) = %v", err)
	}
	if _, err := WriteFile(p, WriteOptions{}, writeString("x")); err == nil || !strings.Contains(err.Error(), "is a socket") {
		t.Errorf("WriteFile(socket) = %v", err)
	}
	if fileType(t, p) != os.ModeSocket {
		t.Errorf("socket replaced")
	}
}

// TestWriteFileSymlink: a link to a regular file keeps being a link; its
// target gets the new contents (through a rename in the target's
// directory); a link to a missing file creates the target.
func TestWriteFileSymlink(t *testing.T) {
	dir, other := t.TempDir(), t.TempDir()
	target := filepath.Join(other, "real.html")
	if err := os.WriteFile(target, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.html")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	f, err := WriteFile(link, WriteOptions{}, writeString("new"))
	if err != nil {
		t.Fatal(err)
	}
	if fileType(t, link) != os.ModeSymlink {
		t.Fatalf("link replaced by %v", fileType(t, link))
	}
	if b, _ := os.ReadFile(target); string(b) != "new" || f.Path != target || !f.Replaced {
		t.Fatalf("target holds %q, file %+v", b, f)
	}
	if fi, _ := os.Stat(target); fi.Mode().Perm() != 0o600 {
		t.Errorf("target's mode %v, want the old 0600 kept", fi.Mode().Perm())
	}
	dangling := filepath.Join(dir, "dangling")
	if err := os.Symlink(filepath.Join(other, "new.txt"), dangling); err != nil {
		t.Fatal(err)
	}
	if _, err := WriteFile(dangling, WriteOptions{}, writeString("x")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(other, "new.txt")); string(b) != "x" || fileType(t, dangling) != os.ModeSymlink {
		t.Fatalf("dangling link: target %q, link type %v", b, fileType(t, dangling))
	}
}

// TestWriteFileRegular: a regular file is replaced only when the write
// succeeds, and no temporary file is left behind either way.
func TestWriteFileRegular(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "out.txt")
	if err := os.WriteFile(p, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := WriteFile(p, WriteOptions{}, func(w io.Writer) error { return io.ErrUnexpectedEOF }); err == nil {
		t.Fatal("failed write reported success")
	}
	if b, _ := os.ReadFile(p); string(b) != "keep" {
		t.Fatalf("failed write changed the file to %q", b)
	}
	if _, err := WriteFile(p, WriteOptions{}, writeString("new")); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(dir)
	if b, _ := os.ReadFile(p); string(b) != "new" || len(ents) != 1 {
		t.Fatalf("file %q, directory %v", b, ents)
	}
	if err := CheckWritable(dir); err == nil || !strings.Contains(err.Error(), "directory") {
		t.Errorf("CheckWritable(dir) = %v", err)
	}
	if err := CheckWritable(filepath.Join(dir, "missing", "x")); err == nil {
		t.Error("CheckWritable in a missing directory = nil")
	}
}

// TestCheckWritableProc: a file the kernel will not open for writing is
// refused even for root (for whom access(2) says yes).
func TestCheckWritableProc(t *testing.T) {
	if err := CheckWritable("/proc/version"); err == nil {
		t.Error("CheckWritable(/proc/version) = nil")
	}
}

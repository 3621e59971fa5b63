package output

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

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
	f, err := WriteFile(dev, writeString("profile\n"))
	if err != nil {
		t.Fatal(err)
	}
	if f.Replaced || fileType(t, dev) != os.ModeDevice|os.ModeCharDevice {
		t.Fatalf("device replaced: %+v, type %v", f, fileType(t, dev))
	}
}

// TestWriteFileFIFO: a FIFO is written in place; its reader gets the bytes.
func TestWriteFileFIFO(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	// CheckWritable must not open the FIFO (that would wait for a reader).
	if err := CheckWritable(fifo); err != nil {
		t.Fatalf("CheckWritable(fifo) = %v", err)
	}
	got := make(chan string, 1)
	go func() {
		r, err := os.Open(fifo)
		if err != nil {
			got <- err.Error()
			return
		}
		defer r.Close()
		b, _ := io.ReadAll(r)
		got <- string(b)
	}()
	f, err := WriteFile(fifo, writeString("through the fifo\n"))
	if err != nil {
		t.Fatal(err)
	}
	if s := <-got; s != "through the fifo\n" {
		t.Errorf("reader got %q", s)
	}
	if f.Replaced || fileType(t, fifo) != os.ModeNamedPipe {
		t.Fatalf("fifo replaced: %+v, type %v", f, fileType(t, fifo))
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
	f, err := WriteFile(link, writeString("new"))
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
	if _, err := WriteFile(dangling, writeString("x")); err != nil {
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
	if _, err := WriteFile(p, func(w io.Writer) error { return io.ErrUnexpectedEOF }); err == nil {
		t.Fatal("failed write reported success")
	}
	if b, _ := os.ReadFile(p); string(b) != "keep" {
		t.Fatalf("failed write changed the file to %q", b)
	}
	if _, err := WriteFile(p, writeString("new")); err != nil {
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

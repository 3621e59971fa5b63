package output

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"golang.org/x/sys/unix"
)

// File says how WriteFile wrote a path.
type File struct {
	// Path is the file that was written: the path given, or the target
	// of the symbolic link it named.
	Path string
	// Replaced is true when a regular file was written through a
	// temporary file and renamed into place (the path did not exist or
	// was a regular file); false when it was written in place (standard
	// output, a device, a FIFO, a socket).
	Replaced bool
}

// StdoutPath reports whether path names standard output: "-" or
// /dev/stdout.
func StdoutPath(path string) bool { return path == "-" || path == "/dev/stdout" }

// plan decides how path is written: in place (a device, a FIFO, an open
// file named through /proc), or through a temporary file renamed over the
// real path (a regular file or a missing one; a symbolic link is followed
// to its target, which is replaced, never the link).
func plan(path string) (real string, inPlace bool, err error) {
	if StdoutPath(path) {
		return path, true, nil
	}
	if underProcOrDev(path) {
		return path, true, nil
	}
	real = path
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		r, err := filepath.EvalSymlinks(path)
		if err != nil {
			// A dangling link (or one into /proc that names no path, a
			// pipe): let the kernel follow it.
			return path, true, nil
		}
		real = r
		if underProcOrDev(real) {
			return real, true, nil
		}
	}
	fi, err := os.Stat(real)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return real, false, nil
	case err != nil:
		return "", false, err
	case fi.IsDir():
		return "", false, fmt.Errorf("%s is a directory", path)
	case fi.Mode().IsRegular():
		return real, false, nil
	}
	return real, true, nil
}

// openFileRe matches the names of a process's open files: /proc/PID/fd/N,
// /proc/PID/task/TID/fd/N, /dev/fd/N, /dev/stdin, /dev/stdout, /dev/stderr.
var openFileRe = regexp.MustCompile(`^(/proc/[^/]+(/task/[^/]+)?/fd/|/dev/fd/|/dev/std(in|out|err)$)`)

// underProcOrDev reports whether path names an open file of a process
// (directly or through a link into /proc): renaming over what such a link
// resolves to would replace the file a shell opened, so it is written in
// place.
func underProcOrDev(path string) bool {
	p := filepath.Clean(path)
	if openFileRe.MatchString(p) {
		return true
	}
	l, err := os.Readlink(p)
	return err == nil && openFileRe.MatchString(l)
}

// CheckWritable fails when path cannot be written, leaving nothing behind
// and taking nothing from anyone. A FIFO is not opened (opening and
// closing it would hand a reader already waiting on it an end of file):
// its permissions are checked. A device is opened for writing without
// waiting, and closed. Another existing file is opened for writing
// without truncating it; where a regular file will be written, a
// temporary file is created and removed beside it.
func CheckWritable(path string) error {
	real, inPlace, err := plan(path)
	if err != nil {
		return err
	}
	if StdoutPath(real) {
		return nil
	}
	if fi, err := os.Stat(real); err == nil {
		switch {
		case fi.Mode()&os.ModeNamedPipe != 0:
			if err := unix.Faccessat(unix.AT_FDCWD, real, unix.W_OK, unix.AT_EACCESS); err != nil {
				return &os.PathError{Op: "access", Path: real, Err: err}
			}
			return nil
		case fi.Mode()&os.ModeSocket != 0:
			return fmt.Errorf("%s is a socket: rbscope writes to files, FIFOs and devices", real)
		}
		// access(2) would not do: root passes it for files the kernel
		// still refuses to write.
		f, err := os.OpenFile(real, os.O_WRONLY|unix.O_NONBLOCK, 0)
		if err != nil {
			return err
		}
		f.Close()
		if inPlace {
			return nil
		}
	}
	// A regular file is written through a temporary file beside it.
	dir := filepath.Dir(real)
	f, err := os.CreateTemp(dir, ".rbscope-check-*")
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			return fmt.Errorf("cannot create files in %s: %w", dir, pe.Err)
		}
		return err
	}
	f.Close()
	return os.Remove(f.Name())
}

// DefaultReaderWait is how long WriteFile waits, by default, for a
// FIFO's reader: to open it, and then to take each part of what is
// written.
const DefaultReaderWait = 30 * time.Second

// WriteOptions says how WriteFile waits on what it writes in place.
type WriteOptions struct {
	// Context ends a wait early (a stop signal): WriteFile then fails
	// with its cause. nil: context.Background().
	Context context.Context
	// ReaderWait bounds each wait on a FIFO's reader: for one to open
	// it, then for it to take the next bytes (a reader that stops
	// reading). DefaultReaderWait when 0.
	ReaderWait time.Duration
	// Say, when set, is told in a sentence what WriteFile waits for,
	// once it begins to wait (rbscope prints it on stderr).
	Say func(msg string)
}

// WriteFile writes what write produces to path without ever destroying
// what path names:
//   - "-" and /dev/stdout are standard output;
//   - a missing path or a regular file is written through a temporary
//     file in the same directory, renamed into place only when write
//     succeeded (a failed render never leaves half a file);
//   - a symbolic link is followed: its target is written (as above), the
//     link stays;
//   - a FIFO is written in place once a reader has opened it: WriteFile
//     waits for one (saying so through opts.Say) for at most
//     opts.ReaderWait, and fails when none came, when the reader takes
//     nothing for that long, or when it closes the FIFO early;
//   - a device or an open file named through /proc or /dev/fd is opened
//     (without waiting) and written in place, never replaced; a socket
//     is refused.
func WriteFile(path string, opts WriteOptions, write func(w io.Writer) error) (File, error) {
	real, inPlace, err := plan(path)
	if err != nil {
		return File{}, fmt.Errorf("write %s: %w", path, err)
	}
	if !inPlace {
		return File{Path: real, Replaced: true}, replace(real, write)
	}
	if StdoutPath(real) {
		bw := bufio.NewWriter(os.Stdout)
		if err := write(bw); err != nil {
			return File{Path: path}, err
		}
		return File{Path: path}, bw.Flush()
	}
	if opts.Context == nil {
		opts.Context = context.Background()
	}
	if opts.ReaderWait <= 0 {
		opts.ReaderWait = DefaultReaderWait
	}
	var f *os.File
	var w io.Writer
	fi, err := os.Stat(real)
	switch {
	case err == nil && fi.Mode()&os.ModeNamedPipe != 0:
		if f, err = openFIFO(real, opts); err != nil {
			return File{}, err
		}
		fw := &fifoWriter{f: f, path: real, opts: opts}
		stop := context.AfterFunc(opts.Context, func() { f.SetWriteDeadline(time.Unix(1, 0)) })
		defer stop()
		w = fw
	case err == nil && fi.Mode()&os.ModeSocket != 0:
		return File{}, fmt.Errorf("write %s: it is a socket: rbscope writes to files, FIFOs and devices", real)
	case err == nil && fi.Mode()&os.ModeDevice != 0:
		// Opened without waiting (a serial line without carrier would
		// block the open), then written as usual.
		if f, err = os.OpenFile(real, os.O_WRONLY|unix.O_NONBLOCK, 0); err != nil {
			return File{}, fmt.Errorf("open %s: %w", real, err)
		}
		if err := unix.SetNonblock(int(f.Fd()), false); err != nil {
			f.Close()
			return File{}, fmt.Errorf("open %s: %w", real, err)
		}
		w = f
	default:
		if f, err = os.OpenFile(real, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644); err != nil {
			return File{}, fmt.Errorf("open %s: %w", real, err)
		}
		w = f
	}
	bw := bufio.NewWriterSize(w, 256<<10)
	err = write(bw)
	if err == nil {
		err = bw.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return File{Path: real}, fmt.Errorf("write %s: %w", real, err)
	}
	return File{Path: real}, nil
}

// fifoPoll is how often openFIFO tries again for a reader: the kernel
// tells a writer nothing when one comes.
const fifoPoll = 20 * time.Millisecond

// openFIFO opens the FIFO path for writing once a reader has it open,
// waiting for one for at most opts.ReaderWait. The file is non-blocking
// (Go's poller waits on it), so that writes can be given deadlines.
func openFIFO(path string, opts WriteOptions) (*os.File, error) {
	deadline := time.Now().Add(opts.ReaderWait)
	said := false
	for {
		f, err := os.OpenFile(path, os.O_WRONLY|unix.O_NONBLOCK, 0)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, unix.ENXIO) {
			return nil, fmt.Errorf("open %s: %w", path, err)
		}
		// ENXIO: nobody has the FIFO open for reading.
		if !said && opts.Say != nil {
			opts.Say(fmt.Sprintf("waiting up to %v for a reader of the FIFO %s (e.g. cat %s)", opts.ReaderWait, path, path))
		}
		said = true
		left := time.Until(deadline)
		if left <= 0 {
			return nil, fmt.Errorf("no reader opened the FIFO %s within %v: nothing was written to it", path, opts.ReaderWait)
		}
		t := time.NewTimer(min(left, fifoPoll))
		select {
		case <-opts.Context.Done():
			t.Stop()
			return nil, fmt.Errorf("waiting for a reader of the FIFO %s: %w", path, context.Cause(opts.Context))
		case <-t.C:
		}
	}
}

// fifoChunk is what a FIFO's reader must take within ReaderWait: one
// pipe buffer page.
const fifoChunk = 4096

// fifoWriter writes to a FIFO in chunks, each within opts.ReaderWait,
// and words the ways a reader fails for a person.
type fifoWriter struct {
	f    *os.File
	path string
	opts WriteOptions
	n    int64 // bytes the reader took
}

func (w *fifoWriter) Write(p []byte) (int, error) {
	done := 0
	for done < len(p) {
		if err := w.opts.Context.Err(); err != nil {
			return done, fmt.Errorf("interrupted after %d bytes: %w", w.n, context.Cause(w.opts.Context))
		}
		w.f.SetWriteDeadline(time.Now().Add(w.opts.ReaderWait))
		if err := w.opts.Context.Err(); err != nil {
			// Canceled between the check above and the deadline,
			// which replaced the one the cancellation set.
			return done, fmt.Errorf("interrupted after %d bytes: %w", w.n, context.Cause(w.opts.Context))
		}
		m, err := w.f.Write(p[done:min(len(p), done+fifoChunk)])
		done += m
		w.n += int64(m)
		switch {
		case err == nil:
		case errors.Is(err, unix.EPIPE):
			return done, fmt.Errorf("the reader of the FIFO closed it after %d bytes: the output is incomplete", w.n)
		case errors.Is(err, os.ErrDeadlineExceeded) && w.opts.Context.Err() != nil:
			return done, fmt.Errorf("interrupted after %d bytes: %w", w.n, context.Cause(w.opts.Context))
		case errors.Is(err, os.ErrDeadlineExceeded):
			return done, fmt.Errorf("the reader of the FIFO took nothing for %v (after %d bytes): the output is incomplete",
				w.opts.ReaderWait, w.n)
		default:
			return done, err
		}
	}
	return done, nil
}

// replace writes a regular file at path through a temporary file renamed
// over it. An existing file keeps its permission bits; a new one gets
// 0644.
func replace(path string, write func(w io.Writer) error) error {
	mode := os.FileMode(0o644)
	if fi, err := os.Stat(path); err == nil {
		mode = fi.Mode().Perm()
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("create output: %w", err)
	}
	defer os.Remove(tmp.Name()) // after a successful rename, a no-op
	bw := bufio.NewWriterSize(tmp, 256<<10)
	err = write(bw)
	if err == nil {
		err = bw.Flush()
	}
	if err == nil {
		err = tmp.Chmod(mode)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

package output

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"

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

// CheckWritable fails when path cannot be written, leaving nothing behind.
// An existing file is opened for writing without truncating it, and
// without waiting (a FIFO without a reader yet is fine); where a regular
// file will be written, a temporary file is created and removed beside it.
func CheckWritable(path string) error {
	real, inPlace, err := plan(path)
	if err != nil {
		return err
	}
	if StdoutPath(real) {
		return nil
	}
	if _, err := os.Stat(real); err == nil {
		// access(2) would not do: root passes it for files the kernel
		// still refuses to write.
		f, err := os.OpenFile(real, os.O_WRONLY|unix.O_NONBLOCK, 0)
		if errors.Is(err, unix.ENXIO) {
			return nil // a FIFO nobody reads yet
		}
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

// WriteFile writes what write produces to path without ever destroying
// what path names:
//   - "-" and /dev/stdout are standard output;
//   - a missing path or a regular file is written through a temporary
//     file in the same directory, renamed into place only when write
//     succeeded (a failed render never leaves half a file);
//   - a symbolic link is followed: its target is written (as above), the
//     link stays;
//   - a device, a FIFO, a socket or an open file named through /proc or
//     /dev/fd is opened and written in place, never replaced.
func WriteFile(path string, write func(w io.Writer) error) (File, error) {
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
	f, err := os.OpenFile(real, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return File{}, fmt.Errorf("open %s: %w", real, err)
	}
	bw := bufio.NewWriterSize(f, 256<<10)
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

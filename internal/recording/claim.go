package recording

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// ErrInUse says that another recording is writing a file.
var ErrInUse = errors.New("another recording is writing it")

// Claim reserves the regular file at path (created if need be) for one
// recording until release is called: while it is held, another Claim of
// the file, in this process or another, fails with ErrInUse, so that two
// recordings never write one file (a shared file mixes their blocks, and
// each reads back the other's data or a corrupt stream). The claim is a
// flock on the file: the kernel drops it when the process dies. A path
// that is no regular file (a device, a FIFO) is not claimed. release
// removes a file Claim created that is still empty (nothing was recorded).
func Claim(path string) (release func(), err error) {
	st, err := os.Stat(path)
	switch {
	case err == nil && !st.Mode().IsRegular():
		return func() {}, nil
	case err != nil && !errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("claim recording %s: %w", path, err)
	}
	created := err != nil
	if created {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return nil, fmt.Errorf("create recording directory: %w", err)
		}
	}
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("claim recording %s: %w", path, err)
	}
	return lock(f, created)
}

// CheckFree reports (ErrInUse) whether another recording holds the file
// at path, without claiming it nor creating it: an early check, before
// the Claim that counts.
func CheckFree(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return nil // none yet, or one Claim will say more about
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return nil
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB); errors.Is(err, unix.EWOULDBLOCK) {
		return fmt.Errorf("recording %s: %w", path, ErrInUse)
	}
	return nil // closing f drops the lock
}

// ClaimDefault creates and claims (see Claim) a new file for a recording
// of pid started at t, in DefaultDir: rbscope-<time>-<pid>-<random>.raw.gz,
// never a file that exists (O_EXCL), so that recordings of one process
// started in the same second get files of their own.
func ClaimDefault(pid int, t time.Time) (path string, release func(), err error) {
	dir := DefaultDir()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", nil, fmt.Errorf("create recording directory: %w", err)
	}
	f, err := os.CreateTemp(dir, "rbscope-"+t.Format("20060102-150405")+"-"+strconv.Itoa(pid)+"-*.raw.gz")
	if err != nil {
		return "", nil, fmt.Errorf("create recording: %w", err)
	}
	// CreateTemp's files are private; a recording is as readable as
	// Create makes it.
	if err := f.Chmod(0o644); err != nil {
		f.Close()
		os.Remove(f.Name())
		return "", nil, fmt.Errorf("create recording: %w", err)
	}
	release, err = lock(f, true)
	if err != nil {
		os.Remove(f.Name())
		return "", nil, err
	}
	return f.Name(), release, nil
}

// lock takes f's flock and returns its release, which closes f (and
// removes its file when created and still empty).
func lock(f *os.File, created bool) (func(), error) {
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("recording %s: %w", f.Name(), ErrInUse)
		}
		return nil, fmt.Errorf("lock recording %s: %w", f.Name(), err)
	}
	return func() {
		if st, err := f.Stat(); created && err == nil && st.Size() == 0 {
			os.Remove(f.Name())
		}
		f.Close()
	}, nil
}

// DefaultDir is where recordings go by default: <user cache
// dir>/rbscope/recordings, else the current directory.
func DefaultDir() string {
	dir, err := os.UserCacheDir()
	if err != nil {
		return "."
	}
	return filepath.Join(dir, "rbscope", "recordings")
}

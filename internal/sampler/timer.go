package sampler

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// tickTimer wakes the sampler at absolute deadlines with one wake-up per
// tick and without blocking an OS thread: a CLOCK_MONOTONIC timerfd armed
// with TFD_TIMER_ABSTIME for each deadline and read through Go's network
// poller. Go's own timers wake up to a millisecond late (the poller's wait
// has millisecond resolution), and a clock_nanosleep parks the goroutine's
// thread in a system call, which makes the runtime's monitor thread poll
// every 20 µs to hand its processor to another thread: measured with
// strace, 18 nanosleep calls per tick at 100 Hz. A timerfd in the poller
// costs one settime and one read per tick, and nothing else wakes.
type tickTimer struct {
	f  *os.File
	fd int // f's descriptor (f.Fd would make f blocking)
	// The monotonic clock's reading at base, to turn time.Time deadlines
	// into absolute CLOCK_MONOTONIC ones.
	base     time.Time
	baseMono int64
	buf      [8]byte
	stop     func() bool
	rc       syscall.RawConn
	readFn   func(fd uintptr) bool // made once: a closure per tick allocates
	readErr  unix.Errno
}

// newTickTimer creates the timerfd, whose waits end when ctx is done; the
// caller must close it.
func newTickTimer(ctx context.Context) (*tickTimer, error) {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("create the sampling timer (timerfd): %w", err)
	}
	// The wall clock first: the monotonic reading taken after it is later
	// by the time between the two calls, so deadlines err late, never
	// early.
	base := time.Now()
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("read CLOCK_MONOTONIC: %w", err)
	}
	// A non-blocking descriptor given to os.NewFile is registered with the
	// poller: Read parks the goroutine instead of its thread.
	t := &tickTimer{f: os.NewFile(uintptr(fd), "timerfd"), fd: fd, base: base, baseMono: ts.Nano()}
	rc, err := t.f.SyscallConn()
	if err != nil {
		t.f.Close()
		return nil, fmt.Errorf("poll the sampling timer: %w", err)
	}
	t.rc = rc
	// The read is a raw system call (see target.vmReadv for why);
	// returning false on EAGAIN parks the goroutine in the poller until
	// the timer fires.
	t.readFn = func(fd uintptr) bool {
		_, _, errno := unix.RawSyscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(&t.buf[0])), uintptr(len(t.buf)))
		t.readErr = errno
		return errno != unix.EAGAIN
	}
	// A deadline in the past makes a waiting Read return at once.
	t.stop = context.AfterFunc(ctx, func() { _ = t.f.SetReadDeadline(time.Unix(1, 0)) })
	return t, nil
}

// Close stops watching the context and closes the timerfd.
func (t *tickTimer) Close() error {
	t.stop()
	return t.f.Close()
}

// Now is the wall clock with its monotonic reading (time.Now).
func (t *tickTimer) Now() time.Time { return time.Now() }

// SleepUntil waits for deadline or ctx, returning ctx's error when it was
// cancelled.
func (t *tickTimer) SleepUntil(ctx context.Context, deadline time.Time) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	at := t.baseMono + int64(deadline.Sub(t.base))
	if at <= 0 {
		return nil
	}
	spec := unix.ItimerSpec{Value: unix.NsecToTimespec(at)}
	if _, _, errno := unix.RawSyscall6(unix.SYS_TIMERFD_SETTIME, uintptr(t.fd), unix.TFD_TIMER_ABSTIME,
		uintptr(unsafe.Pointer(&spec)), 0, 0, 0); errno != 0 {
		return fmt.Errorf("arm the sampling timer: %w", errno)
	}
	for {
		err := t.rc.Read(t.readFn)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return ctx.Err()
		}
		if err != nil {
			return fmt.Errorf("wait for the sampling timer: %w", err)
		}
		switch t.readErr {
		case 0:
			return nil
		case unix.EINTR:
			continue
		}
		return fmt.Errorf("wait for the sampling timer: %w", t.readErr)
	}
}

package record

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/rbscope/rbscope/internal/procfs"
	"github.com/rbscope/rbscope/internal/proctree"
)

// child is a launched command under supervision. Every method is a no-op
// on a nil child (a --pid recording).
type child struct {
	cmd  *exec.Cmd
	pid  int
	done chan struct{} // closed once it exited (a zombie or gone)

	reapOnce sync.Once
	err      error // its exit status, once reaped
}

// launch starts argv (as the invoking user under sudo) and watches it.
func launch(argv []string) (*child, error) {
	cmd, err := proctree.Command(argv)
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", argv[0], err)
	}
	c := &child{cmd: cmd, pid: cmd.Process.Pid, done: make(chan struct{})}
	go c.watch()
	return c, nil
}

// watch notices the exit by polling the command's state, not with
// cmd.Wait: rbscope is also its tracer while pausing it, and a wait from
// another thread would take the ptrace stops. It is reaped (reap) once no
// pause can happen any more.
func (c *child) watch() {
	for {
		st, err := procfs.ReadStat(c.pid)
		if err != nil || st.Gone() {
			close(c.done)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Done is closed when the command exited; nil (never ready) without one.
func (c *child) Done() <-chan struct{} {
	if c == nil {
		return nil
	}
	return c.done
}

func (c *child) exited() bool {
	if c == nil {
		return false
	}
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// reap waits for the exit and collects the status.
func (c *child) reap() {
	if c == nil {
		return
	}
	c.reapOnce.Do(func() {
		<-c.done
		c.err = c.cmd.Wait()
	})
}

// forward passes a stop signal on to the command, unless the terminal
// already sent it there (a Ctrl-C typed in rbscope's foreground group).
func (c *child) forward(sig os.Signal) {
	if c == nil || c.exited() {
		return
	}
	if (sig == syscall.SIGINT || sig == syscall.SIGHUP) && proctree.InForeground() {
		return
	}
	_ = c.cmd.Process.Signal(sig)
}

// kill stops a command that must not outlive a failed start: SIGTERM,
// then SIGKILL after 3 s; and reaps it.
func (c *child) kill() {
	if c == nil {
		return
	}
	if !c.exited() {
		_ = c.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-c.done:
		case <-time.After(3 * time.Second):
			_ = c.cmd.Process.Kill()
			<-c.done
		}
	}
	c.reap()
}

// exitNote says how the command exited, for messages.
func (c *child) exitNote() string {
	if c == nil {
		return ""
	}
	err := c.err
	if err == nil {
		return " with status 0"
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return " (" + ee.ProcessState.String() + ")"
	}
	if errors.Is(err, syscall.ECHILD) {
		return "" // reaped while it was being paused: status unknown
	}
	return " (" + err.Error() + ")"
}

// settle waits a little for a command that was told to stop (sig), and
// says so when it leaves it running. Without sig (--duration ended the
// recording), the command goes on.
func (c *child) settle(sig os.Signal, say func(string, ...any)) {
	if c == nil {
		return
	}
	if c.exited() {
		c.reap()
		return
	}
	if sig == nil {
		say("%s (pid %d) is still running; rbscope leaves it running", c.cmd.Path, c.pid)
		return
	}
	select {
	case <-c.done:
		c.reap()
	case <-time.After(5 * time.Second):
		say("%s (pid %d) did not exit after %v; rbscope leaves it running", c.cmd.Path, c.pid, sig)
	}
}

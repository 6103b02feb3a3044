package faultcheck

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"
)

// ErrGone means the process no longer exists (or is a zombie, dead and not
// yet reaped).
var ErrGone = errors.New("faultcheck: process gone")

// State returns the state letter of process pid from /proc/<pid>/stat: R
// running, S sleeping, D disk wait, T stopped, t tracing stop, Z zombie and
// so on (proc(5)). A process that does not exist is ErrGone.
func State(pid int) (byte, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if errors.Is(err, fs.ErrNotExist) {
		return 0, ErrGone
	}
	if err != nil {
		return 0, fmt.Errorf("faultcheck: read the state of pid %d: %w", pid, err)
	}
	// "pid (comm) S ...": comm may hold spaces and parentheses, the state
	// follows the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return 0, fmt.Errorf("faultcheck: pid %d: unreadable stat %q", pid, b)
	}
	return b[i+2], nil
}

// interval is how often the waits look at /proc.
const interval = 2 * time.Millisecond

// wait polls pid's state until done says so or timeout passes; it returns
// the last state seen and whether done held.
func wait(pid int, timeout time.Duration, done func(byte, error) bool) (byte, error, bool) {
	deadline := time.Now().Add(timeout)
	for {
		s, err := State(pid)
		if done(s, err) {
			return s, err, true
		}
		if time.Now().After(deadline) {
			return s, err, false
		}
		time.Sleep(interval)
	}
}

func describe(s byte, err error) string {
	if err != nil {
		return err.Error()
	}
	return "state " + string(s)
}

// Stopped waits up to timeout for pid to be in state T (stopped by a
// signal) and returns how long that took; an error says the SIGSTOP did not
// take effect.
func Stopped(pid int, timeout time.Duration) (time.Duration, error) {
	begin := time.Now()
	s, err, ok := wait(pid, timeout, func(s byte, err error) bool { return err == nil && s == 'T' })
	if !ok {
		return 0, fmt.Errorf("faultcheck: pid %d was sent SIGSTOP but is not stopped after %v (%s): the fault did not take effect", pid, timeout, describe(s, err))
	}
	return time.Since(begin), nil
}

// Resumed waits up to timeout for pid to leave state T after a SIGCONT.
func Resumed(pid int, timeout time.Duration) (time.Duration, error) {
	begin := time.Now()
	s, err, ok := wait(pid, timeout, func(s byte, err error) bool { return err == nil && s != 'T' && s != 't' })
	if !ok {
		return 0, fmt.Errorf("faultcheck: pid %d was sent SIGCONT but is not running after %v (%s)", pid, timeout, describe(s, err))
	}
	return time.Since(begin), nil
}

// Killed checks that a process sent SIGKILL died of it: waitErr is what its
// exec.Cmd's Wait returned, which must say it was signalled with SIGKILL,
// and pid must be gone (Gone) within timeout. An error says the kill did not
// take effect, or was not what ended the process.
func Killed(pid int, waitErr error, timeout time.Duration) error {
	var ee *exec.ExitError
	if !errors.As(waitErr, &ee) {
		return fmt.Errorf("faultcheck: pid %d was sent SIGKILL, but it exited with %v: it was not the kill that ended it", pid, waitErr)
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		return fmt.Errorf("faultcheck: pid %d was sent SIGKILL, but it exited with %v: it was not the kill that ended it", pid, waitErr)
	}
	_, err := Gone(pid, timeout)
	return err
}

// Gone waits up to timeout for pid to be dead: absent from /proc or a
// zombie. An error says the kill did not take effect.
func Gone(pid int, timeout time.Duration) (time.Duration, error) {
	begin := time.Now()
	s, err, ok := wait(pid, timeout, func(s byte, err error) bool { return errors.Is(err, ErrGone) || (err == nil && (s == 'Z' || s == 'X')) })
	if !ok {
		return 0, fmt.Errorf("faultcheck: pid %d was killed but still exists after %v (%s): the fault did not take effect", pid, timeout, describe(s, err))
	}
	return time.Since(begin), nil
}

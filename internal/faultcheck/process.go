package faultcheck

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// stateTimeout is how long Pause and Resume wait for the process to change
// state.
const stateTimeout = 5 * time.Second

// Process is a child process started by Start, with the faults a test
// injects into it, each checked to have taken effect. A goroutine waits for
// it from the start, so its exit is seen at once (Done) and it does not
// linger as a zombie. Its methods may be called from any goroutine.
type Process struct {
	// Name names the process in Start's error and in its owner's
	// messages; the methods' errors leave the name for the owner to add.
	// Cmd is the started command, whose Process the owner may signal
	// directly. Neither changes after Start.
	Name string
	Cmd  *exec.Cmd

	done chan struct{} // closed once Wait has returned
	err  error         // what Wait returned, set before done is closed
}

// Start starts cmd, configured by the caller (output, environment,
// attributes), and waits for it on a goroutine that ends when it exits.
func Start(name string, cmd *exec.Cmd) (*Process, error) {
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Process{Name: name, Cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// Pid is the process's id; it stays valid after the process exits.
func (p *Process) Pid() int { return p.Cmd.Process.Pid }

// Done is closed once the process has exited and been reaped.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has exited and been reaped.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Err is what the process's Wait returned: nil for exit status 0, an
// *exec.ExitError otherwise. It is nil while the process runs.
func (p *Process) Err() error {
	if !p.Exited() {
		return nil
	}
	return p.err
}

// WaitFor waits up to timeout for the process to exit and reports whether
// it did.
func (p *Process) WaitFor(timeout time.Duration) bool {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.done:
		return true
	case <-t.C:
		return false
	}
}

// ExitCode is the process's exit code, as a shell reports it: 0 for
// success, the code it exited with, 128+n when signal n ended it; -1 while
// it runs or when its Wait failed otherwise.
func (p *Process) ExitCode() int {
	if !p.Exited() {
		return -1
	}
	if p.err == nil {
		return 0
	}
	var ee *exec.ExitError
	if !errors.As(p.err, &ee) {
		return -1
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ee.ExitCode()
}

// Signal sends sig unless the process has exited, which is not an error.
// It does not check the effect: Pause, Resume and Kill do.
func (p *Process) Signal(sig os.Signal) {
	if !p.Exited() {
		_ = p.Cmd.Process.Signal(sig)
	}
}

// Pause sends SIGSTOP and checks that the process is stopped (Stopped)
// within 5 s. A process that had already exited is an error: the fault
// did nothing.
func (p *Process) Pause() error {
	if p.Exited() {
		return fmt.Errorf("faultcheck: pid %d had already exited (%v) before SIGSTOP: the fault did nothing", p.Pid(), p.err)
	}
	p.Signal(syscall.SIGSTOP)
	_, err := Stopped(p.Pid(), stateTimeout)
	return err
}

// Resume sends SIGCONT and checks that the process left the stopped state
// (Resumed) within 5 s.
func (p *Process) Resume() error {
	p.Signal(syscall.SIGCONT)
	_, err := Resumed(p.Pid(), stateTimeout)
	return err
}

// Kill sends SIGKILL and checks, as Killed does, that the process died of
// it within timeout. A process that had already exited is an error: the
// fault did nothing.
func (p *Process) Kill(timeout time.Duration) error {
	if p.Exited() {
		return fmt.Errorf("faultcheck: pid %d had already exited (%v) before SIGKILL: the fault did nothing", p.Pid(), p.err)
	}
	p.Signal(syscall.SIGKILL)
	return p.Killed(timeout)
}

// Killed is the check to make once the process was sent SIGKILL, by Kill
// or by its owner: it waits up to timeout for the process to exit, then
// checks that SIGKILL ended it and that it is gone (the function Killed).
func (p *Process) Killed(timeout time.Duration) error {
	if !p.WaitFor(timeout) {
		return fmt.Errorf("sent SIGKILL, still running after %v: the fault did not take effect", timeout)
	}
	return Killed(p.Pid(), p.err, timeout)
}

// Stop kills the process, waking it first in case it is stopped, and
// returns once it is reaped. It checks nothing and does nothing to a process
// that has exited: it is the cleanup at the end of a test or a run.
func (p *Process) Stop() {
	p.Signal(syscall.SIGCONT)
	p.Signal(syscall.SIGKILL)
	<-p.done
}

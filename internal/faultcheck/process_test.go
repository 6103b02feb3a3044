package faultcheck_test

import (
	"errors"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/baton-dev/baton/internal/faultcheck"
	"go.uber.org/goleak"
)

// TestMain checks that every Process's reaper goroutine ends with it.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// start starts name with args as a Process, stopped when the test ends.
func start(t *testing.T, name string, args ...string) *faultcheck.Process {
	t.Helper()
	p, err := faultcheck.Start(name, exec.Command(name, args...))
	if err != nil {
		t.Skipf("no %s(1): %v", name, err)
	}
	t.Cleanup(p.Stop)
	return p
}

// TestProcessFaults: a sleep paused, resumed and killed, each checked; a
// fault on the dead process is an error, not a pass.
func TestProcessFaults(t *testing.T) {
	p := start(t, "sleep", "60")
	if p.Exited() || p.Err() != nil || p.ExitCode() != -1 {
		t.Fatalf("running: Exited %v, Err %v, ExitCode %d; want false, nil, -1", p.Exited(), p.Err(), p.ExitCode())
	}
	if err := p.Killed(50 * time.Millisecond); err == nil {
		t.Fatal("Killed: a process never sent SIGKILL passed as killed")
	}
	if err := p.Pause(); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	if s, err := faultcheck.State(p.Pid()); err != nil || s != 'T' {
		t.Fatalf("after Pause: state %q, %v; want T", s, err)
	}
	if err := p.Resume(); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	if err := p.Pause(); err != nil {
		t.Fatalf("Pause again: %v", err)
	}
	// SIGKILL ends a stopped process too.
	if err := p.Kill(5 * time.Second); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	select {
	case <-p.Done():
	default:
		t.Fatal("Done not closed after Kill")
	}
	if got, want := p.ExitCode(), 128+int(syscall.SIGKILL); got != want {
		t.Errorf("ExitCode after Kill: got %d, want %d", got, want)
	}
	var ee *exec.ExitError
	if !errors.As(p.Err(), &ee) {
		t.Errorf("Err after Kill: got %v, want an *exec.ExitError", p.Err())
	}
	if _, err := faultcheck.State(p.Pid()); !errors.Is(err, faultcheck.ErrGone) {
		t.Errorf("State after Kill: %v, want ErrGone", err)
	}
	if err := p.Kill(5 * time.Second); err == nil {
		t.Error("Kill of a dead process passed: the fault did nothing")
	}
	if err := p.Pause(); err == nil {
		t.Error("Pause of a dead process passed: the fault did nothing")
	}
	p.Signal(syscall.SIGTERM) // no-op, no panic
}

// TestProcessExit: a process that ends by itself reports its exit code,
// and is not taken for one killed.
func TestProcessExit(t *testing.T) {
	cases := []struct {
		name   string
		script string
		code   int
	}{
		{name: "exit 0", script: "exit 0", code: 0},
		{name: "exit 3", script: "exit 3", code: 3},
		{name: "SIGTERM", script: "kill -TERM $$", code: 128 + int(syscall.SIGTERM)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := start(t, "sh", "-c", tc.script)
			if !p.WaitFor(5 * time.Second) {
				t.Fatal("did not exit within 5 s")
			}
			if got := p.ExitCode(); got != tc.code {
				t.Errorf("ExitCode: got %d, want %d (Err %v)", got, tc.code, p.Err())
			}
			if (p.Err() == nil) != (tc.code == 0) {
				t.Errorf("Err: got %v, want nil only for exit 0", p.Err())
			}
			if err := p.Killed(time.Second); err == nil {
				t.Error("Killed: a process that ended by itself passed as killed")
			}
		})
	}
}

// TestStartFails: a command that cannot start is an error naming it.
func TestStartFails(t *testing.T) {
	_, err := faultcheck.Start("ghost", exec.Command("/nonexistent/ghost"))
	if err == nil || !strings.HasPrefix(err.Error(), "start ghost: ") {
		t.Fatalf("Start: got %v, want an error starting with %q", err, "start ghost: ")
	}
}

package faultcheck_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/baton-dev/baton/internal/faultcheck"
)

// sleeper starts a process that would run for a minute; the test kills it.
func sleeper(t *testing.T) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Skipf("no sleep(1): %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd
}

// TestStopContKill: each check passes after its signal and fails loudly
// without it.
func TestStopContKill(t *testing.T) {
	cmd := sleeper(t)
	pid := cmd.Process.Pid
	if _, err := faultcheck.Stopped(pid, 50*time.Millisecond); err == nil {
		t.Fatal("Stopped: a running process passed as stopped (a no-op SIGSTOP would go unnoticed)")
	}
	if _, err := faultcheck.Gone(pid, 50*time.Millisecond); err == nil {
		t.Fatal("Gone: a running process passed as gone")
	}
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	if _, err := faultcheck.Stopped(pid, 5*time.Second); err != nil {
		t.Fatalf("after SIGSTOP: %v", err)
	}
	if _, err := faultcheck.Resumed(pid, 50*time.Millisecond); err == nil {
		t.Fatal("Resumed: a stopped process passed as running")
	}
	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if _, err := faultcheck.Resumed(pid, 5*time.Second); err != nil {
		t.Fatalf("after SIGCONT: %v", err)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	// Not reaped yet: a zombie counts as gone.
	if _, err := faultcheck.Gone(pid, 5*time.Second); err != nil {
		t.Fatalf("after SIGKILL, before wait: %v", err)
	}
	_ = cmd.Wait()
	if _, err := faultcheck.State(pid); !errors.Is(err, faultcheck.ErrGone) {
		t.Fatalf("State after reaping: %v, want ErrGone", err)
	}
}

// TestKilled: a process that died of SIGKILL passes; one that exited by
// itself, or of another signal, fails, so a kill that was not what ended
// the process is not taken for one.
func TestKilled(t *testing.T) {
	cases := []struct {
		name   string
		cmd    []string
		signal syscall.Signal // 0: none, the process exits by itself
		ok     bool
	}{
		{name: "SIGKILL", cmd: []string{"sleep", "60"}, signal: syscall.SIGKILL, ok: true},
		{name: "SIGTERM", cmd: []string{"sleep", "60"}, signal: syscall.SIGTERM},
		{name: "exit 0", cmd: []string{"true"}},
		{name: "exit 1", cmd: []string{"false"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(tc.cmd[0], tc.cmd[1:]...)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			if tc.signal != 0 {
				if err := cmd.Process.Signal(tc.signal); err != nil {
					t.Fatal(err)
				}
			}
			err := faultcheck.Killed(cmd.Process.Pid, cmd.Wait(), 5*time.Second)
			if (err == nil) != tc.ok {
				t.Errorf("Killed: got %v, want ok %v", err, tc.ok)
			}
		})
	}
}

// TestStateParsesOddNames: a command name with spaces and parentheses does
// not confuse the parser (the state follows the last ')').
func TestStateParsesOddNames(t *testing.T) {
	src, err := exec.LookPath("sleep")
	if err != nil {
		t.Skipf("no sleep(1): %v", err)
	}
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	odd := filepath.Join(t.TempDir(), "a) T (b")
	if err := os.WriteFile(odd, data, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(odd, "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	s, err := faultcheck.State(cmd.Process.Pid)
	if err != nil || (s != 'S' && s != 'R') {
		t.Fatalf("State(%q) = %q, %v; want S or R", odd, s, err)
	}
}

package main

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/baton-dev/baton/internal/freeport"
)

// buildBaton builds the binary once per test run.
func buildBaton(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	built.once.Do(func() {
		built.dir, built.err = os.MkdirTemp("", "baton-cmd-test-")
		if built.err != nil {
			return
		}
		built.bin = filepath.Join(built.dir, "baton")
		built.out, built.err = exec.Command("go", "build", "-o", built.bin, ".").CombinedOutput()
	})
	if built.err != nil {
		t.Fatalf("go build: %v\n%s", built.err, built.out)
	}
	return built.bin
}

// built is the binary buildBaton builds once for every test of the
// package; TestMain removes it.
var built struct {
	once     sync.Once
	dir, bin string
	out      []byte
	err      error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// startBaton starts the binary and returns a reader of its stdout lines.
func startBaton(t *testing.T, bin string, args ...string) (*exec.Cmd, *bufio.Scanner) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "BATON_LOG_LEVEL=warn")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	return cmd, bufio.NewScanner(stdout)
}

// waitLine reads lines until one matches re, with a deadline.
func waitLine(t *testing.T, sc *bufio.Scanner, re *regexp.Regexp, timeout time.Duration) []string {
	t.Helper()
	found := make(chan []string, 1)
	go func() {
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				found <- m
				for sc.Scan() { // keep the pipe drained
				}
				return
			}
		}
		close(found)
	}()
	select {
	case m, ok := <-found:
		if !ok {
			t.Fatalf("output ended before a line matching %v", re)
		}
		return m
	case <-time.After(timeout):
		t.Fatalf("no line matching %v after %v", re, timeout)
	}
	return nil
}

// waitExit waits for cmd with a deadline and returns its exit code.
func waitExit(t *testing.T, cmd *exec.Cmd, timeout time.Duration) int {
	t.Helper()
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
		return cmd.ProcessState.ExitCode()
	case <-time.After(timeout):
		t.Fatalf("%v still running after %v", cmd.Args, timeout)
	}
	return -1
}

// freePort returns a TCP port that was free a moment ago (freeport.Get).
func freePort(t *testing.T) int {
	t.Helper()
	p, err := freeport.Get()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestNATSCommandStopsOnSIGINT(t *testing.T) {
	bin := buildBaton(t)
	cmd, sc := startBaton(t, bin, "nats", "--port", "-1", "--store-dir", t.TempDir())
	waitLine(t, sc, regexp.MustCompile(`^nats listening on nats://127\.0\.0\.1:\d+$`), 30*time.Second)
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if code := waitExit(t, cmd, 30*time.Second); code != 0 {
		t.Errorf("got exit code %d, want 0", code)
	}
}

// TestUpStopsEverything starts the stack, then SIGTERMs it: every worker must
// be gone and the exit code 0.
func TestUpStopsEverything(t *testing.T) {
	bin := buildBaton(t)
	cmd, sc := startBaton(t, bin, "up", "--nats-port", "-1", "--http-port", strconv.Itoa(freePort(t)),
		"--data-dir", t.TempDir(), "--workers", "2", "--mock-speedup-ratio", "100")
	var pids []int
	workerLine := regexp.MustCompile(`^\s+worker\s+pid (\d+)`)
	ready := regexp.MustCompile(`^Ctrl-C stops everything`)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	lines := make(chan string)
	go func() {
		defer close(lines)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			case <-ctx.Done():
				return
			}
		}
	}()
wait:
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("baton up ended before it was ready")
			}
			if m := workerLine.FindStringSubmatch(l); m != nil {
				pid, _ := strconv.Atoi(m[1])
				pids = append(pids, pid)
			}
			if ready.MatchString(l) {
				break wait
			}
		case <-ctx.Done():
			t.Fatal("baton up not ready after 60s")
		}
	}
	if len(pids) != 2 {
		t.Fatalf("got worker pids %v, want 2", pids)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := waitExit(t, cmd, 60*time.Second); code != 0 {
		t.Errorf("got exit code %d, want 0", code)
	}
	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); err == nil {
			t.Errorf("worker pid %d still running after baton up exited", pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// TestWrongNATSPasswordExits2: a component whose NATS server refuses its
// credentials exits 2 at once with a one-line reason that says so, rather
// than waiting for a server as if none were there.
func TestWrongNATSPasswordExits2(t *testing.T) {
	bin := buildBaton(t)
	_, sc := startBaton(t, bin, "nats", "--port", "-1", "--store-dir", t.TempDir(), "--user", "alice", "--password", "right")
	m := waitLine(t, sc, regexp.MustCompile(`^nats listening on (nats://127\.0\.0\.1:\d+)$`), 30*time.Second)
	for _, args := range [][]string{
		{"worker", "--nats", m[1], "--nats-user", "alice", "--nats-password", "wrong"},
		{"frontend", "--nats", m[1], "--http-port", strconv.Itoa(freePort(t))},
		{"replay", "some-id", "--nats", m[1], "--nats-user", "alice", "--nats-password", "wrong"},
	} {
		cmd := exec.Command(bin, args...)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		cmd.Env = append(os.Environ(), "BATON_LOG_LEVEL=warn")
		start := time.Now()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		code := waitExit(t, cmd, 30*time.Second)
		took := time.Since(start)
		if code != 2 {
			t.Errorf("baton %s: exit %d, want 2; stderr:\n%s", args[0], code, stderr.String())
		}
		if took > 3*time.Second {
			t.Errorf("baton %s: exited after %v, want at once (a missing server is waited for 10s)", args[0], took)
		}
		lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
		if len(lines) != 1 || !strings.Contains(lines[0], "refused the connection (authentication)") ||
			!strings.Contains(strings.ToLower(lines[0]), "authorization violation") {
			t.Errorf("baton %s: stderr %q, want one line saying the server refused the credentials", args[0], stderr.String())
		}
		t.Logf("baton %s: exit %d after %v: %s", args[0], code, took.Round(time.Millisecond), lines[0])
	}
}

package integration

import (
	"context"
	"math/rand/v2"
	"net"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/baton-dev/baton/services/engine"
	"github.com/nats-io/nats.go"
	"github.com/openai/openai-go/v3"
)

// TestUpServesAndStopsOnSIGINT runs `baton up`, serves a chat completion
// through it with the OpenAI SDK, then sends SIGINT (Ctrl-C): it exits 0 and
// leaves no worker process behind.
func TestUpServesAndStopsOnSIGINT(t *testing.T) {
	port := freePort(t)
	up := start(t, "up", nil, "up", "--nats-port", "-1", "--http-port", strconv.Itoa(port),
		"--data-dir", filepath.Join(t.TempDir(), "data"), "--workers", "2", "--mock-speedup-ratio", "50")
	url := "http://127.0.0.1:" + strconv.Itoa(port)
	waitFor(t, 60*time.Second, "baton up to be healthy with two workers", func() bool {
		resp, err := http.Get(url + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200 && strings.Count(up.output(), "worker     pid") == 2
	})
	var pids []int
	for _, m := range regexp.MustCompile(`worker\s+pid (\d+)`).FindAllStringSubmatch(up.output(), -1) {
		pid, _ := strconv.Atoi(m[1])
		pids = append(pids, pid)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := client(url)
	resp, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model:     "mock",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello from up")},
		MaxTokens: openai.Int(12),
	})
	if err != nil {
		t.Fatalf("chat through baton up: %v", err)
	}
	if want := engine.MockText("user: hello from up", 0, 12); resp.Choices[0].Message.Content != want {
		t.Errorf("content %q, want %q", resp.Choices[0].Message.Content, want)
	}
	up.signal(syscall.SIGINT)
	if code := up.wait(60 * time.Second); code != 0 {
		t.Errorf("baton up exited %d after SIGINT, want 0", code)
	}
	if len(pids) != 2 {
		t.Fatalf("worker pids %v, want 2", pids)
	}
	for _, pid := range pids {
		if syscall.Kill(pid, 0) == nil {
			t.Errorf("worker pid %d still running after baton up exited", pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// upStack runs `baton up` on free ports with extra args and waits until it
// has printed its banner and serves /health with its workers ready.
func upStack(t *testing.T, dataDir string, args ...string) (*proc, *frontend, int) {
	t.Helper()
	port, natsPort := freePort(t), freePort(t)
	all := append([]string{"up", "--nats-port", strconv.Itoa(natsPort), "--http-port", strconv.Itoa(port),
		"--data-dir", dataDir, "--mock-speedup-ratio", "50"}, args...)
	up := start(t, "up", nil, all...)
	f := &frontend{proc: up, url: "http://127.0.0.1:" + strconv.Itoa(port)}
	waitFor(t, 60*time.Second, "baton up to be healthy", func() bool {
		resp, err := http.Get(f.url + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200 && strings.Contains(up.output(), "Ctrl-C stops everything")
	})
	return up, f, natsPort
}

func stopUp(t *testing.T, up *proc) {
	t.Helper()
	up.signal(syscall.SIGINT)
	if code := up.wait(60 * time.Second); code != 0 {
		t.Fatalf("baton up exited %d after SIGINT, want 0", code)
	}
}

// TestUpFlags: `baton up` listens on loopback and says so; --system-port
// gives each worker a status server; --user/--password make the embedded
// server require that login (the frontend and workers use it); the store
// persists across restarts, and --fresh starts empty.
func TestUpFlags(t *testing.T) {
	t.Parallel() // no timing bound of its own
	dataDir := filepath.Join(t.TempDir(), "data")
	sys := freePortPair(t)
	up, f, natsPort := upStack(t, dataDir, "--system-port", strconv.Itoa(sys), "--user", "alice", "--password", "s3cret")
	httpPort := strings.TrimPrefix(f.url, "http://127.0.0.1:")
	for _, want := range []string{
		"frontend   pid " + strconv.Itoa(up.Pid()),
		"listening on 127.0.0.1:" + httpPort + "\n",
		"listening on 127.0.0.1:" + strconv.Itoa(natsPort) + " (store " + filepath.Join(dataDir, "nats") + ", user alice)",
		"up-w1 (model mock, status http://127.0.0.1:" + strconv.Itoa(sys) + ")",
		"up-w2 (model mock, status http://127.0.0.1:" + strconv.Itoa(sys+1) + ")",
	} {
		if !strings.Contains(up.output(), want) {
			t.Errorf("banner lacks %q:\n%s", want, up.output())
		}
	}
	f.waitRoutable(t, "up-w1", "up-w2")
	for _, p := range []int{sys, sys + 1} {
		resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(p) + "/live")
		if err != nil {
			t.Fatalf("worker status server on %d: %v", p, err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("worker status server on %d: /live %d, want 200", p, resp.StatusCode)
		}
	}
	natsURL := "nats://127.0.0.1:" + strconv.Itoa(natsPort)
	if nc, err := nats.Connect(natsURL); err == nil {
		nc.Close()
		t.Error("connected to up's NATS without credentials, want an authorization error")
	} else if !strings.Contains(strings.ToLower(err.Error()), "authorization") {
		t.Errorf("connect without credentials: %v, want an authorization error", err)
	}
	nc, err := nats.Connect(natsURL, nats.UserInfo("alice", "s3cret"))
	if err != nil {
		t.Fatalf("connect with up's credentials: %v", err)
	}
	nc.Close()

	const id = "up-flags-1"
	resp := post(t, f.url+"/v1/completions", map[string]any{"model": "mock", "prompt": "remember me", "max_tokens": 5},
		map[string]string{"X-Request-Id": id})
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("completion through up: status %d", resp.StatusCode)
	}
	stopUp(t, up)

	status := func(f *frontend) int {
		t.Helper()
		resp, err := http.Get(f.url + "/v1/requests/" + id)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	up, f, _ = upStack(t, dataDir, "--workers", "1", "--user", "alice", "--password", "s3cret")
	if got := status(f); got != 200 {
		t.Errorf("after a restart: GET /v1/requests/%s = %d, want 200 (the store persists)", id, got)
	}
	stopUp(t, up)
	up, f, _ = upStack(t, dataDir, "--workers", "1", "--fresh")
	if got := status(f); got != 404 {
		t.Errorf("after a restart with --fresh: GET /v1/requests/%s = %d, want 404 (an empty store)", id, got)
	}
	stopUp(t, up)
}

// freePortPair returns a port p such that p and p+1 were both free a moment
// ago. It looks below the kernel's ephemeral range (32768 and up on Linux),
// where no listener on port 0 and no outgoing connection of the other tests
// is given a port: in a CI run a pair from the ephemeral range was taken
// before baton up listened on it ("address already in use").
func freePortPair(t *testing.T) int {
	t.Helper()
	free := func(p int) bool {
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err == nil {
			l.Close()
		}
		return err == nil
	}
	for range 100 {
		p := 20000 + rand.IntN(12000)
		if free(p) && free(p+1) {
			return p
		}
	}
	t.Fatal("no two consecutive free ports")
	return 0
}

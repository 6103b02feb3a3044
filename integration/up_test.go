package integration

import (
	"context"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/baton-dev/baton/services/engine"
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

package integration

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

// Issue 22: real upstreams as they are. Each test is one of its numbered
// failures, against the vLLM simulator set up as the upstream that showed it.

// healthOf is GET /health's status code and body.
func healthOf(t testing.TB, fe *frontend) (int, map[string]any) {
	t.Helper()
	resp, err := http.Get(fe.url + "/health")
	if err != nil {
		t.Fatalf("GET /health: %v", err)
	}
	defer resp.Body.Close()
	var body map[string]any
	_ = decodeJSON(resp.Body, &body)
	return resp.StatusCode, body
}

// TestUpstreamListingIsAdvisory (failure 1): an upstream that lists
// "tiny:latest" while serving "tiny" (Ollama) serves; one that does not
// serve the model at all leaves its worker not ready in the server's words,
// and /health says 503 while every worker is not ready.
func TestUpstreamListingIsAdvisory(t *testing.T) {
	ollama := startSim(t, "ollama-like", "--model", "tiny", "--listed-model", "tiny:latest", "--greedy")
	s := newStack(t)
	fe := s.frontend(nil)
	s.worker("wrong", "--engine", "openai", "--openai-url", ollama.url, "--openai-model", "huge", "--model", "tiny")
	waitFor(t, 20*time.Second, "worker wrong not ready", func() bool {
		ws, err := fe.workers()
		return err == nil && len(ws) == 1 && ws[0].State == "not_ready"
	})
	ws, _ := fe.workers()
	if r := ws[0].Reason; !strings.Contains(r, "404") || !strings.Contains(r, "huge") {
		t.Errorf("reason %q, want the server's 404 for model huge", r)
	}
	if code, body := healthOf(t, fe); code != http.StatusServiceUnavailable || body["reason"] != "no_routable_workers" {
		t.Errorf("/health with every worker not ready: %d %v, want 503 no_routable_workers", code, body)
	}

	s.worker("tiny", "--engine", "openai", "--openai-url", ollama.url, "--openai-model", "tiny", "--model", "tiny")
	fe.waitRoutable(t, "tiny")
	if code, body := healthOf(t, fe); code != http.StatusOK {
		t.Errorf("/health with a ready worker: %d %v, want 200", code, body)
	}
	body := chatRequest("hello there", 5, map[string]any{"model": "tiny"})
	res := postStream(t, fe.url, "/v1/chat/completions", body, nil, nil)
	if !res.done || res.header.Get("X-Worker-Id") != "tiny" {
		t.Errorf("request: done %v on %q, want done on tiny", res.done, res.header.Get("X-Worker-Id"))
	}
}

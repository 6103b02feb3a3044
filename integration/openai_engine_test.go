package integration

import (
	"strconv"
	"testing"

	"github.com/baton-dev/baton/services/engine"
)

// TestOpenAIEngineThroughAnotherBaton runs a worker with --engine openai
// whose OpenAI-compatible server is another baton frontend (backed by mock
// workers): a request through the first frontend reaches the mock engine
// through two hops and its text comes back byte for byte. The OpenAI engine
// counts one token per streamed event of its server, so the relay's token
// offsets follow the upstream's events, not the mock's words.
func TestOpenAIEngineThroughAnotherBaton(t *testing.T) {
	_, upstream := startBasic(t)
	s := newStack(t)
	fe := s.frontend(nil)
	s.worker("oa1", "--engine", "openai", "--openai-url", upstream.url, "--openai-model", "mock", "--model", "relay")
	fe.waitRoutable(t, "oa1")
	prompt := "relayed through two frontends"
	res := postStream(t, fe.url, "/v1/completions", map[string]any{"model": "relay", "prompt": prompt, "max_tokens": 40},
		map[string]string{"X-Request-Id": "relay-1"}, nil)
	if !res.done || res.finish != "length" {
		t.Fatalf("done=%v finish=%q error=%s", res.done, res.finish, res.errorBody)
	}
	if want := engine.MockText(prompt, 0, 40); res.text != want {
		t.Fatalf("relayed text differs:\n got %q\nwant %q", res.text, want)
	}
	prev := 0
	for _, e := range res.events {
		n, err := strconv.Atoi(e.id)
		if err != nil || n < prev {
			t.Fatalf("bad id sequence at %q after %d", e.id, prev)
		}
		prev = n
	}
	if st := fe.state(t, "relay-1"); st.TokensGenerated != prev || st.Status != "completed" {
		t.Errorf("state %+v, want completed with %d tokens (the last SSE id)", st, prev)
	}
}

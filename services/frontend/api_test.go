package frontend_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/baton-dev/baton/services/engine"
)

// TestCompletionRetryAndChoices: a create under a known id is a retry (the
// same answer) only with the same body and endpoint, a 409 otherwise; a
// create of n choices runs one child per choice under a parent that lists
// them, and the parent cannot be resumed as one stream.
func TestCompletionRetryAndChoices(t *testing.T) {
	url := inProcess(t, engine.MockConfig{SpeedupRatio: 1e9})
	// Valid on both endpoints, so that the retry check, not the parser, refuses it.
	const chat = `{"model":"mock","prompt":"retry me","messages":[{"role":"user","content":"retry me"}],"max_tokens":3}`
	hdr := map[string]string{"X-Request-Id": "c-1"}
	code, first := call(t, http.MethodPost, url+"/v1/chat/completions", chat, hdr)
	if code != http.StatusOK {
		t.Fatalf("create: %d %s", code, first)
	}
	code, again := call(t, http.MethodPost, url+"/v1/chat/completions", chat, hdr)
	if code != http.StatusOK || mustJSON(t, decode(t, again)["choices"]) != mustJSON(t, decode(t, first)["choices"]) {
		t.Errorf("retry: %d %s, want the first answer %s", code, again, first)
	}
	for _, tc := range []struct{ name, path, body string }{
		{"another body", "/v1/chat/completions", `{"model":"mock","messages":[{"role":"user","content":"other"}],"max_tokens":3}`},
		{"another endpoint", "/v1/completions", chat},
	} {
		code, body := call(t, http.MethodPost, url+tc.path, tc.body, hdr)
		if code != http.StatusConflict || errorOf(t, body)["code"] != "request_id_conflict" {
			t.Errorf("%s under the id: %d %s, want 409 request_id_conflict", tc.name, code, body)
		}
	}

	const two = `{"model":"mock","prompt":"two ways","max_tokens":3,"n":2}`
	code, body := call(t, http.MethodPost, url+"/v1/completions", two, map[string]string{"X-Request-Id": "g-1"})
	choices, _ := decode(t, body)["choices"].([]any)
	if code != http.StatusOK || len(choices) != 2 {
		t.Fatalf("n=2: %d %s, want two choices", code, body)
	}
	want := engine.MockText("two ways", 0, 3)
	for i, c := range choices {
		if text, _ := c.(map[string]any)["text"].(string); text != want {
			t.Errorf("choice %d: %q, want the mock's %q", i, text, want)
		}
	}
	_, state := call(t, http.MethodGet, url+"/v1/requests/g-1", "", nil)
	if got := mustJSON(t, decode(t, state)["children"]); got != `["g-1-0","g-1-1"]` {
		t.Errorf("the group's children: %s, want g-1-0 and g-1-1", got)
	}
	if code, body := call(t, http.MethodGet, url+"/v1/requests/g-1/stream", "", nil); code != http.StatusBadRequest || errorOf(t, body)["code"] != "group_request" {
		t.Errorf("resume the group: %d %s, want 400 group_request", code, body)
	}
	if code, body := call(t, http.MethodGet, url+"/v1/requests/g-1-1/stream", "", nil); code != http.StatusOK || !strings.Contains(body, "data: [DONE]") {
		t.Errorf("resume a choice: %d %s, want its whole stream", code, body)
	}
	long := strings.Repeat("x", 121)
	if code, body := call(t, http.MethodPost, url+"/v1/completions", two, map[string]string{"X-Request-Id": long}); code != http.StatusBadRequest || errorOf(t, body)["code"] != "invalid_request_id" {
		t.Errorf("n=2 under a 121-character id: %d %s, want 400 invalid_request_id", code, body)
	}
}

// TestProbesAndWorkers: /live answers while the process runs, /v1/workers
// lists the discovery view (unredacted on an open API).
func TestProbesAndWorkers(t *testing.T) {
	url := inProcess(t, engine.MockConfig{SpeedupRatio: 1e9})
	if code, body := call(t, http.MethodGet, url+"/live", "", nil); code != http.StatusOK || decode(t, body)["status"] != "live" {
		t.Errorf("/live: %d %s", code, body)
	}
	code, body := call(t, http.MethodGet, url+"/v1/workers", "", nil)
	data, _ := decode(t, body)["data"].([]any)
	if code != http.StatusOK || len(data) != 1 {
		t.Fatalf("/v1/workers: %d %s, want one worker", code, body)
	}
	if w, _ := data[0].(map[string]any); w["id"] != "w1" || w["model"] != "mock" {
		t.Errorf("/v1/workers: %s, want w1 serving mock", body)
	}
}

package integration

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
)

// TestBadInput sends malformed and invalid requests while a good stream is
// running: each gets an OpenAI-style error body with the right status and an
// X-Request-Id, and the good stream is undisturbed.
func TestBadInput(t *testing.T) {
	_, fe := startBasic(t)
	var wg sync.WaitGroup
	var good sseResult
	wg.Add(1)
	go func() {
		defer wg.Done()
		good = postStream(t, fe.url, "/v1/completions", map[string]any{"model": "mock", "prompt": "still fine", "max_tokens": 200}, nil, nil)
	}()
	huge := strings.Repeat("word ", 40000)
	for _, c := range []struct {
		name, path, body string
		header           map[string]string
		status           int
		code             string
	}{
		{"malformed json", "/v1/chat/completions", `{"model": "mock", "messages": [`, nil, 400, "invalid_json"},
		{"not an object", "/v1/chat/completions", `[1,2,3]`, nil, 400, "invalid_type"},
		{"trailing data", "/v1/completions", `{"model":"mock","prompt":"a"} {}`, nil, 400, "invalid_json"},
		{"wrong type max_tokens", "/v1/completions", `{"model":"mock","prompt":"a","max_tokens":"ten"}`, nil, 400, "invalid_type"},
		{"wrong type model", "/v1/completions", `{"model":5,"prompt":"a"}`, nil, 400, "invalid_type"},
		{"missing model", "/v1/completions", `{"prompt":"a"}`, nil, 400, "missing_model"},
		{"missing messages", "/v1/chat/completions", `{"model":"mock"}`, nil, 400, "missing_messages"},
		{"empty messages", "/v1/chat/completions", `{"model":"mock","messages":[]}`, nil, 400, "invalid_value"},
		{"bad role", "/v1/chat/completions", `{"model":"mock","messages":[{"role":"wizard","content":"x"}]}`, nil, 400, "invalid_value"},
		{"missing prompt", "/v1/completions", `{"model":"mock"}`, nil, 400, "missing_prompt"},
		{"token prompt", "/v1/completions", `{"model":"mock","prompt":[1,2,3]}`, nil, 400, "invalid_type"},
		{"negative max_tokens", "/v1/completions", `{"model":"mock","prompt":"a","max_tokens":-5}`, nil, 400, "invalid_value"},
		{"zero max_tokens", "/v1/completions", `{"model":"mock","prompt":"a","max_tokens":0}`, nil, 400, "invalid_value"},
		{"huge max_tokens", "/v1/completions", `{"model":"mock","prompt":"a","max_tokens":100000000}`, nil, 400, "invalid_value"},
		{"overflowing max_tokens", "/v1/completions", `{"model":"mock","prompt":"a","max_tokens":1e30}`, nil, 400, "invalid_type"},
		{"bad n", "/v1/completions", `{"model":"mock","prompt":"a","n":0}`, nil, 400, "invalid_value"},
		{"unknown model", "/v1/completions", `{"model":"gpt-9","prompt":"a"}`, nil, 404, "model_not_found"},
		{"prompt too large", "/v1/completions", `{"model":"mock","prompt":"` + huge + `"}`, nil, 413, "prompt_too_large"},
		{"body too large", "/v1/completions", `{"model":"mock","prompt":"` + strings.Repeat("x", 2<<20) + `"}`, nil, 413, "request_too_large"},
		{"bad request id", "/v1/completions", `{"model":"mock","prompt":"a"}`, map[string]string{"X-Request-Id": "no spaces allowed"}, 400, "invalid_request_id"},
		{"unknown parent", "/v1/completions", `{"model":"mock","prompt":"a"}`, map[string]string{"X-Parent-Request-Id": "nobody"}, 404, "parent_not_found"},
		{"unknown pinned worker", "/v1/completions", `{"model":"mock","prompt":"a"}`, map[string]string{"X-Worker-Id": "w9"}, 404, "worker_not_found"},
		{"bad Last-Event-ID", "/v1/completions", `{"model":"mock","prompt":"a"}`, map[string]string{"Last-Event-ID": "x"}, 400, "invalid_offset"},
	} {
		t.Run(c.name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodPost, fe.url+c.path, bytes.NewReader([]byte(c.body)))
			req.Header.Set("Content-Type", "application/json")
			for k, v := range c.header {
				req.Header.Set(k, v)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			checkErrorResponse(t, resp, c.status, c.code)
		})
	}
	for _, c := range []struct {
		name, method, path string
		status             int
		code               string
	}{
		{"unknown request", "GET", "/v1/requests/nope", 404, "request_not_found"},
		{"unknown resume", "GET", "/v1/requests/nope/stream", 404, "request_not_found"},
		{"unknown cancel", "POST", "/v1/requests/nope/cancel", 404, "request_not_found"},
		{"unknown route", "GET", "/v2/whatever", 404, "not_found"},
	} {
		t.Run(c.name, func(t *testing.T) {
			req, _ := http.NewRequest(c.method, fe.url+c.path, nil)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			checkErrorResponse(t, resp, c.status, c.code)
		})
	}
	wg.Wait()
	checkComplete(t, good, "still fine", 200)
}

func checkErrorResponse(t *testing.T, resp *http.Response, status int, code string) {
	t.Helper()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != status {
		t.Fatalf("status %d, want %d: %s", resp.StatusCode, status, body)
	}
	var e struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Code    string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil || e.Error.Message == "" || e.Error.Type == "" {
		t.Fatalf("not an OpenAI error body: %s", body)
	}
	if e.Error.Code != code {
		t.Errorf("code %q, want %q (%s)", e.Error.Code, code, e.Error.Message)
	}
	if resp.Header.Get("X-Request-Id") == "" && strings.HasPrefix(resp.Request.URL.Path, "/v1/") {
		t.Errorf("no X-Request-Id header")
	}
}

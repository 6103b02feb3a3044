package vllmsim

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestSlotsQueueSendsNothing: with one slot, a second request waits in the
// queue without even its response headers, and runs once the first ends; a
// client that leaves the queue frees its place.
func TestSlotsQueueSendsNothing(t *testing.T) {
	s := New(Config{Model: "m", Slots: 1, Greedy: true, TTFT: time.Hour})
	srv := httptest.NewServer(s)
	defer srv.Close()
	ctx1, cancel1 := context.WithCancel(t.Context())
	defer cancel1()
	first := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx1, http.MethodPost, srv.URL+"/v1/completions", strings.NewReader(`{"model":"m","prompt":"hi","max_tokens":3,"stream":true}`))
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			_, err = bufio.NewReader(resp.Body).ReadString('\n')
			resp.Body.Close()
		}
		first <- err
	}()
	waitSim(t, "the first generation", func() bool { return s.Status().Running == 1 })

	headers := make(chan int, 1)
	ctx2, cancel2 := context.WithCancel(t.Context())
	defer cancel2()
	go func() {
		req, _ := http.NewRequestWithContext(ctx2, http.MethodPost, srv.URL+"/v1/completions", strings.NewReader(`{"model":"m","prompt":"hi","max_tokens":3,"stream":true}`))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			headers <- -1
			return
		}
		headers <- resp.StatusCode
		<-ctx2.Done() // keep the answer open: closing it would abort the generation
		resp.Body.Close()
	}()
	waitSim(t, "the second request queued", func() bool { return s.Status().Queued == 1 })
	select {
	case code := <-headers:
		t.Fatalf("a queued request got headers (%d) before a slot freed", code)
	default:
	}
	cancel1() // the first client leaves: its slot frees
	<-first
	waitSim(t, "the second request running", func() bool { st := s.Status(); return st.Queued == 0 && st.Running == 1 })
	if code := <-headers; code != http.StatusOK {
		t.Fatalf("second request: status %d, want 200 once it runs", code)
	}
}

// TestListedModelDiffers: /v1/models lists ListedModel; requests may name
// it or Model.
func TestListedModelDiffers(t *testing.T) {
	_, url := sim(t, Config{Model: "tiny", ListedModel: "tiny:latest", Greedy: true})
	resp, err := http.Get(url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil || len(list.Data) != 1 || list.Data[0].ID != "tiny:latest" {
		t.Fatalf("GET /v1/models = %+v, %v; want tiny:latest", list, err)
	}
	resp.Body.Close()
	for _, model := range []string{"tiny", "tiny:latest"} {
		if r := call(t, url, "/v1/completions", map[string]any{"model": model, "prompt": "hi", "max_tokens": 2}, nil); r.StatusCode != http.StatusOK {
			t.Errorf("model %q: status %d, want 200", model, r.StatusCode)
		}
	}
	if r := call(t, url, "/v1/completions", map[string]any{"model": "other", "prompt": "hi", "max_tokens": 2}, nil); r.StatusCode != http.StatusNotFound {
		t.Errorf("model other: status %d, want 404", r.StatusCode)
	}
}

// TestTemplatedCompletions: a completions prompt is answered as the chat
// answer to that prompt as a user turn, so that prompt + a partial answer
// does not continue the answer.
func TestTemplatedCompletions(t *testing.T) {
	_, url := sim(t, Config{TemplatedCompletions: true, Greedy: true})
	text := func(path string, body map[string]any) string {
		t.Helper()
		m := decode(t, call(t, url, path, body, nil))
		ch := m["choices"].([]any)[0].(map[string]any)
		if s, ok := ch["text"].(string); ok {
			return s
		}
		return ch["message"].(map[string]any)["content"].(string)
	}
	completion := text("/v1/completions", map[string]any{"model": "sim", "prompt": "tell me", "max_tokens": 8})
	chat := text("/v1/chat/completions", map[string]any{"model": "sim", "messages": []map[string]any{{"role": "user", "content": "tell me"}}, "max_tokens": 8})
	if completion != chat {
		t.Fatalf("templated completion %q, want the chat answer %q", completion, chat)
	}
	cut := len(completion) / 2
	rest := text("/v1/completions", map[string]any{"model": "sim", "prompt": "tell me" + completion[:cut], "max_tokens": 8})
	if strings.HasPrefix(completion[cut:], rest) && rest != "" {
		t.Fatalf("prompt + prefix %q continued the answer (%q): a templated server must not", completion[:cut], rest)
	}
}

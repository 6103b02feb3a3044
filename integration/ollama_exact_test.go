package integration

import (
	"strings"
	"testing"
)

// ollamaPrefillModelfile is ollamaModelfile with a template that continues
// a final assistant message (no <|im_end|> after it, no new turn), as the
// templates of models that take prefill on Ollama do.
const ollamaPrefillModelfile = `FROM ./tiny.gguf
TEMPLATE """{{- range $i, $m := .Messages }}{{ $last := eq (len (slice $.Messages $i)) 1 }}<|im_start|>{{ $m.Role }}
{{ $m.Content }}{{ if and $last (eq $m.Role "assistant") }}{{ else }}<|im_end|>
{{ end }}{{ if and $last (ne $m.Role "assistant") }}<|im_start|>assistant
{{ end }}{{ end }}"""
PARAMETER num_thread 1
PARAMETER num_ctx 512
PARAMETER stop "<|im_end|>"
`

// TestOllamaMigrationApproximate: kill -9 of the worker serving a greedy
// chat from a real Ollama whose template takes prefill; the other worker
// continues it by prefill (Ollama takes no token ids). Ollama reports usage
// only at the end of a stream, so the first attempt's prompt count is
// unknown and the continuation cannot be shown exact: the final chunk and
// GET /v1/requests/{id} say exact:false. Whether this model's text
// diverges at the cut is logged.
func TestOllamaMigrationApproximate(t *testing.T) {
	ol := startOllamaModel(t, "ollama", ollamaPrefillModelfile)
	s := newStack(t)
	fe := s.frontend(nil, "--migration-limit", "2")
	for _, id := range []string{"ol1", "ol2"} {
		s.worker(id, "--engine", "openai", "--openai-url", ol.url, "--openai-model", "tiny", "--model", "tiny")
	}
	fe.waitRoutable(t, "ol1", "ol2")
	var workers struct {
		Data []struct {
			Capabilities map[string]bool `json:"capabilities"`
		} `json:"data"`
	}
	getJSON(t, fe.url+"/v1/workers", 200, &workers)
	t.Logf("Ollama's capabilities as probed: %v", workers.Data[0].Capabilities)
	if !workers.Data[0].Capabilities["prefill"] {
		t.Fatal("the probe found no prefill with this model and its template (the Modelfile above sets one that takes it): no continuation to mark")
	}
	body := map[string]any{"model": "tiny", "messages": []map[string]any{{"role": "user", "content": "tell me a story"}},
		"max_tokens": 400, "temperature": 0, "stream_options": map[string]any{"include_usage": true}}
	want := answerOf(t, post(t, ol.url+"/v1/chat/completions", body, nil))
	if want.completion < 60 {
		t.Fatalf("Ollama's greedy answer is %d tokens (%s): too short to kill mid-answer", want.completion, want.finish)
	}
	cut := min(150, want.completion/2) // the issue measured divergence from 100 prefilled tokens on
	res, _ := killMidAnswer(t, s, fe, "ollama-exact", body, cut, nil)
	if !res.done || res.errorBody != "" {
		t.Fatalf("answer after the kill: done %v, error %s", res.done, res.errorBody)
	}
	if exact, ok := finalMark(t, res); !ok || exact {
		t.Errorf("final chunk's baton.exact = %v (present %v), want false", exact, ok)
	}
	var st struct {
		Exact *bool `json:"exact"`
	}
	getJSON(t, fe.url+"/v1/requests/ollama-exact", 200, &st)
	if st.Exact == nil || *st.Exact {
		t.Errorf("GET /v1/requests/ollama-exact: exact %v, want false", st.Exact)
	}
	i := 0
	for i < len(res.text) && i < len(want.text) && res.text[i] == want.text[i] {
		i++
	}
	if res.text == want.text {
		t.Logf("killed at token %d of %d: this model's continuation equals the uninterrupted answer (%d bytes): no divergence shown", cut, want.completion, len(want.text))
	} else {
		t.Logf("killed at token %d of %d: diverged from the uninterrupted answer at byte %d of %d: %q vs %q", cut, want.completion, i, len(want.text),
			strings.TrimSpace(res.text[i:min(len(res.text), i+40)]), strings.TrimSpace(want.text[i:min(len(want.text), i+40)]))
	}
}

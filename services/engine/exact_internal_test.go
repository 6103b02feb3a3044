package engine

import (
	"encoding/json"
	"errors"
	"testing"
)

// TestExactOnlyRefusesPrefill: a continuation that must be exact goes from
// token ids where the server takes them, and is refused (ErrUnsupported)
// where it would be prefill, on chat and completions alike.
func TestExactOnlyRefusesPrefill(t *testing.T) {
	ids := Capabilities{Chat: true, Completions: true, TokenIDs: true, Prefill: true}
	text := Capabilities{Chat: true, Completions: true, Prefill: true}
	chat := Request{Endpoint: EndpointChat, Body: json.RawMessage(`{"messages":[{"role":"user","content":"hi"}]}`),
		StartOffset: 2, Generated: "a b", PromptIDs: []int{1, 2}, GeneratedIDs: []int{3, 4}, ExactOnly: true}
	completions := Request{Endpoint: EndpointCompletions, Body: json.RawMessage(`{"prompt":"hi"}`),
		StartOffset: 2, Generated: "a b", ExactOnly: true}
	for _, c := range []struct {
		name    string
		req     Request
		caps    Capabilities
		refused bool
		mode    string
	}{
		{"chat from token ids", chat, ids, false, ContinueTokenIDs},
		{"chat by prefill", chat, text, true, ContinuePrefill},
		{"completions by prefill", completions, ids, true, ContinuePrefill},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := buildUpstream(c.req, "m", 5, c.caps)
			if got := errors.Is(err, ErrUnsupported); got != c.refused {
				t.Errorf("refused %v (err %v), want %v", got, err, c.refused)
			}
			o := &OpenAI{caps: c.caps}
			if got := o.ContinuesWith(c.req); got != c.mode {
				t.Errorf("ContinuesWith %q, want %q", got, c.mode)
			}
			c.req.ExactOnly = false
			if _, _, err := buildUpstream(c.req, "m", 5, c.caps); err != nil {
				t.Errorf("without exact-only: %v", err)
			}
		})
	}
}

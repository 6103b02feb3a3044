package worker

import (
	"testing"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/services/engine"
)

// TestExactVerdict: token ids are exact at once; prefill is exact only
// when the engine's own prompt_tokens for the continuation are the
// original prompt's (an earlier engine's count) plus the tokens so far.
func TestExactVerdict(t *testing.T) {
	cont := events.Dispatch{StartOffset: 100, EnginePromptTokens: 33}
	str := func(b *bool) string {
		if b == nil {
			return "nil"
		}
		if *b {
			return "true"
		}
		return "false"
	}
	for _, c := range []struct {
		name       string
		mode       string
		d          events.Dispatch
		res        engine.Result
		start, end string
	}{
		{"first attempt", "", events.Dispatch{}, engine.Result{PromptTokens: 33}, "nil", "nil"},
		{"token ids", engine.ContinueTokenIDs, cont, engine.Result{}, "true", "true"},
		{"prefill taken token for token", engine.ContinuePrefill, cont, engine.Result{PromptTokens: 133}, "nil", "true"},
		{"prefill re-tokenized (Ollama: 137 for 33 + 100)", engine.ContinuePrefill, cont, engine.Result{PromptTokens: 137}, "nil", "false"},
		{"prefill, no usage", engine.ContinuePrefill, cont, engine.Result{}, "nil", "false"},
		{"prefill, the original prompt never counted", engine.ContinuePrefill, events.Dispatch{StartOffset: 100}, engine.Result{PromptTokens: 133}, "nil", "false"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := str(exactAtStart(c.mode)); got != c.start {
				t.Errorf("at start: got %s, want %s", got, c.start)
			}
			if got := str(exactAtEnd(c.mode, c.d, c.res)); got != c.end {
				t.Errorf("at end: got %s, want %s", got, c.end)
			}
		})
	}
}

// TestContinuationMode: an engine that is not a Continuer (the mock)
// continues exactly by construction.
func TestContinuationMode(t *testing.T) {
	mock, err := engine.NewMock(engine.MockConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if got := continuation(mock, events.Dispatch{}); got != "" {
		t.Errorf("first attempt: got %q, want none", got)
	}
	if got := continuation(mock, events.Dispatch{StartOffset: 4}); got != engine.ContinueTokenIDs {
		t.Errorf("mock continuation: got %q, want %q", got, engine.ContinueTokenIDs)
	}
}

// TestPromptTokensAfterMigration: a continuation reports the prompt in the
// server's tokens where any engine counted it, and on a prefill
// continuation with no earlier count its own server's count less the
// tokens so far (issue 35: 11 words were reported for a prompt Ollama
// counted as 33; its continuation counted 137 for it and 100 tokens).
func TestPromptTokensAfterMigration(t *testing.T) {
	out := &deltas{}
	for _, c := range []struct {
		name string
		d    events.Dispatch
		res  engine.Result
		want int
	}{
		{"first attempt: the server's usage", events.Dispatch{PromptTokens: 11}, engine.Result{PromptTokens: 33}, 33},
		{"continuation from ids", events.Dispatch{PromptTokens: 11, StartOffset: 100, PromptIDs: make([]int, 33)}, engine.Result{PromptTokens: 133}, 33},
		{"prefill after an engine counted the prompt", events.Dispatch{PromptTokens: 11, StartOffset: 100, EnginePromptTokens: 33}, engine.Result{PromptTokens: 137}, 33},
		{"prefill, no earlier count: the server's, less the tokens so far", events.Dispatch{PromptTokens: 11, StartOffset: 100}, engine.Result{PromptTokens: 137}, 37},
		{"prefill, no usage: the frontend's count", events.Dispatch{PromptTokens: 11, StartOffset: 100}, engine.Result{}, 11},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := promptTokens(c.d, c.res, out); got != c.want {
				t.Errorf("got %d, want %d", got, c.want)
			}
		})
	}
}

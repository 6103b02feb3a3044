package projections_test

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
)

// TestRequestEngineOutput: token ids, the prompt's ids and per-token
// details are kept in step with the tokens across overlapping deltas and
// a migration; a delta without ids ends token-id tracking; the engine's
// prompt count replaces the frontend's.
func TestRequestEngineOutput(t *testing.T) {
	d1 := delta(0, 0, "ab")
	d1.IDs, d1.PromptIDs = []int{10, 11}, []int{1, 2, 3}
	d1.Details = []json.RawMessage{nil, json.RawMessage(`{"refusal":"x"}`)}
	d2 := delta(0, 1, "bc") // overlaps one token
	d2.IDs = []int{11, 12}
	r := fold(stored(accepted(10), routed(0, "w1", 0), d1, d2, migrated(0, 3), routed(1, "w2", 3)))
	if ids, ok := r.TokenIDs(); !ok || !reflect.DeepEqual(ids, []int{10, 11, 12}) {
		t.Fatalf("ids %v %v, want [10 11 12]", ids, ok)
	}
	if !reflect.DeepEqual(r.PromptIDs, []int{1, 2, 3}) || r.PromptTokens() != 3 {
		t.Errorf("prompt ids %v, count %d", r.PromptIDs, r.PromptTokens())
	}
	if got := r.Details(1); len(got) != 2 || string(got[0]) != `{"refusal":"x"}` || got[1] != nil {
		t.Errorf("details from 1: %q", got)
	}
	d3 := delta(1, 3, "d")  // an engine without ids
	d3.PromptIDs = []int{9} // a continuation's prompt: not the request's
	r = fold(stored(accepted(10), routed(0, "w1", 0), d1, d2, migrated(0, 3), routed(1, "w2", 3), d3,
		events.RequestCompleted{RequestID: "r1", Attempt: 1, FinishReason: "stop", PromptTokens: 7, CompletionTokens: 4}))
	if _, ok := r.TokenIDs(); ok {
		t.Error("ids still known after a delta without them")
	}
	if !reflect.DeepEqual(r.PromptIDs, []int{1, 2, 3}) || r.PromptTokens() != 7 {
		t.Errorf("prompt ids %v, count %d; want the first attempt's ids and the completion's count", r.PromptIDs, r.PromptTokens())
	}
}

func TestWorkerCapabilities(t *testing.T) {
	vllm := &events.Capabilities{Chat: true, Completions: true, TokenIDs: true, Prefill: true}
	noIDs := &events.Capabilities{Chat: true, Completions: true, Prefill: true}
	chatOnlyNoPrefill := &events.Capabilities{Chat: true}
	ollama := &events.Capabilities{Chat: true, Completions: true, Prefill: true, CompletionsNotContinuable: true}
	for _, tc := range []struct {
		name             string
		caps             *events.Capabilities
		endpoint         string
		ids              bool
		serve, continues bool
	}{
		{"mock", nil, events.EndpointChat, false, true, true},
		{"vllm chat with ids", vllm, events.EndpointChat, true, true, true},
		{"no ids, prefill", noIDs, events.EndpointChat, true, true, true},
		{"chat only, no prefill", chatOnlyNoPrefill, events.EndpointChat, true, true, false},
		{"chat only, completions", chatOnlyNoPrefill, events.EndpointCompletions, false, false, false},
		{"completions without ids", noIDs, events.EndpointCompletions, false, true, true},
		{"chat-templated completions: serves, cannot continue", ollama, events.EndpointCompletions, false, true, false},
		{"chat-templated completions, chat prefill", ollama, events.EndpointChat, false, true, true},
	} {
		w := projections.Worker{Capabilities: tc.caps}
		if got := w.CanServe(tc.endpoint); got != tc.serve {
			t.Errorf("%s: CanServe = %v, want %v", tc.name, got, tc.serve)
		}
		if got := w.CanContinue(tc.endpoint, tc.ids); got != tc.continues {
			t.Errorf("%s: CanContinue = %v, want %v", tc.name, got, tc.continues)
		}
	}
}

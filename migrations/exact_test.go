package migrations_test

import (
	"strings"
	"testing"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/migrations"
	"github.com/baton-dev/baton/projections"
)

// TestContinuesExactly: a continuation is exact by construction from token
// ids on a worker that takes them, or on an engine without capabilities
// (the mock); prefill never is.
func TestContinuesExactly(t *testing.T) {
	ids := events.Dispatch{StartOffset: 2, PromptIDs: []int{1, 2}, GeneratedIDs: []int{3, 4}}
	text := events.Dispatch{StartOffset: 2, Generated: "a b"}
	vllm := &events.Capabilities{Chat: true, Completions: true, TokenIDs: true, Prefill: true}
	ollama := &events.Capabilities{Chat: true, Completions: true, Prefill: true, CompletionsNotContinuable: true}
	chatOnly := &events.Capabilities{Chat: true, TokenIDs: true, Prefill: true}
	for _, c := range []struct {
		name string
		caps *events.Capabilities
		d    events.Dispatch
		want bool
	}{
		{"mock, ids", nil, ids, true},
		{"mock, text only", nil, text, true},
		{"token ids", vllm, ids, true},
		{"token-id server, ids unknown: prefill", vllm, text, false},
		{"ids missing one", vllm, events.Dispatch{StartOffset: 3, PromptIDs: []int{1}, GeneratedIDs: []int{3, 4}}, false},
		{"no prompt ids", vllm, events.Dispatch{StartOffset: 2, GeneratedIDs: []int{3, 4}}, false},
		{"server without token ids: prefill", ollama, ids, false},
		{"token ids but no completions route", chatOnly, ids, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := migrations.ContinuesExactly(projections.Worker{Capabilities: c.caps}, c.d); got != c.want {
				t.Errorf("got %v, want %v", got, c.want)
			}
		})
	}
}

// TestStepExactOnly: with ExactOnly, a continuation's dispatch asks for an
// exact one (the fleet routes it only to workers that continue exactly,
// and the engine refuses prefill); a first dispatch never does, and
// without ExactOnly nothing does.
func TestStepExactOnly(t *testing.T) {
	first := newReq("")
	continued := newReq("").routed(0, "w1").tokens(0, 3).
		closed(events.AttemptFailed{Attempt: 0, WorkerID: "w1", Reason: "gone"}).
		migrated(0, "w1", events.MigrationOngoingRequest, "fe")
	for _, c := range []struct {
		name      string
		exactOnly bool
		r         req
		want      bool
	}{
		{"first dispatch, exact-only", true, first, false},
		{"continuation, exact-only", true, continued, true},
		{"continuation, not exact-only", false, continued, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := policy(3, 0)
			p.ExactOnly = c.exactOnly
			a := p.Step(migrations.State{Request: c.r.Request}, migrations.Observation{}, t0)
			if a.Kind != migrations.DispatchNext {
				t.Fatalf("action %v, want DispatchNext", a.Kind)
			}
			if a.Dispatch.ExactOnly != c.want {
				t.Errorf("ExactOnly %v, want %v (start offset %d)", a.Dispatch.ExactOnly, c.want, a.Dispatch.StartOffset)
			}
		})
	}
}

// TestContinuationCarriesEnginePromptTokens: a continuation carries the
// prompt's length as an earlier engine counted it (its prompt ids), which a
// prefill continuation's usage is compared with; none when no engine
// counted it.
func TestContinuationCarriesEnginePromptTokens(t *testing.T) {
	build := func(promptIDs []int) *projections.Request {
		r := projections.NewRequest()
		r.Apply(events.Envelope{Event: events.RequestAccepted{RequestID: "r", Model: "m", Prompt: "hi", PromptTokens: 1, MaxTokens: 10}})
		r.Apply(events.Envelope{Event: events.RequestRouted{RequestID: "r", Attempt: 0, WorkerID: "w0"}})
		r.Apply(events.Envelope{Event: events.TokensGenerated{RequestID: "r", Attempt: 0, Tokens: []string{" a", " b"}, PromptIDs: promptIDs}})
		return r
	}
	if got := migrations.Continuation(build([]int{7, 8, 9}), 1, "fe").EnginePromptTokens; got != 3 {
		t.Errorf("engine prompt tokens %d, want 3 (the prompt ids)", got)
	}
	if got := migrations.Continuation(build(nil), 1, "fe").EnginePromptTokens; got != 0 {
		t.Errorf("engine prompt tokens %d, want 0 (no engine counted the prompt)", got)
	}
}

// TestUnroutableSaysWhy: a continuation no worker could take fails with a
// message that tells "none can continue it" (workers routable, none
// capable) from "no other worker" (issue 35, item 7).
func TestUnroutableSaysWhy(t *testing.T) {
	r := newReq("").routed(0, "w1").tokens(0, 3).
		closed(events.AttemptFailed{Attempt: 0, WorkerID: "w1", Reason: "worker_lost"}).
		migrated(0, "w1", events.MigrationOngoingRequest, "fe")
	mem := migrations.Memory{Migration: failed(0, "w1", events.MigrationOngoingRequest, "worker_lost"), LastFailed: "w1"}
	for _, c := range []struct {
		name       string
		notCapable bool
		want       string
	}{
		{"none capable", true, "worker w1 failed and no routable worker of model m can continue the request: 2 routable, none can continue"},
		{"none there", false, "worker w1 failed and no other worker is available for model m: no worker"},
	} {
		t.Run(c.name, func(t *testing.T) {
			why := "no worker"
			if c.notCapable {
				why = "2 routable, none can continue it at token 3"
			}
			a := policy(3, 0).Step(migrations.State{Request: r.Request, Memory: mem}, migrations.Observation{
				Dispatch: &migrations.DispatchOutcome{Result: migrations.DispatchUnroutable, NotCapable: c.notCapable, Err: why}}, t0)
			if a.Kind != migrations.Fail || a.Failed.Code != "no_worker" || !strings.HasPrefix(a.Failed.Message, c.want) {
				t.Errorf("action %v, failure %+v; want no_worker with a message starting %q", a.Kind, a.Failed, c.want)
			}
		})
	}
}

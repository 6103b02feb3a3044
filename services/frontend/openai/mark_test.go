package openai

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
)

// migratedRequest is a completed request of endpoint whose continuation
// (attempt 1) reported exact.
func migratedRequest(endpoint string, exact *bool) *projections.Request {
	r := projections.NewRequest()
	for _, ev := range []events.Event{
		events.RequestAccepted{RequestID: "r", Model: "m", Endpoint: endpoint, PromptTokens: 1, MaxTokens: 4, Created: 1},
		events.RequestRouted{RequestID: "r", Attempt: 0, WorkerID: "w1"},
		events.TokensGenerated{RequestID: "r", Attempt: 0, Tokens: []string{"a ", "b "}},
		events.RequestMigrated{RequestID: "r", FromAttempt: 0, Cut: 2, MigrationType: events.MigrationOngoingRequest},
		events.RequestRouted{RequestID: "r", Attempt: 1, WorkerID: "w2", StartOffset: 2},
		events.TokensGenerated{RequestID: "r", Attempt: 1, Offset: 2, Tokens: []string{"c ", "d "}},
		events.RequestCompleted{RequestID: "r", Attempt: 1, FinishReason: "length", Exact: exact},
	} {
		r.Apply(events.Envelope{Event: ev})
	}
	return r
}

// TestMarkOnAnswers: a migrated request's answer, and its response object,
// carry "baton": {"exact": ...}; one that did not migrate carries nothing.
func TestMarkOnAnswers(t *testing.T) {
	f, tr := false, true
	plain := projections.NewRequest()
	for _, ev := range []events.Event{
		events.RequestAccepted{RequestID: "r", Model: "m", Endpoint: events.EndpointChat, MaxTokens: 1},
		events.RequestRouted{RequestID: "r", Attempt: 0, WorkerID: "w1"},
		events.TokensGenerated{RequestID: "r", Attempt: 0, Tokens: []string{"a"}},
		events.RequestCompleted{RequestID: "r", Attempt: 0, FinishReason: "length"},
	} {
		plain.Apply(events.Envelope{Event: ev})
	}
	for _, c := range []struct {
		name string
		p    *projections.Request
		want string // the mark's JSON; "" for none
	}{
		{"chat, approximate", migratedRequest(events.EndpointChat, &f), `{"exact":false}`},
		{"completions, exact", migratedRequest(events.EndpointCompletions, &tr), `{"exact":true}`},
		{"response, approximate", migratedRequest(events.EndpointResponses, &f), `{"exact":false}`},
		{"not migrated", plain, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			obj := Response(c.p, "")
			mark, ok := obj[MarkField]
			switch {
			case c.want == "" && ok:
				t.Errorf("mark %s on an answer that did not migrate", jsonOf(t, mark))
			case c.want != "" && (!ok || jsonOf(t, mark) != c.want):
				t.Errorf("mark %v, want %s", mark, c.want)
			}
		})
	}
}

// TestMarkOnFinalChunk: the finish and usage chunks carry the mark.
func TestMarkOnFinalChunk(t *testing.T) {
	rec := httptest.NewRecorder()
	s := NewSSE(rec, events.RequestAccepted{RequestID: "r", Model: "m", Endpoint: events.EndpointChat})
	f := false
	s.Finish(4, 0, "stop", Mark(&f))
	s.Usage(4, map[string]any{"completion_tokens": 4}, MarkOf([]Choice{{Exact: &f}, {}}))
	s.Finish(5, 0, "stop", nil)
	chunks := strings.Split(strings.TrimSpace(rec.Body.String()), "\n\n")
	if len(chunks) != 3 {
		t.Fatalf("%d events, want 3:\n%s", len(chunks), rec.Body.String())
	}
	for i, want := range []bool{true, true, false} {
		if got := strings.Contains(chunks[i], `"baton":{"exact":false}`); got != want {
			t.Errorf("event %d carries the mark: %v, want %v:\n%s", i, got, want, chunks[i])
		}
	}
}

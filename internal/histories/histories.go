// Package histories holds request histories for tests: a request's log as
// it is after faults, to fold, replay and print.
package histories

import (
	"fmt"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/streams"
)

// Stored is an event of a test history, its producer and the subject it is
// stored on.
type Stored struct {
	Subject string
	Source  string
	Event   events.Event
}

// Migrated is the log of request "r1": attempt 0 on w1 fenced at
// token 5 and migrated to w2, a zombie w1 writing after the fence, a
// duplicate delta, a resume on frontend fe-2, and a late zombie completion.
func Migrated() []Stored {
	const id = "r1"
	fe1, fe2, w1, w2 := "baton/frontend/fe-1", "baton/frontend/fe-2", "baton/worker/w1", "baton/worker/w2"
	ev, tok := streams.RequestEvents(id), func(k int) string { return streams.RequestTokens(id, k, fmt.Sprintf("w%d", k+1)) }
	return []Stored{
		{ev, fe1, events.RequestAccepted{RequestID: id, Model: "mock", Endpoint: events.EndpointCompletions, Prompt: "a b", PromptTokens: 2, MaxTokens: 10, Frontend: "fe-1", Stream: true}},
		{ev, fe1, events.RequestRouted{RequestID: id, Attempt: 0, WorkerID: "w1"}},
		{tok(0), w1, events.TokensGenerated{RequestID: id, Attempt: 0, Offset: 0, Tokens: []string{"t0 ", "t1 ", "t2 "}}},
		{tok(0), w1, events.TokensGenerated{RequestID: id, Attempt: 0, Offset: 3, Tokens: []string{"t3 ", "t4 "}}},
		{tok(0), fe1, events.AttemptFailed{RequestID: id, Attempt: 0, WorkerID: "w1", Offset: 5, Reason: "worker_lost"}},
		{ev, fe1, events.RequestMigrated{RequestID: id, FromAttempt: 0, FromWorker: "w1", Cut: 5, MigrationType: events.MigrationOngoingRequest, Reason: "worker_lost", Frontend: "fe-1"}},
		{ev, fe1, events.RequestRouted{RequestID: id, Attempt: 1, WorkerID: "w2", StartOffset: 5}},
		{tok(0), w1, events.TokensGenerated{RequestID: id, Attempt: 0, Offset: 5, Tokens: []string{"zombie "}}},
		{tok(1), w2, events.TokensGenerated{RequestID: id, Attempt: 1, Offset: 5, Tokens: []string{"t5 ", "t6 "}}},
		{tok(1), w2, events.TokensGenerated{RequestID: id, Attempt: 1, Offset: 5, Tokens: []string{"t5 ", "t6 "}}},
		{ev, fe2, events.RequestAttached{RequestID: id, Frontend: "fe-2", Offset: 7}},
		{tok(1), w2, events.TokensGenerated{RequestID: id, Attempt: 1, Offset: 7, Tokens: []string{"t7 ", "t8 "}}},
		{tok(1), w2, events.TokensGenerated{RequestID: id, Attempt: 1, Offset: 9, Tokens: []string{"t9 "}}},
		{tok(1), w2, events.RequestCompleted{RequestID: id, Attempt: 1, FinishReason: "length", PromptTokens: 2, CompletionTokens: 10}},
		{tok(0), w1, events.RequestCompleted{RequestID: id, Attempt: 0, FinishReason: "length", CompletionTokens: 6}},
	}
}

// Envelopes turns a history into stored envelopes: sequences from 1, 10 ms apart.
func Envelopes(h []Stored) []events.Envelope {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	out := make([]events.Envelope, len(h))
	for i, s := range h {
		out[i] = events.Envelope{ID: events.ID("e", i), Source: s.Source, Subject: "r1",
			Time: t0.Add(time.Duration(i) * 10 * time.Millisecond), Event: s.Event, Seq: uint64(i + 1)}
	}
	return out
}

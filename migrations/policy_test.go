package migrations_test

import (
	"errors"
	"testing"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/migrations"
	"github.com/baton-dev/baton/projections"
)

// request folds a request with prompt tokens, generated tokens and migrations.
func request(prompt, generated, migrated int, pinned string) *projections.Request {
	r := projections.NewRequest()
	r.Apply(events.Envelope{Event: events.RequestAccepted{RequestID: "r", Model: "m", Prompt: "p", PromptTokens: prompt, MaxTokens: 1000, PinnedWorker: pinned}})
	attempt := 0
	r.Apply(events.Envelope{Event: events.RequestRouted{RequestID: "r", Attempt: 0, WorkerID: "w0"}})
	toks := make([]string, generated)
	for i := range toks {
		toks[i] = "t "
	}
	r.Apply(events.Envelope{Event: events.TokensGenerated{RequestID: "r", Attempt: 0, Tokens: toks}})
	for range migrated {
		r.Apply(events.Envelope{Event: events.AttemptFailed{RequestID: "r", Attempt: attempt, Reason: "worker_lost"}})
		r.Apply(events.Envelope{Event: events.RequestMigrated{RequestID: "r", FromAttempt: attempt, Cut: generated, MigrationType: events.MigrationOngoingRequest}})
		attempt++
		r.Apply(events.Envelope{Event: events.RequestRouted{RequestID: "r", Attempt: attempt, WorkerID: "w", StartOffset: generated}})
	}
	return r
}

func TestPolicyAllow(t *testing.T) {
	for _, tc := range []struct {
		name   string
		policy migrations.Policy
		req    *projections.Request
		want   error
	}{
		{"disabled by default", migrations.Policy{}, request(10, 5, 0, ""), migrations.ErrDisabled},
		{"first migration", migrations.Policy{Limit: 3}, request(10, 5, 0, ""), nil},
		{"last allowed", migrations.Policy{Limit: 3}, request(10, 5, 2, ""), nil},
		{"limit exhausted", migrations.Policy{Limit: 3}, request(10, 5, 3, ""), migrations.ErrLimitExhausted},
		{"max seq len unset", migrations.Policy{Limit: 3, MaxSeqLen: 0}, request(10, 5000, 0, ""), nil},
		{"exactly at max seq len", migrations.Policy{Limit: 3, MaxSeqLen: 15}, request(10, 5, 0, ""), nil},
		{"one past max seq len", migrations.Policy{Limit: 3, MaxSeqLen: 15}, request(10, 6, 0, ""), migrations.ErrMaxSeqLenExceeded},
		{"prompt alone past max seq len", migrations.Policy{Limit: 3, MaxSeqLen: 1}, request(2, 0, 0, ""), migrations.ErrMaxSeqLenExceeded},
		{"pinned", migrations.Policy{Limit: 3}, request(10, 5, 0, "w0"), migrations.ErrPinned},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.policy.Allow(tc.req); !errors.Is(got, tc.want) {
				t.Errorf("Allow = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestContinuation(t *testing.T) {
	r := request(3, 4, 1, "")
	d := migrations.Continuation(r, 1, "fe")
	if d.StartOffset != 4 || d.Generated != "t t t t " || d.MaxTokens != 1000 || d.Attempt != 1 ||
		d.Prompt != "p" || d.PromptTokens != 3 || d.Frontend != "fe" || d.RequestID != "r" || d.Model != "m" {
		t.Errorf("continuation = %+v", d)
	}
}

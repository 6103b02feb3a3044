package projections_test

import (
	"testing"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
)

// TestFoldSaysWhy: every event the fold ignores comes with its reason, the
// one baton replay prints.
func TestFoldSaysWhy(t *testing.T) {
	r := projections.NewRequest()
	seq := uint64(0)
	fold := func(ev events.Event) (bool, string) {
		seq++
		return r.Fold(events.Envelope{Seq: seq, Event: ev})
	}
	toks := func(attempt, offset int, n int) events.TokensGenerated {
		return events.TokensGenerated{RequestID: "r", Attempt: attempt, Offset: offset, Tokens: make([]string, n)}
	}
	for _, tc := range []struct {
		name        string
		ev          events.Event
		wantChanged bool
		wantWhy     string
	}{
		{"accepted", events.RequestAccepted{RequestID: "r", Model: "m", MaxTokens: 4, Frontend: "fe"}, true, ""},
		{"accepted again", events.RequestAccepted{RequestID: "r", Model: "m"}, false, projections.NoEffectApplied},
		{"tokens before any attempt", toks(0, 0, 1), false, projections.IgnoredFenced},
		{"routed", events.RequestRouted{RequestID: "r", Attempt: 0, WorkerID: "w1"}, true, ""},
		{"routed again", events.RequestRouted{RequestID: "r", Attempt: 0, WorkerID: "w1"}, false, projections.NoEffectApplied},
		{"routed out of order", events.RequestRouted{RequestID: "r", Attempt: 5, WorkerID: "w1"}, false, projections.IgnoredOutOfOrder},
		{"a delta over the attempt's bound", events.TokensGenerated{RequestID: "r", Attempt: 0, Offset: 0,
			Tokens: []string{string(make([]byte, projections.AttemptFixedBytes+4*projections.MaxTokenBytes+1))}}, false, projections.IgnoredOversize},
		{"tokens", toks(0, 0, 2), true, ""},
		{"a delta past a gap", toks(0, 3, 1), false, projections.IgnoredGap},
		{"a retried delta", toks(0, 0, 2), false, projections.IgnoredDuplicate},
		{"attached by the owner", events.RequestAttached{RequestID: "r", Frontend: "fe"}, false, projections.NoEffectOwner},
		{"fenced", events.AttemptFailed{RequestID: "r", Attempt: 0, Reason: "stalled"}, true, ""},
		{"fenced again", events.AttemptFailed{RequestID: "r", Attempt: 0, Reason: "stalled"}, false, projections.NoEffectClosed},
		{"failure of an attempt that never was", events.AttemptFailed{RequestID: "r", Attempt: 7}, false, projections.IgnoredBadAttempt},
		{"a zombie's tokens", toks(0, 2, 1), false, projections.IgnoredFenced},
		{"migrated", events.RequestMigrated{RequestID: "r", FromAttempt: 0, Cut: 2}, true, ""},
		{"migrated again", events.RequestMigrated{RequestID: "r", FromAttempt: 0, Cut: 2}, false, projections.NoEffectApplied},
		{"routed 1", events.RequestRouted{RequestID: "r", Attempt: 1, WorkerID: "w2", StartOffset: 2}, true, ""},
		{"completed across a gap", events.RequestCompleted{RequestID: "r", Attempt: 1, FinishReason: "length", Offset: 3}, false, projections.IgnoredGap},
		{"past max_tokens", toks(1, 2, 5), true, ""},
		{"nothing left under max_tokens", toks(1, 4, 1), false, projections.IgnoredPastMax},
		{"child", events.ChildAdded{RequestID: "r", ChildID: "c"}, true, ""},
		{"child again", events.ChildAdded{RequestID: "r", ChildID: "c"}, false, projections.NoEffectApplied},
		{"stop", events.RequestCancelled{RequestID: "r", Mode: events.CancelStop}, true, ""},
		{"stop again", events.RequestCancelled{RequestID: "r", Mode: events.CancelStop}, false, projections.NoEffectApplied},
		{"completed past max_tokens", events.RequestCompleted{RequestID: "r", Attempt: 1, FinishReason: "length", Offset: 7}, true, ""},
		{"completed again", events.RequestCompleted{RequestID: "r", Attempt: 1}, false, projections.IgnoredAfterEnd},
		{"failed after the end", events.RequestFailed{RequestID: "r", Code: "x"}, false, projections.IgnoredAfterEnd},
		{"a worker event", events.WorkerLost{WorkerID: "w1"}, false, projections.IgnoredUnknownType},
	} {
		changed, why := fold(tc.ev)
		if changed != tc.wantChanged || why != tc.wantWhy {
			t.Errorf("%s: changed %v why %q, want %v %q", tc.name, changed, why, tc.wantChanged, tc.wantWhy)
		}
	}
	if changed, why := r.Fold(events.Envelope{Seq: 1, Event: events.RequestFailed{RequestID: "r"}}); changed || why != projections.IgnoredReplayed {
		t.Errorf("a replayed sequence: changed %v why %q, want %q", changed, why, projections.IgnoredReplayed)
	}
}

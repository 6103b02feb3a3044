package projections_test

import (
	"testing"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/streams"
)

// endOf is request r1's end in the ends place, stored on its subject there.
func endOf(through uint64, end events.RequestEvent) events.Envelope {
	ev := events.RequestEnded{RequestID: "r1", Frontend: "fe-1", Through: through}
	switch end := end.(type) {
	case events.RequestFailed:
		ev.Failed = &end
	case events.RequestCompleted:
		ev.Completed = &end
	case events.RequestCancelled:
		ev.Cancelled = &end
	}
	return events.Envelope{ID: "end", Source: "test", Subject: "r1", Time: t0, Event: ev, Stored: streams.RequestEnd("r1")}
}

func TestFoldEndFromTheEndsPlace(t *testing.T) {
	full := events.RequestFailed{RequestID: "r1", Code: "log_full", Status: 503, Offset: 3}
	running := stored(accepted(0), routed(0, "w", 0), delta(0, 0, "abc"))
	for _, tc := range []struct {
		name   string
		log    []events.Envelope // the request log, then the end
		end    events.Envelope
		after  []events.Envelope // stored after the end was applied
		status projections.Status
		tokens int
		why    string
		code   string
	}{
		{name: "a failure the log could not store", log: running, end: endOf(3, full),
			status: projections.StatusFailed, tokens: 3, code: "log_full"},
		{name: "tokens stored after the end are not read", log: running, end: endOf(3, full),
			after:  []events.Envelope{{ID: "late", Seq: 4, Event: delta(0, 3, "de")}},
			status: projections.StatusFailed, tokens: 3, code: "log_full"},
		{name: "a completion the record could not carry", log: running, end: endOf(3, completed(0)),
			status: projections.StatusCompleted, tokens: 3},
		{name: "a kill", log: running, end: endOf(3, events.RequestCancelled{RequestID: "r1", Mode: events.CancelKill}),
			status: projections.StatusCancelled, tokens: 3},
		{name: "the log's own end comes first", log: stored(accepted(0), routed(0, "w", 0), delta(0, 0, "abc"), completed(0)),
			end: endOf(4, full), status: projections.StatusCompleted, tokens: 3, why: projections.IgnoredAfterEnd},
		{name: "an earlier request's end", log: stored(accepted(0), routed(0, "w", 0)), end: endOf(0, full),
			status: projections.StatusRunning, why: projections.IgnoredStaleEnd},
		{name: "an end on a request subject is not trusted", log: running,
			end:    func() events.Envelope { e := endOf(3, full); e.Stored = streams.RequestEvents("r1"); return e }(),
			status: projections.StatusRunning, tokens: 3, why: projections.IgnoredWrongSubject},
		{name: "an end of an unknown request", end: endOf(3, full), why: projections.NoEffect},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := fold(tc.log)
			changed, why := r.Fold(tc.end)
			if why != tc.why || changed != (tc.why == "") {
				t.Errorf("fold the end: got %v %q, want %q", changed, why, tc.why)
			}
			for _, e := range tc.after {
				r.Apply(e)
			}
			if r.Status != tc.status || r.Len() != tc.tokens {
				t.Errorf("got %s with %d tokens, want %s with %d", r.Status, r.Len(), tc.status, tc.tokens)
			}
			if tc.code != "" && (r.Failure == nil || r.Failure.Code != tc.code) {
				t.Errorf("got failure %+v, want code %s", r.Failure, tc.code)
			}
			if r.LastSeq() != uint64(len(tc.log)+len(tc.after)) {
				t.Errorf("last seq %d: the end moved it", r.LastSeq())
			}
		})
	}
}

// TestEndRoundTrip: the end a fold gives (Request.End), applied to a fold
// of the log without it, gives the same state.
func TestEndRoundTrip(t *testing.T) {
	log := stored(accepted(0), routed(0, "w", 0), delta(0, 0, "abc"))
	for _, end := range []events.Event{
		events.RequestFailed{RequestID: "r1", Code: "log_full", Status: 503, Offset: 3},
		events.RequestCompleted{RequestID: "r1", Attempt: 0, FinishReason: "length", PromptTokens: 7, CompletionTokens: 3},
		events.RequestCancelled{RequestID: "r1", Mode: events.CancelKill, Reason: "client gone"},
	} {
		owner := fold(log)
		owner.Apply(events.Envelope{ID: "x", Time: t0, Event: end})
		ev, ok := owner.End("fe-1")
		if !ok || ev.Through != 3 {
			t.Fatalf("%T: End got %+v %v, want through 3", end, ev, ok)
		}
		reader := fold(log)
		reader.Apply(events.Envelope{ID: "end", Time: t0, Event: ev, Stored: streams.RequestEnd("r1")})
		if reader.Status != owner.Status || reader.FinishReason != owner.FinishReason || reader.CompletionTokens() != owner.CompletionTokens() ||
			reader.PromptTokens() != owner.PromptTokens() || (owner.Failure != nil) != (reader.Failure != nil) {
			t.Errorf("%T: the reader folds %s %q, the owner %s %q", end, reader.Status, reader.FinishReason, owner.Status, owner.FinishReason)
		}
	}
	if _, ok := fold(log).End("fe-1"); ok {
		t.Error("a running request has an end")
	}
}

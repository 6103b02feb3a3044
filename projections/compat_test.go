package projections_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/streams"
)

// A message as a newer build would store it: one of this build's events,
// retyped and with fields or headers added.
type future struct {
	ev      events.Event
	typ     string         // ce-type to store it under ("": the event's own)
	fields  map[string]any // JSON fields to add to its data
	headers map[string]string
	tokens  bool // stored on the tokens subject of attempt 0 (else the events subject)
}

// storeFuture encodes each message as the log would hold it, and decodes it
// as every reader of the log does (events.Unmarshal; an event this build
// cannot read comes back as an events.Unreadable, which the log's readers
// yield): sequences from 1, subjects of request r1 and worker w1.
func storeFuture(t *testing.T, msgs []future) []events.Envelope {
	t.Helper()
	var out []events.Envelope
	for i, m := range msgs {
		env := events.Envelope{ID: events.ID("e", i), Source: "baton/future", Subject: "r1",
			Time: t0.Add(time.Duration(i) * time.Millisecond), Event: m.ev}
		h, data, err := events.Marshal(env)
		if err != nil {
			t.Fatal(err)
		}
		if m.typ != "" {
			h[events.HeaderType] = []string{m.typ}
		}
		if len(m.fields) > 0 {
			var obj map[string]any
			if err := json.Unmarshal(data, &obj); err != nil {
				t.Fatalf("%T is not stored as a JSON object: %v", m.ev, err)
			}
			for k, v := range m.fields {
				obj[k] = v
			}
			if data, err = json.Marshal(obj); err != nil {
				t.Fatal(err)
			}
		}
		for k, v := range m.headers {
			h[k] = []string{v}
		}
		e, err := events.Unmarshal(h, data)
		if _, unreadable := e.Event.(events.Unreadable); err != nil && !unreadable {
			t.Fatalf("message %d (%s): %v, and no Unreadable to step over", i, m.typ, err)
		}
		e.Seq = uint64(i + 1)
		e.Stored = streams.RequestEvents("r1")
		if m.tokens {
			e.Stored = streams.RequestTokens("r1", 0, "w1")
		}
		out = append(out, e)
	}
	return out
}

// TestFoldToleratesFutureEvents holds the compatibility rule
// (docs/compatibility.md) in the fold: a request's log as a newer build
// writes it (unknown fields in known events, an unknown header on a token
// delta, an unknown fact, newer versions of known types, a retired version)
// folds to exactly the state of the same log without the additions, every
// event this build cannot read is stepped over with its reason (what
// `baton replay` shows) and counted in the last applied sequence, so a
// frontend's next expected-sequence append does not conflict with it.
func TestFoldToleratesFutureEvents(t *testing.T) {
	acc := accepted(6)
	acc.Prompt = "p"
	plain := []future{
		{ev: acc},
		{ev: routed(0, "w1", 0)},
		{ev: delta(0, 0, "abc"), tokens: true},
		{ev: delta(0, 3, "def"), tokens: true},
		{ev: events.RequestCompleted{RequestID: "r1", Attempt: 0, FinishReason: "length", CompletionTokens: 6}, tokens: true},
	}
	newer := []future{
		{ev: acc, fields: map[string]any{"priority": "high", "placement": map[string]any{"zone": "b"}}},
		{ev: events.RequestAttached{RequestID: "r1", Frontend: "fe-9"}, typ: "baton.request.paused.v1", fields: map[string]any{"until": "later"}},
		{ev: routed(0, "w1", 0), fields: map[string]any{"engine_version": "2.0"}},
		{ev: events.RequestRouted{RequestID: "r1", Attempt: 1, WorkerID: "w2"}, typ: "baton.request.routed.v2"},
		{ev: delta(0, 0, "abc"), tokens: true, headers: map[string]string{"ce-batonfuture": "1", "Baton-Trace": "x"}},
		{ev: events.RequestCompleted{RequestID: "r1", Attempt: 0, FinishReason: "stop"}, typ: "baton.request.completed.v2", tokens: true},
		{ev: delta(0, 3, "def"), tokens: true},
		{ev: events.RequestAccepted{RequestID: "r1", Model: "old"}, typ: "baton.request.accepted.v0"},
		{ev: events.RequestCompleted{RequestID: "r1", Attempt: 0, FinishReason: "length", CompletionTokens: 6}, tokens: true,
			fields: map[string]any{"engine_stats": map[string]any{"kv_hit": 0.5}}},
	}
	want := fold(storeFuture(t, plain))
	log := storeFuture(t, newer)
	got, timeline, ok := projections.Replay(log)
	if !ok {
		t.Fatal("the future log folds to no request")
	}
	if got.Status != want.Status || got.Text() != want.Text() || got.Owner != want.Owner || got.FinishReason != want.FinishReason ||
		!reflect.DeepEqual(got.Attempts, want.Attempts) || !reflect.DeepEqual(got.Accepted, want.Accepted) {
		t.Errorf("future log folds to %s %q owner %s attempts %+v,\nwant %s %q owner %s attempts %+v",
			got.Status, got.Text(), got.Owner, got.Attempts, want.Status, want.Text(), want.Owner, want.Attempts)
	}
	if got.LastSeq() != uint64(len(newer)) {
		t.Errorf("last applied sequence %d, want %d: an unreadable event was not stepped over", got.LastSeq(), len(newer))
	}
	skipped := map[string]string{
		"baton.request.paused.v1":    "unknown event type",
		"baton.request.routed.v2":    "newer version v2 of baton.request.routed",
		"baton.request.completed.v2": "newer version v2 of baton.request.completed",
		"baton.request.accepted.v0":  "version v0 of baton.request.accepted is no longer read",
	}
	for _, e := range timeline {
		reason, isSkipped := skipped[e.Type]
		switch {
		case isSkipped && (e.Applied || !strings.HasPrefix(e.Note, projections.SkippedPrefix) || !strings.Contains(e.Note, reason)):
			t.Errorf("seq %d %s: applied %v note %q, want skipped with %q", e.Seq, e.Type, e.Applied, e.Note, reason)
		case !isSkipped && !e.Applied:
			t.Errorf("seq %d %s: not applied (%q): an unknown field or header made it unreadable", e.Seq, e.Type, e.Note)
		}
	}

	// Live, one event at a time, in any follower: the same.
	r := projections.NewRequest()
	for _, e := range log {
		r.Apply(e)
	}
	if r.Status != want.Status || r.Text() != want.Text() || r.LastSeq() != uint64(len(newer)) {
		t.Errorf("applied one by one: %s %q at seq %d, want %s %q at %d", r.Status, r.Text(), r.LastSeq(), want.Status, want.Text(), len(newer))
	}
}

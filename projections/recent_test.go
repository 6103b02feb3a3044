package projections

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
)

func TestRecent(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	seq := uint64(0)
	env := func(id string, ev events.Event) events.Envelope {
		seq++
		return events.Envelope{ID: fmt.Sprint(seq), Subject: id, Time: t0.Add(time.Duration(seq) * time.Second), Event: ev, Seq: seq}
	}
	accepted := func(id, model string) events.Envelope {
		return env(id, events.RequestAccepted{RequestID: id, Model: model, MaxTokens: 10, Frontend: "fe-1"})
	}
	v := NewRecent(3)
	steps := []struct {
		name string
		e    events.Envelope
		want bool
	}{
		{"tokens of a request accepted before the window", env("old", events.TokensGenerated{RequestID: "old", Tokens: []string{"x"}}), false},
		{"accepted", accepted("a", "m1"), true},
		{"routed", env("a", events.RequestRouted{RequestID: "a", WorkerID: "w1"}), true},
		{"tokens", env("a", events.TokensGenerated{RequestID: "a", Tokens: []string{"t0 ", "t1 "}}), true},
		{"migrated", env("a", events.RequestMigrated{RequestID: "a", FromAttempt: 0, FromWorker: "w1", Cut: 2, MigrationType: events.MigrationOngoingRequest}), true},
		{"routed again", env("a", events.RequestRouted{RequestID: "a", Attempt: 1, WorkerID: "w2", StartOffset: 2}), true},
		{"zombie tokens of the fenced attempt", env("a", events.TokensGenerated{RequestID: "a", Attempt: 0, Offset: 2, Tokens: []string{"z "}}), false},
		{"second request", accepted("b", "m2"), true},
		{"second request routed", env("b", events.RequestRouted{RequestID: "b", WorkerID: "w1"}), true},
		{"second request completes", env("b", events.RequestCompleted{RequestID: "b", FinishReason: "stop"}), true},
		{"third request", accepted("c", "m1"), true},
		{"fourth request evicts the oldest idle one", accepted("d", "m1"), true},
	}
	for _, s := range steps {
		if got := v.Apply(s.e); got != s.want {
			t.Errorf("%s: Apply = %v, want %v", s.name, got, s.want)
		}
	}
	if got := v.Apply(events.Envelope{Seq: 3, Subject: "a", Event: events.RequestCancelled{RequestID: "a", Mode: "kill"}}); got {
		t.Errorf("an event with an old sequence was applied")
	}
	if got, want := v.Len(), 3; got != want {
		t.Fatalf("Len = %d, want %d", got, want)
	}
	rows := v.Requests("", "", 0)
	ids := ""
	for _, r := range rows {
		ids += r.ID
	}
	if ids != "dca" {
		t.Errorf("rows %q, want d, c, a (newest first; b evicted: ended before a)", ids)
	}
	if p := v.Requests("m1", "pending", 0); len(p) != 2 || p[0].ID != "d" || p[1].ID != "c" {
		t.Fatalf("model m1, status pending: %+v, want d and c", p)
	}
	if m2 := v.Requests("m2", "", 0); len(m2) != 0 {
		t.Fatalf("model m2: %+v, want none (b was evicted)", m2)
	}
	want := RequestSummary{ID: "a", Model: "m1", Status: "running", Worker: "w2", Owner: "fe-1", Tokens: 2, MaxTokens: 10,
		Attempts: 2, Migrations: 1, Accepted: t0.Add(2 * time.Second), Updated: t0.Add(6 * time.Second), Seq: 7}
	if got := v.Requests("m1", "running", 0); len(got) != 1 || got[0] != want {
		t.Errorf("row of a: got %+v, want %+v", got, want)
	}
	if got := v.Requests("", "", 1); len(got) != 1 || got[0].ID != "d" {
		t.Errorf("limit 1: %+v, want only d", got)
	}
}

func TestInFeed(t *testing.T) {
	tests := []struct {
		ev   events.Event
		want bool
	}{
		{events.RequestMigrated{}, true},
		{events.AttemptFailed{}, true},
		{events.WorkerLost{}, true},
		{events.RequestCancelled{}, true},
		{events.TokensGenerated{}, false},
		{events.RequestRouted{}, false},
		{events.RequestAccepted{}, false},
		{events.RequestCompleted{}, false},
		{events.RequestAttached{}, true},
		{events.WorkerRegistered{}, true},
	}
	for _, tt := range tests {
		if got := InFeed(tt.ev); got != tt.want {
			t.Errorf("InFeed(%T) = %v, want %v", tt.ev, got, tt.want)
		}
	}
}

// TestRequestCounter: a counter folds to the same state as a full
// projection, fences and duplicates included, without keeping the text.
func TestRequestCounter(t *testing.T) {
	full, count := NewRequest(), NewRequestCounter()
	evs := []events.Event{
		events.RequestAccepted{RequestID: "r", Model: "m", MaxTokens: 6},
		events.RequestRouted{RequestID: "r", WorkerID: "w1"},
		events.TokensGenerated{RequestID: "r", Tokens: []string{"a ", "b "}},
		events.TokensGenerated{RequestID: "r", Offset: 1, Tokens: []string{"b ", "c "}},
		events.AttemptFailed{RequestID: "r", WorkerID: "w1", Offset: 3, Reason: "worker_lost"},
		events.RequestMigrated{RequestID: "r", FromWorker: "w1", Cut: 3, MigrationType: events.MigrationOngoingRequest},
		events.TokensGenerated{RequestID: "r", Offset: 3, Tokens: []string{"zombie "}},
		events.RequestRouted{RequestID: "r", Attempt: 1, WorkerID: "w2", StartOffset: 3},
		events.TokensGenerated{RequestID: "r", Attempt: 1, Offset: 3, Tokens: []string{"d ", "e ", "f ", "g "}},
		events.RequestCompleted{RequestID: "r", Attempt: 1, FinishReason: "length"},
	}
	for i, ev := range evs {
		e := events.Envelope{Seq: uint64(i + 1), Subject: "r", Event: ev}
		if a, b := full.Apply(e), count.Apply(e); a != b {
			t.Fatalf("event %d (%T): full applied %v, counter %v", i, ev, a, b)
		}
	}
	if !reflect.DeepEqual(full.State(), count.State()) {
		t.Errorf("states differ:\n full    %+v\n counter %+v", full.State(), count.State())
	}
	if full.Len() != 6 || count.Len() != 6 || count.Text() != "" || full.Text() != "a b c d e f " {
		t.Errorf("full %d tokens %q, counter %d tokens %q; want 6 and the text only in full", full.Len(), full.Text(), count.Len(), count.Text())
	}
}

// TestRecentPartitions folds two request partitions, whose sequences overlap:
// each is skipped only against its own last sequence.
func TestRecentPartitions(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	env := func(seq uint64, id string, ev events.Event) events.Envelope {
		return events.Envelope{ID: id + fmt.Sprint(seq), Subject: id, Time: t0.Add(time.Duration(seq) * time.Second), Event: ev, Seq: seq}
	}
	v := NewRecent(10)
	steps := []struct {
		name string
		k    int
		e    events.Envelope
		want bool
	}{
		{"a accepted in partition 0", 0, env(1, "a", events.RequestAccepted{RequestID: "a", Model: "m", MaxTokens: 4}), true},
		{"b accepted in partition 1 at the same sequence", 1, env(1, "b", events.RequestAccepted{RequestID: "b", Model: "m", MaxTokens: 4}), true},
		{"b routed", 1, env(2, "b", events.RequestRouted{RequestID: "b", WorkerID: "w1"}), true},
		{"a routed, below partition 1's sequence", 0, env(2, "a", events.RequestRouted{RequestID: "a", WorkerID: "w2"}), true},
		{"b routed again: redelivered", 1, env(2, "b", events.RequestRouted{RequestID: "b", WorkerID: "w9"}), false},
	}
	for _, s := range steps {
		if got := v.ApplyPartition(s.k, s.e); got != s.want {
			t.Errorf("%s: ApplyPartition = %v, want %v", s.name, got, s.want)
		}
	}
	workers := map[string]string{}
	for _, r := range v.Requests("", "", 0) {
		workers[r.ID] = r.Worker
	}
	if want := map[string]string{"a": "w2", "b": "w1"}; !reflect.DeepEqual(workers, want) {
		t.Errorf("workers %v, want %v", workers, want)
	}
}

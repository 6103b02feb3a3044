package projections_test

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// stored numbers evs as a stream would, from sequence 1, one millisecond apart.
func stored(evs ...events.Event) []events.Envelope {
	out := make([]events.Envelope, len(evs))
	for i, ev := range evs {
		out[i] = events.Envelope{
			ID: events.ID("e", i), Source: "test", Subject: "r1",
			Time: t0.Add(time.Duration(i) * time.Millisecond), Event: ev, Seq: uint64(i + 1),
		}
	}
	return out
}

func fold(log []events.Envelope) *projections.Request {
	r := projections.NewRequest()
	for _, e := range log {
		r.Apply(e)
	}
	return r
}

func accepted(maxTokens int) events.RequestAccepted {
	return events.RequestAccepted{RequestID: "r1", Model: "mock", Endpoint: events.EndpointCompletions,
		Prompt: "p", PromptTokens: 1, MaxTokens: maxTokens, Stream: true, Frontend: "fe-1"}
}

func routed(k int, worker string, start int) events.RequestRouted {
	return events.RequestRouted{RequestID: "r1", Attempt: k, WorkerID: worker, StartOffset: start}
}

// delta is attempt k's tokens at offset, one token per character of text.
func delta(k, offset int, text string) events.TokensGenerated {
	return events.TokensGenerated{RequestID: "r1", Attempt: k, Offset: offset, Tokens: strings.Split(text, "")}
}

func completed(k int) events.RequestCompleted {
	return events.RequestCompleted{RequestID: "r1", Attempt: k, FinishReason: "stop"}
}

func fenced(k, offset int) events.AttemptFailed {
	return events.AttemptFailed{RequestID: "r1", Attempt: k, WorkerID: "w", Offset: offset, Reason: "lease lost"}
}

func migrated(from, cut int) events.RequestMigrated {
	return events.RequestMigrated{RequestID: "r1", FromAttempt: from, FromWorker: "w", Cut: cut,
		MigrationType: events.MigrationOngoingRequest, Reason: "lease lost", Frontend: "fe-2"}
}

func TestRequestFold(t *testing.T) {
	tests := []struct {
		name        string
		log         []events.Event
		wantText    string
		wantStatus  projections.Status
		wantSkipped int
	}{
		{
			name:       "accepted routed deltas completed",
			log:        []events.Event{accepted(0), routed(0, "w1", 0), delta(0, 0, "ab"), delta(0, 2, "cd"), completed(0)},
			wantText:   "abcd",
			wantStatus: projections.StatusCompleted,
		},
		{
			name:       "only accepted",
			log:        []events.Event{accepted(0)},
			wantStatus: projections.StatusPending,
		},
		{
			name:       "duplicate and overlapping deltas applied once",
			log:        []events.Event{accepted(0), routed(0, "w1", 0), delta(0, 0, "ab"), delta(0, 0, "ab"), delta(0, 1, "bcd"), delta(0, 2, "c"), delta(0, 4, "e")},
			wantText:   "abcde",
			wantStatus: projections.StatusRunning,
		},
		{
			name:        "gap skipped and counted",
			log:         []events.Event{accepted(0), routed(0, "w1", 0), delta(0, 0, "a"), delta(0, 3, "xyz"), delta(0, 1, "bc")},
			wantText:    "abc",
			wantStatus:  projections.StatusRunning,
			wantSkipped: 1,
		},
		{
			name:       "max_tokens caps",
			log:        []events.Event{accepted(3), routed(0, "w1", 0), delta(0, 0, "ab"), delta(0, 2, "cde"), delta(0, 3, "f"), completed(0)},
			wantText:   "abc",
			wantStatus: projections.StatusCompleted,
		},
		{
			name:       "deltas before routed ignored",
			log:        []events.Event{accepted(0), delta(0, 0, "ab"), routed(0, "w1", 0), delta(0, 0, "xy")},
			wantText:   "xy",
			wantStatus: projections.StatusRunning,
		},
		{
			name:       "routed out of order ignored",
			log:        []events.Event{accepted(0), routed(1, "w2", 0), delta(1, 0, "ab")},
			wantStatus: projections.StatusPending,
		},
		{
			name: "fenced attempt ignored, next attempt continues at the cut",
			log: []events.Event{accepted(0), routed(0, "w1", 0), delta(0, 0, "ab"), fenced(0, 2),
				delta(0, 2, "zz"), completed(0), migrated(0, 2), routed(1, "w2", 2), delta(1, 2, "cd"), completed(1)},
			wantText:   "abcd",
			wantStatus: projections.StatusCompleted,
		},
		{
			name: "zombie delta after next attempt started ignored",
			log: []events.Event{accepted(0), routed(0, "w1", 0), delta(0, 0, "ab"), fenced(0, 2), migrated(0, 2),
				routed(1, "w2", 2), delta(1, 2, "c"), delta(0, 2, "zzz"), delta(1, 3, "d"), completed(0), completed(1)},
			wantText:   "abcd",
			wantStatus: projections.StatusCompleted,
		},
		{
			// Regression: the migrated decision itself is a fence, even before
			// any AttemptFailed marker and before the next attempt is routed.
			name: "zombie delta between migrated and routed ignored",
			log: []events.Event{accepted(0), routed(0, "w1", 0), delta(0, 0, "ab"), migrated(0, 2),
				delta(0, 2, "zz"), routed(1, "w2", 2), delta(1, 2, "cd")},
			wantText:   "abcd",
			wantStatus: projections.StatusRunning,
		},
		{
			name: "failed is terminal",
			log: []events.Event{accepted(0), routed(0, "w1", 0), delta(0, 0, "a"),
				events.RequestFailed{RequestID: "r1", Code: "migration_exhausted", Status: 503, Offset: 1},
				delta(0, 1, "b"), routed(1, "w2", 1), completed(0), events.RequestCancelled{RequestID: "r1", Mode: events.CancelKill}},
			wantText:   "a",
			wantStatus: projections.StatusFailed,
		},
		{
			name: "cancel kill is terminal",
			log: []events.Event{accepted(0), routed(0, "w1", 0), delta(0, 0, "a"),
				events.RequestCancelled{RequestID: "r1", Mode: events.CancelKill, Reason: "client"}, delta(0, 1, "b"), completed(0), migrated(0, 1)},
			wantText:   "a",
			wantStatus: projections.StatusCancelled,
		},
		{
			name: "cancel stop lets the attempt finish",
			log: []events.Event{accepted(0), routed(0, "w1", 0), delta(0, 0, "a"),
				events.RequestCancelled{RequestID: "r1", Mode: events.CancelStop}, delta(0, 1, "b"), completed(0)},
			wantText:   "ab",
			wantStatus: projections.StatusCompleted,
		},
		{
			name:       "completed is terminal",
			log:        []events.Event{accepted(0), routed(0, "w1", 0), delta(0, 0, "a"), completed(0), delta(0, 1, "b"), routed(1, "w2", 1)},
			wantText:   "a",
			wantStatus: projections.StatusCompleted,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := fold(stored(tt.log...))
			if got := r.Text(); got != tt.wantText {
				t.Errorf("got text %q, want %q", got, tt.wantText)
			}
			if got := r.Len(); got != len(tt.wantText) {
				t.Errorf("got Len %d, want %d", got, len(tt.wantText))
			}
			if got := r.Status; got != tt.wantStatus {
				t.Errorf("got status %q, want %q", got, tt.wantStatus)
			}
			if got := r.Skipped; got != tt.wantSkipped {
				t.Errorf("got skipped %d, want %d", got, tt.wantSkipped)
			}
			if got := r.LastSeq(); got != uint64(len(tt.log)) {
				t.Errorf("got LastSeq %d, want %d", got, len(tt.log))
			}
		})
	}
}

func TestRequestMigrationState(t *testing.T) {
	log := stored(accepted(0), routed(0, "w1", 0), delta(0, 0, "ab"), fenced(0, 2), migrated(0, 2),
		routed(1, "w2", 2), delta(1, 2, "c"), events.RequestAttached{RequestID: "r1", Frontend: "fe-3", Offset: 3}, completed(1))
	r := fold(log)
	want := []projections.Attempt{
		{Attempt: 0, WorkerID: "w1", StartOffset: 0, Closed: true, Cut: 2, CloseReason: "lease lost"},
		{Attempt: 1, WorkerID: "w2", StartOffset: 2},
	}
	if !reflect.DeepEqual(r.Attempts, want) {
		t.Errorf("got attempts %+v, want %+v", r.Attempts, want)
	}
	wantMig := []projections.Migration{{FromAttempt: 0, FromWorker: "w", MigrationType: events.MigrationOngoingRequest, Offset: 2, Reason: "lease lost"}}
	if !reflect.DeepEqual(r.Migrations, wantMig) {
		t.Errorf("got migrations %+v, want %+v", r.Migrations, wantMig)
	}
	if cur, ok := r.Current(); !ok || cur.Attempt != 1 {
		t.Errorf("got current %+v %v, want attempt 1", cur, ok)
	}
	if r.Owner != "fe-3" {
		t.Errorf("got owner %q, want fe-3", r.Owner)
	}
	if want := log[len(log)-1].Time.Unix(); r.CompletedAt != want || r.FinishReason != "stop" {
		t.Errorf("got completed at %d reason %q, want %d stop", r.CompletedAt, r.FinishReason, want)
	}
	if got := r.Tokens(1); !reflect.DeepEqual(got, []string{"b", "c"}) {
		t.Errorf("got Tokens(1) %q, want [b c]", got)
	}
	got := r.Tokens(0)
	got[0] = "X"
	if r.Text() != "abc" {
		t.Errorf("Tokens returned an alias: text is %q after editing the copy", r.Text())
	}
	if got := r.Tokens(3); got != nil {
		t.Errorf("got Tokens(Len) %q, want nil", got)
	}
}

func TestRequestApplyIdempotent(t *testing.T) {
	log := stored(accepted(0), routed(0, "w1", 0), delta(0, 0, "ab"), delta(0, 3, "x"), fenced(0, 2), delta(0, 2, "zz"),
		migrated(0, 2), routed(1, "w2", 2), delta(1, 2, "cd"), events.RequestAttached{RequestID: "r1", Frontend: "fe-3"},
		delta(1, 4, "e"), completed(1))
	want := fold(log)
	if want.Text() != "abcde" {
		t.Fatalf("got text %q, want abcde", want.Text())
	}
	tests := []struct {
		name  string
		apply [][]events.Envelope
	}{
		{"whole log twice", [][]events.Envelope{log, log}},
		{"every prefix then the whole log", func() [][]events.Envelope {
			var out [][]events.Envelope
			for i := range log {
				out = append(out, log[:i])
			}
			return append(out, log)
		}()},
		{"each event twice", func() [][]events.Envelope {
			var out [][]events.Envelope
			for i := range log {
				out = append(out, log[i:i+1], log[i:i+1])
			}
			return out
		}()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := projections.NewRequest()
			for _, part := range tt.apply {
				for _, e := range part {
					r.Apply(e)
				}
			}
			if !reflect.DeepEqual(r, want) {
				t.Errorf("got %+v, want %+v", r, want)
			}
		})
	}
}

func TestRequestApplyReportsChange(t *testing.T) {
	r := projections.NewRequest()
	log := stored(accepted(0), routed(0, "w1", 0), delta(0, 0, "ab"))
	for _, e := range log {
		if !r.Apply(e) {
			t.Errorf("apply %s seq %d: got unchanged, want changed", e.Type(), e.Seq)
		}
	}
	for _, e := range log {
		if r.Apply(e) {
			t.Errorf("re-apply %s seq %d: got changed, want unchanged", e.Type(), e.Seq)
		}
	}
}

// TestRequestRouteInAccepted: attempt 0 routed in the accepted event
// (RequestAccepted.Route) folds as its own routed event does, a migration
// after it included; a routed event of attempt 0 after it changes nothing.
func TestRequestRouteInAccepted(t *testing.T) {
	acc := accepted(0)
	acc.Route = &events.RequestRouted{RequestID: "r1", WorkerID: "w1"}
	rest := []events.Event{delta(0, 0, "ab"), fenced(0, 2), migrated(0, 2), routed(1, "w2", 2), delta(1, 2, "c"), completed(1)}
	want := fold(stored(append([]events.Event{accepted(0), routed(0, "w1", 0)}, rest...)...)).State()
	for name, log := range map[string][]events.Event{
		"route in accepted":           append([]events.Event{acc}, rest...),
		"and a routed event after it": append([]events.Event{acc, routed(0, "w1", 0)}, rest...),
	} {
		got := fold(stored(log...)).State()
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: got %+v, want %+v", name, got, want)
		}
	}
}

// Events applied as appended (Seq 0) and again as stored must not be counted twice.
func TestRequestUnstoredThenStored(t *testing.T) {
	log := stored(accepted(0), routed(0, "w1", 0), delta(0, 0, "ab"), fenced(0, 2), migrated(0, 2),
		routed(1, "w2", 2), delta(1, 2, "c"), completed(1))
	want := fold(log)
	r := projections.NewRequest()
	for _, e := range log {
		local := e
		local.Seq = 0
		r.Apply(local)
		r.Apply(e)
	}
	if !reflect.DeepEqual(r, want) {
		t.Errorf("got %+v, want %+v", r, want)
	}
}

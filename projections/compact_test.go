package projections_test

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/streams"
)

// compactTail folds log, compacts the result and returns the log as a
// reader sees it after the purge: log's events-subject events (the
// lifecycle), then the compact record.
func compactTail(t *testing.T, log []events.Envelope) (full *projections.Request, after []events.Envelope) {
	t.Helper()
	full = fold(log)
	rec, err := full.Compact()
	if err != nil {
		t.Fatalf("Compact: %v", err)
	}
	for _, e := range log {
		switch e.Event.(type) {
		case events.TokensGenerated, events.RequestCompleted, events.AttemptFailed:
			continue // on the tokens subjects: purged
		}
		after = append(after, e)
	}
	last := log[len(log)-1]
	seq := last.Seq
	_, _, carry := full.Carry()
	for _, ev := range carry {
		seq++
		after = append(after, events.Envelope{ID: fmt.Sprint("carry", seq), Source: "baton/frontend/fe-1", Subject: "r1",
			Time: last.Time, Event: ev, Seq: seq})
	}
	after = append(after, events.Envelope{ID: "c", Source: "baton/frontend/fe-1", Subject: "r1",
		Time: last.Time, Event: rec, Seq: seq + 1})
	return full, after
}

// same says whether two projections give every reader the same request:
// state, text, tokens, ids, details and prompt length.
func same(t *testing.T, got, want *projections.Request) {
	t.Helper()
	type view struct {
		Accepted                   events.RequestAccepted
		Status                     projections.Status
		Owner, FinishReason        string
		Attempts                   []projections.Attempt
		Migrations                 []projections.Migration
		Failure                    *events.RequestFailed
		Cancel                     *events.RequestCancelled
		Children                   []string
		CompletedAt                int64
		Len, PromptTokens, Skipped int
		Tokens                     []string
		Text                       string
		IDs                        []int
		IDsKnown                   bool
		Details                    []json.RawMessage
		PromptIDs                  []int
		TokensFrom3                []string
		DetailsFrom3               []json.RawMessage
		CompletionTokens           int
	}
	v := func(r *projections.Request) view {
		ids, known := r.TokenIDs()
		return view{r.Accepted, r.Status, r.Owner, r.FinishReason, r.Attempts, r.Migrations, r.Failure, r.Cancel,
			r.Children, r.CompletedAt, r.Len(), r.PromptTokens(), r.Skipped, r.Tokens(0), r.Text(), ids, known,
			r.Details(0), r.PromptIDs, r.Tokens(3), r.Details(3), r.CompletionTokens()}
	}
	if g, w := v(got), v(want); !reflect.DeepEqual(g, w) {
		t.Errorf("after compaction\n got %+v\nwant %+v", g, w)
	}
}

func TestCompactionFoldsToTheSameRequest(t *testing.T) {
	withIDs := func(d events.TokensGenerated, first int) events.TokensGenerated {
		for i := range d.Tokens {
			d.IDs = append(d.IDs, first+i)
		}
		return d
	}
	withDetails := func(d events.TokensGenerated) events.TokensGenerated {
		d.Details = make([]json.RawMessage, len(d.Tokens))
		d.Details[0] = json.RawMessage(`{"logprobs":{"content":[{"token":"x","logprob":-0.5}]}}`)
		return d
	}
	first := withIDs(delta(0, 0, "abc"), 10)
	first.PromptIDs = []int{1, 2, 3}
	done := completed(1)
	done.PromptTokens = 3
	done.CompletionTokens = 11 // the server's count: more than the 8 tokens streamed (issue 22)
	tests := []struct {
		name string
		log  []events.Event
	}{
		{"plain", []events.Event{accepted(0), routed(0, "w1", 0), delta(0, 0, "ab"), delta(0, 2, "cd"), completed(0)}},
		{"migrated, with token ids and prompt ids", []events.Event{accepted(0), routed(0, "w1", 0), first,
			withIDs(delta(0, 3, "de"), 13), fenced(0, 5), migrated(0, 5), routed(1, "w2", 5),
			withIDs(delta(1, 5, "fgh"), 15), done}},
		{"ids lost, a zombie's late delta, max tokens", []events.Event{accepted(6), routed(0, "w1", 0),
			withIDs(delta(0, 0, "ab"), 1), delta(0, 2, "cd"), migrated(0, 4), delta(0, 4, "zz"), routed(1, "w2", 4),
			delta(1, 4, "efgh"), completed(1)}},
		{"details (tool calls, logprobs)", []events.Event{accepted(0), routed(0, "w1", 0),
			withDetails(delta(0, 0, "abc")), delta(0, 3, "de"), withDetails(delta(0, 5, "fg")), completed(0)}},
		{"failed", []events.Event{accepted(0), routed(0, "w1", 0), delta(0, 0, "ab"),
			events.RequestFailed{RequestID: "r1", Code: "migration_exhausted", Status: 500, Offset: 2}}},
		{"killed", []events.Event{accepted(0), routed(0, "w1", 0), delta(0, 0, "ab"),
			events.RequestCancelled{RequestID: "r1", Mode: events.CancelKill, Reason: "client"}}},
		{"stopped", []events.Event{accepted(0), routed(0, "w1", 0), delta(0, 0, "ab"),
			events.RequestCancelled{RequestID: "r1", Mode: events.CancelStop}, delta(0, 2, "c"),
			events.RequestCompleted{RequestID: "r1", Attempt: 0, FinishReason: "cancelled"}}},
		{"no token", []events.Event{accepted(0), routed(0, "w1", 0), completed(0)}},
		{"a parent of children", []events.Event{accepted(0), events.ChildAdded{RequestID: "r1", ChildID: "r1-1"},
			routed(0, "w1", 0), delta(0, 0, "a"), completed(0)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			log := stored(tc.log...)
			full, after := compactTail(t, log)
			same(t, fold(after), full)
			// A reader that predates compact records skips the record and
			// folds the carry: the same answer, for a completed request.
			old := fold(after[:len(after)-1])
			if full.Status == projections.StatusCompleted && (old.Text() != full.Text() || old.Status != full.Status ||
				old.FinishReason != full.FinishReason || old.PromptTokens() != full.PromptTokens()) {
				t.Errorf("a reader without compact records: %s %q %q, want %s %q %q",
					old.Status, old.Text(), old.FinishReason, full.Status, full.Text(), full.FinishReason)
			}
			// A reader that saw the whole history, or part of it while it
			// was being purged, folds the record to the same state.
			same(t, fold(append(log, after[len(after)-1])), full)
			same(t, fold(append(log[:len(log)/2], after...)), full)
			// The record is read once: applying it again changes nothing.
			r := fold(after)
			if changed, why := r.Fold(withSeq(after[len(after)-1], after[len(after)-1].Seq+1)); changed || why != projections.NoEffectApplied {
				t.Errorf("second record: changed %v (%s), want no effect", changed, why)
			}
			c := projections.NewRequestCounter()
			for _, e := range after {
				c.Apply(e)
			}
			if c.Len() != full.Len() || c.Status != full.Status {
				t.Errorf("counter after compaction: %d tokens %s, want %d %s", c.Len(), c.Status, full.Len(), full.Status)
			}
		})
	}
}

func withSeq(e events.Envelope, seq uint64) events.Envelope { e.Seq = seq; return e }

func TestCompactRefusesARequestInFlight(t *testing.T) {
	r := fold(stored(accepted(0), routed(0, "w1", 0), delta(0, 0, "ab")))
	if _, err := r.Compact(); err == nil || !strings.Contains(err.Error(), "not finished") {
		t.Fatalf("Compact of a running request: %v, want not finished", err)
	}
}

func TestCompactRecordThatCannotBeReadIsIgnored(t *testing.T) {
	for _, tc := range []struct {
		name, state, why string
	}{
		{"not JSON", `{`, projections.IgnoredCompactUnreadable},
		{"lengths past the text", `{"v":1,"status":"completed","n":2,"text":"a","lens":[1,1]}`, projections.IgnoredCompactUnreadable},
		{"a newer version", `{"v":99,"status":"completed"}`, projections.IgnoredCompactVersion},
	} {
		t.Run(tc.name, func(t *testing.T) {
			log := stored(accepted(0), routed(0, "w1", 0), delta(0, 0, "ab"), completed(0),
				events.RequestCompacted{RequestID: "r1", State: json.RawMessage(tc.state)})
			r := projections.NewRequest()
			var why string
			for _, e := range log {
				_, why = r.Fold(e)
			}
			if why != tc.why || r.Text() != "ab" {
				t.Errorf("got %q with text %q, want %q and the deltas' text", why, r.Text(), tc.why)
			}
		})
	}
}

// TestCompactRecordOnlyFromTheEventsSubject: a worker may write its own
// tokens subjects; a compact record stored there is ignored.
func TestCompactRecordOnlyFromTheEventsSubject(t *testing.T) {
	log := stored(accepted(0), routed(0, "w1", 0), delta(0, 0, "ab"), completed(0))
	full := fold(log)
	rec, err := full.Compact()
	if err != nil {
		t.Fatal(err)
	}
	forged := fold(stored(accepted(0), routed(0, "w1", 0), delta(0, 0, "ab")))
	rec.State = json.RawMessage(strings.Replace(string(rec.State), `"text":"ab"`, `"text":"PW"`, 1))
	changed, why := forged.Fold(events.Envelope{Seq: 10, Event: rec, Stored: streams.RequestTokens("r1", 0, "w1")})
	if changed || why != projections.IgnoredWrongSubject {
		t.Fatalf("record on a tokens subject: changed %v (%s), want %q", changed, why, projections.IgnoredWrongSubject)
	}
}

package projections_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go"
)

// on stores evs on the subjects given, in order (the subject is what a
// reader learns from NATS: who may write it is what permissions enforce).
func on(pairs ...any) []events.Envelope {
	var evs []events.Event
	for i := 1; i < len(pairs); i += 2 {
		evs = append(evs, pairs[i].(events.Event))
	}
	out := stored(evs...)
	for i := range out {
		out[i].Stored = pairs[2*i].(string)
	}
	return out
}

// TestFoldAcceptsOnlyTheRoutedWorker: an attempt's output counts only from
// the tokens subject of that attempt and of the worker its routed event
// names; a decision only from the events subject. Whatever another worker
// writes on the subjects its permissions allow (its own) is ignored, with a
// reason that baton replay shows.
func TestFoldAcceptsOnlyTheRoutedWorker(t *testing.T) {
	ev, tok := streams.RequestEvents("r1"), func(k int, w string) string { return streams.RequestTokens("r1", k, w) }
	head := []any{ev, accepted(10), ev, routed(0, "w2", 0)}
	kill := events.RequestCancelled{RequestID: "r1", Mode: events.CancelKill, Reason: "forged"}
	for _, tc := range []struct {
		name string
		last []any // the event under test, after head and w2's first token
		why  string
	}{
		{"the routed worker's tokens", []any{tok(0, "w2"), delta(0, 1, "b")}, ""},
		{"the routed worker's completion", []any{tok(0, "w2"), completed(0)}, ""},
		{"tokens on another worker's subject", []any{tok(0, "w1"), delta(0, 1, "X")}, projections.IgnoredNotRouted},
		{"a completion on another worker's subject", []any{tok(0, "w1"), completed(0)}, projections.IgnoredNotRouted},
		{"an attempt_failed on another worker's subject", []any{tok(0, "w1"), fenced(0, 1)}, projections.IgnoredNotRouted},
		{"a cancel on a tokens subject", []any{tok(0, "w1"), kill}, projections.IgnoredWrongSubject},
		{"a cancel on the routed worker's tokens subject", []any{tok(0, "w2"), kill}, projections.IgnoredWrongSubject},
		{"a routed on a tokens subject", []any{tok(0, "w1"), routed(1, "w1", 1)}, projections.IgnoredWrongSubject},
		{"tokens on the events subject", []any{ev, delta(0, 1, "X")}, projections.IgnoredWrongSubject},
		{"tokens of attempt 0 on attempt 1's subject", []any{tok(1, "w2"), delta(0, 1, "X")}, projections.IgnoredWrongSubject},
		{"another request's subject", []any{streams.RequestTokens("r2", 0, "w2"), delta(0, 1, "X")}, projections.IgnoredWrongSubject},
		{"a cancel on the events subject", []any{ev, kill}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			log := on(append(append(head, tok(0, "w2"), delta(0, 0, "a")), tc.last...)...)
			r := projections.NewRequest()
			for _, e := range log[:len(log)-1] {
				if changed, why := r.Fold(e); !changed {
					t.Fatalf("setup event %s not applied: %s", e.Type(), why)
				}
			}
			changed, why := r.Fold(log[len(log)-1])
			if why != tc.why || changed != (tc.why == "") {
				t.Errorf("Fold = %v %q, want %q", changed, why, tc.why)
			}
			if tc.why != "" && (r.Text() != "a" || r.Status != projections.StatusRunning) {
				t.Errorf("after an ignored event: text %q status %s, want \"a\" running", r.Text(), r.Status)
			}
		})
	}
}

// TestDiscoveryAcceptsOnlyTheWorkersOwnSubject: a worker lifecycle event
// counts only from the events subject of the worker it names, and only for
// that worker's current lease. Formerly w1 could write a draining (lost,
// deregistered) naming w2 on its own subject and take w2 out of routing on
// every frontend; now it is ignored, with the reason baton events shows.
func TestDiscoveryAcceptsOnlyTheWorkersOwnSubject(t *testing.T) {
	w1, w2 := streams.WorkerEvents("w1"), streams.WorkerEvents("w2")
	for _, tc := range []struct {
		name    string
		subject string
		ev      events.Event
		why     string
		routed  []string // routable afterwards
	}{
		{"w2's own draining", w2, events.WorkerDraining{WorkerID: "w2", LeaseID: "l2"}, "", []string{"w1"}},
		{"a frontend's lost of w2 on w2's subject", w2, events.WorkerLost{WorkerID: "w2", LeaseID: "l2"}, "", []string{"w1"}},
		{"draining naming w2 on w1's subject", w1, events.WorkerDraining{WorkerID: "w2", LeaseID: "l2"}, projections.IgnoredNotWorkersSubject, []string{"w1", "w2"}},
		{"lost naming w2 on w1's subject", w1, events.WorkerLost{WorkerID: "w2", LeaseID: "l2"}, projections.IgnoredNotWorkersSubject, []string{"w1", "w2"}},
		{"deregistered naming w2 on w1's subject", w1, events.WorkerDeregistered{WorkerID: "w2", LeaseID: "l2"}, projections.IgnoredNotWorkersSubject, []string{"w1", "w2"}},
		{"draining naming w2 on a request subject", streams.RequestEvents("r1"), events.WorkerDraining{WorkerID: "w2", LeaseID: "l2"}, projections.IgnoredNotWorkersSubject, []string{"w1", "w2"}},
		{"w2's draining of another lease", w2, events.WorkerDraining{WorkerID: "w2", LeaseID: "l0"}, projections.IgnoredNotCurrentLease, []string{"w1", "w2"}},
		{"w2's draining built in process", "", events.WorkerDraining{WorkerID: "w2", LeaseID: "l2"}, "", []string{"w1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := projections.NewDiscovery()
			d.ApplyLease(projections.LeaseUpdate{Key: "w1", Revision: 1, Lease: &events.Lease{WorkerID: "w1", LeaseID: "l1", Model: "m"}})
			d.ApplyLease(projections.LeaseUpdate{Key: "w2", Revision: 2, Lease: &events.Lease{WorkerID: "w2", LeaseID: "l2", Model: "m"}})
			_, why := d.Fold(events.Envelope{ID: "x", Source: "test", Seq: 1, Stored: tc.subject, Event: tc.ev})
			if why != tc.why {
				t.Errorf("got why %q, want %q", why, tc.why)
			}
			var got []string
			for _, w := range d.Routable("m") {
				got = append(got, w.ID)
			}
			if !slices.Equal(got, tc.routed) {
				t.Errorf("got routable %v, want %v", got, tc.routed)
			}
			// The lease renewed: a forged event must not have been kept for it.
			d.ApplyLease(projections.LeaseUpdate{Key: "w2", Revision: 3, Lease: &events.Lease{WorkerID: "w2", LeaseID: "l2", Model: "m"}})
			if w, _ := d.Get("w2"); w.Routable() != (len(tc.routed) == 2) {
				t.Errorf("after a renewal w2 is %s, want routable %v", w.State, len(tc.routed) == 2)
			}
			// baton events says the same of the stored event, from the log alone.
			var log projections.WorkerLog
			log.Check(events.Envelope{Stored: w2, Event: events.WorkerRegistered{WorkerID: "w2", LeaseID: "l2"}})
			if tc.subject != "" {
				if got := log.Check(events.Envelope{Stored: tc.subject, Event: tc.ev}); got != tc.why {
					t.Errorf("WorkerLog.Check: got %q, want %q", got, tc.why)
				}
			}
		})
	}
}

// batchOf is worker's batch for owner fe-1 of evs (deltas and other events
// of r1), as stored on streams.WorkerOutput (republished when live).
func batchOf(t *testing.T, worker string, live bool, evs ...events.Event) *nats.Msg {
	t.Helper()
	enc, err := events.NewBatchEncoder("baton/worker/" + worker)
	if err != nil {
		t.Fatal(err)
	}
	for i, ev := range evs {
		at := t0.Add(time.Duration(i) * time.Millisecond)
		if d, ok := ev.(events.TokensGenerated); ok {
			err = enc.AppendDelta("", at, d)
		} else {
			err = enc.AppendEvent(events.Envelope{ID: events.ID("b", i), Source: "baton/worker/" + worker, Subject: "r1", Time: at, Event: ev})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	h, body, err := enc.Message(nil, worker+".1")
	if err != nil {
		t.Fatal(err)
	}
	subj := streams.WorkerOutput(worker, "fe-1")
	if live {
		subj = "baton.live." + strings.TrimPrefix(subj, "baton.")
	}
	return &nats.Msg{Subject: subj, Header: nats.Header(h), Data: body}
}

// TestFoldConfinesBatchedOutput: the entries of a worker's batch (issue
// 33's write path) fold under the rule of the per-token subjects, with no
// rule of their own: an attempt's output counts only when its batch is of
// the worker the attempt was routed to, and a batch carries no decision.
func TestFoldConfinesBatchedOutput(t *testing.T) {
	ev := streams.RequestEvents("r1")
	kill := events.RequestCancelled{RequestID: "r1", Mode: events.CancelKill, Reason: "forged"}
	for _, tc := range []struct {
		name   string
		worker string
		live   bool
		ev     events.Event
		why    string
	}{
		{"the routed worker's tokens", "w2", false, delta(0, 1, "b"), ""},
		{"the routed worker's tokens, republished", "w2", true, delta(0, 1, "b"), ""},
		{"the routed worker's completion", "w2", false, completed(0), ""},
		{"another worker's tokens of the attempt", "w3", false, delta(0, 1, "b"), projections.IgnoredNotRouted},
		{"another worker's completion", "w3", true, completed(0), projections.IgnoredNotRouted},
		{"a decision in the routed worker's batch", "w2", false, kill, projections.IgnoredWrongSubject},
		{"a routing in the routed worker's batch", "w2", false, routed(1, "w2", 1), projections.IgnoredWrongSubject},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := fold(on(ev, accepted(10), ev, routed(0, "w2", 0), streams.RequestTokens("r1", 0, "w2"), delta(0, 0, "a")))
			worker, entries, err := streams.BatchEntries(batchOf(t, tc.worker, tc.live, tc.ev))
			if err != nil || worker != tc.worker || len(entries) != 1 {
				t.Fatalf("BatchEntries: worker %q, %d entries, %v; want %s's one entry", worker, len(entries), err, tc.worker)
			}
			if entries[0].Seq != 0 {
				t.Errorf("an entry's Seq %d, want 0 (the batch's is no position in the partition)", entries[0].Seq)
			}
			if changed, why := r.Fold(entries[0]); why != tc.why || changed != (tc.why == "") {
				t.Errorf("Fold: changed %v, why %q; want %q", changed, why, tc.why)
			}
		})
	}
}

// TestBatchEntriesOfOtherSubjects: only a worker's output subject holds
// batches; a batch elsewhere, or one whose body cannot be framed, is an
// error.
func TestBatchEntriesOfOtherSubjects(t *testing.T) {
	m := batchOf(t, "w2", false, delta(0, 0, "a"))
	for _, subj := range []string{streams.RequestTokens("r1", 0, "w2"), "baton.out.w2", "baton.out..d.fe-1", "baton.out.w2.d.", "baton.out.w*.d.fe-1"} {
		if _, _, err := streams.BatchEntries(&nats.Msg{Subject: subj, Header: m.Header, Data: m.Data}); !errors.Is(err, events.ErrBadBatch) {
			t.Errorf("a batch on %q: %v, want ErrBadBatch", subj, err)
		}
	}
	two := batchOf(t, "w2", false, delta(0, 0, "a"), delta(0, 1, "b"))
	cut := &nats.Msg{Subject: two.Subject, Header: two.Header, Data: two.Data[:len(two.Data)-3]}
	if _, entries, err := streams.BatchEntries(cut); !errors.Is(err, events.ErrBadBatch) || len(entries) != 1 {
		t.Errorf("a batch cut short: %d entries, %v; want the first entry and ErrBadBatch", len(entries), err)
	}
	if w, o, ok := streams.ParseWorkerOutput(streams.WorkerOutput("w2", "fe-1")); !ok || w != "w2" || o != "fe-1" {
		t.Errorf("ParseWorkerOutput(WorkerOutput(w2, fe-1)) = %q, %q, %v", w, o, ok)
	}
}

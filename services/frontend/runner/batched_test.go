package runner

import (
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/internal/notify"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/streams"
)

// TestLiveOutputsGaps: a batch is fresh once, and follows a gap when its
// subject's previous batch (the server's Nats-Last-Sequence) was not
// delivered here, the first batch of a subject included when it has a
// predecessor.
func TestLiveOutputsGaps(t *testing.T) {
	o := &liveOutputs{last: map[string]uint64{}}
	for _, c := range []struct {
		subject    string
		seq, prev  uint64
		gap, fresh bool
	}{
		{"a", 1, 0, false, true},
		{"a", 2, 1, false, true},
		{"a", 2, 1, false, false}, // delivered again
		{"a", 5, 4, true, true},   // 3 and 4 were not delivered
		{"a", 4, 3, false, false}, // older than what was delivered
		{"b", 9, 7, true, true},   // first seen: 7 and before may be ours
		{"b", 10, 9, false, true},
	} {
		if gap, fresh := o.seen(c.subject, c.seq, c.prev); gap != c.gap || fresh != c.fresh {
			t.Errorf("%s seq %d after %d: gap %v fresh %v, want %v %v", c.subject, c.seq, c.prev, gap, fresh, c.gap, c.fresh)
		}
	}
}

// testFollower is a follower of request r1 with no log to read.
func testFollower() *follower {
	return &follower{id: "r1", changed: notify.NewSignal(), decided: notify.NewSignal(), proj: projections.NewRequest()}
}

// TestFollowerBatches: a follower applies a batch's entries once, in
// order; it holds back a batch whose attempt it has not seen routed (it
// reads the log for that), and takes nothing more of an attempt it sealed.
func TestFollowerBatches(t *testing.T) {
	f := testFollower()
	subj := streams.WorkerOutput("w1", "fe-1")
	entry := func(ev events.Event) events.Envelope {
		return events.Envelope{ID: "x", Subject: "r1", Time: time.Now(), Event: ev,
			Stored: streams.RequestTokens("r1", 0, "w1")}
	}
	tok := func(k, off int, s string) events.Envelope {
		return entry(events.TokensGenerated{RequestID: "r1", Attempt: k, Offset: off, Tokens: []string{s}})
	}
	apply := func(b *outBatch) (bool, bool) {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.applyBatchLocked(b)
	}
	f.apply(events.Envelope{ID: "a", Subject: "r1", Time: time.Now(), Seq: 1, Stored: streams.RequestEvents("r1"),
		Event: events.RequestAccepted{RequestID: "r1", Model: "m", Endpoint: events.EndpointCompletions, Prompt: "p", Frontend: "fe-1"}})
	early := &outBatch{subject: subj, seq: 3, entries: []events.Envelope{tok(0, 0, "a")}}
	if changed, ok := apply(early); changed || ok {
		t.Fatalf("a batch of an attempt not routed: changed %v ok %v, want held back", changed, ok)
	}
	f.apply(events.Envelope{ID: "r", Subject: "r1", Time: time.Now(), Seq: 2, Stored: streams.RequestEvents("r1"),
		Event: events.RequestRouted{RequestID: "r1", WorkerID: "w1", Output: events.OutputBatched, OutputTo: "fe-1"}})
	if changed, ok := apply(early); !changed || !ok {
		t.Fatalf("the batch once routed: changed %v ok %v", changed, ok)
	}
	if changed, _ := apply(early); changed {
		t.Error("a batch applied twice changed the fold")
	}
	apply(&outBatch{subject: subj, seq: 4, entries: []events.Envelope{tok(0, 1, "b")}})
	f.seal(0)
	apply(&outBatch{subject: subj, seq: 5, entries: []events.Envelope{tok(0, 2, "c")}})
	f.view(func(p *projections.Request) {
		if p.Text() != "ab" {
			t.Errorf("the fold's text %q, want %q (nothing after the seal)", p.Text(), "ab")
		}
	})
	if got := f.outSeqs.get(subj); got != 5 {
		t.Errorf("the last batch applied of %s: %d, want 5", subj, got)
	}
	if !f.batchedOn("w1") || !f.batchedOn("") || f.batchedOn("w2") {
		t.Errorf("batchedOn w1 %v, any %v, w2 %v: want true, true, false", f.batchedOn("w1"), f.batchedOn(""), f.batchedOn("w2"))
	}
}

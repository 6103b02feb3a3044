package runner

import (
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/internal/notify"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/streams"
)

// routeBatched has f fold request r1's acceptance and its attempt 0's
// routed decision, batched to fe-1 by w1.
func routeBatched(f *follower) {
	f.apply(events.Envelope{ID: "a", Subject: "r1", Time: time.Now(), Seq: 1, Stored: streams.RequestEvents("r1"),
		Event: events.RequestAccepted{RequestID: "r1", Model: "m", Endpoint: events.EndpointCompletions, Prompt: "p", Frontend: "fe-1"}})
	f.apply(events.Envelope{ID: "r", Subject: "r1", Time: time.Now(), Seq: 2, Stored: streams.RequestEvents("r1"),
		Event: events.RequestRouted{RequestID: "r1", WorkerID: "w1", Output: events.OutputBatched, OutputTo: "fe-1"}})
}

// entry is an entry of a batch of w1's attempt 0 of r1, carrying ev.
func entry(ev events.Event) events.Envelope {
	return events.Envelope{ID: "x", Subject: "r1", Time: time.Now(), Event: ev, Stored: streams.RequestTokens("r1", 0, "w1")}
}

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
	return &follower{id: "r1", changed: notify.NewSignal(), decided: notify.NewSignal(), proj: projections.NewRequest(),
		subs: &live{outs: &liveOutputs{self: "fe-1", last: map[string]uint64{}, foreign: map[string]*foreignSub{}}}}
}

// TestFollowerBatches: a follower applies a batch's entries once, in
// order; it holds the batches of an attempt it has not seen routed until
// it does (past maxHeld it reads the log instead), and takes nothing more
// of an attempt it sealed.
func TestFollowerBatches(t *testing.T) {
	f := testFollower()
	subj := streams.WorkerOutput("w1", "fe-1")
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
	// The worker was told of its attempt before this follower folded the
	// decision: its first batches are held, in order, until it does.
	early := &outBatch{subject: subj, seq: 3, entries: []events.Envelope{tok(0, 0, "a")}}
	if changed, ok := apply(early); changed || !ok {
		t.Fatalf("a batch of an attempt not routed: changed %v ok %v, want held", changed, ok)
	}
	if changed, ok := apply(&outBatch{subject: subj, seq: 4, entries: []events.Envelope{tok(0, 1, "b")}}); changed || !ok {
		t.Fatalf("a batch after a held one: changed %v ok %v, want held", changed, ok)
	}
	f.apply(events.Envelope{ID: "r", Subject: "r1", Time: time.Now(), Seq: 2, Stored: streams.RequestEvents("r1"),
		Event: events.RequestRouted{RequestID: "r1", WorkerID: "w1", Output: events.OutputBatched, OutputTo: "fe-1"}})
	f.view(func(p *projections.Request) {
		if p.Text() != "ab" {
			t.Fatalf("the held batches once routed: text %q, want %q", p.Text(), "ab")
		}
	})
	if changed, _ := apply(early); changed {
		t.Error("a batch applied twice changed the fold")
	}
	// Past maxHeld, the follower reads the log instead.
	g := testFollower()
	for i := range maxHeld {
		if _, ok := func() (bool, bool) {
			g.mu.Lock()
			defer g.mu.Unlock()
			return g.applyBatchLocked(&outBatch{subject: subj, seq: uint64(i + 1), entries: []events.Envelope{tok(0, i, "x")}})
		}(); !ok {
			t.Fatalf("held %d batches: not ok", i)
		}
	}
	g.mu.Lock()
	if _, ok := g.applyBatchLocked(&outBatch{subject: subj, seq: maxHeld + 1, entries: []events.Envelope{tok(0, maxHeld, "x")}}); ok {
		t.Error("a batch past maxHeld held: want the log read")
	}
	g.mu.Unlock()
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

// TestFollowerWaitsForMissedBatches: a live batch that follows batches the
// follower missed (its subscription saw a gap: requireOut) is not applied
// (the follower reads back first): an attempt's end applied after a gap
// would end it short.
func TestFollowerWaitsForMissedBatches(t *testing.T) {
	f := testFollower()
	subj := streams.WorkerOutput("w1", "fe-1")
	routeBatched(f)
	apply := func(b *outBatch) bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		_, ok := f.applyBatchLocked(b)
		return ok
	}
	apply(&outBatch{subject: subj, seq: 3, live: true, entries: []events.Envelope{entry(events.TokensGenerated{RequestID: "r1", Offset: 0, Tokens: []string{"a"}})}})
	f.requireOut(subj, 9) // batches up to 9 were not delivered
	end := &outBatch{subject: subj, seq: 10, live: true, entries: []events.Envelope{entry(events.RequestCompleted{RequestID: "r1", FinishReason: "stop"})}}
	if apply(end) {
		t.Fatal("a live end after missed batches was applied")
	}
	// The read back: batch 7 held the missing token.
	apply(&outBatch{subject: subj, seq: 7, entries: []events.Envelope{entry(events.TokensGenerated{RequestID: "r1", Offset: 1, Tokens: []string{"b"}})}})
	apply(&outBatch{subject: subj, seq: 9})
	if !apply(end) {
		t.Fatal("the end, once the missed batches were read, was not applied")
	}
	f.view(func(p *projections.Request) {
		if p.Text() != "ab" || p.Status != projections.StatusCompleted {
			t.Errorf("the fold: %s %q, want completed %q", p.Status, p.Text(), "ab")
		}
	})
}

// TestFollowerTakesARepairAfterItsGap: a worker whose append of a delta
// failed repairs it after the deltas that followed, here in one batch
// (delta 2, then the repair of 1-2, then delta 3): the follower applies the
// whole batch, and the fold has every token once.
func TestFollowerTakesARepairAfterItsGap(t *testing.T) {
	f := testFollower()
	subj := streams.WorkerOutput("w1", "fe-1")
	routeBatched(f)
	d := func(off int, toks ...string) events.Envelope {
		return events.Envelope{ID: "x", Subject: "r1", Time: time.Now(), Stored: streams.RequestTokens("r1", 0, "w1"),
			Event: events.TokensGenerated{RequestID: "r1", Offset: off, Tokens: toks}}
	}
	f.mu.Lock()
	f.applyBatchLocked(&outBatch{subject: subj, seq: 3, live: true, entries: []events.Envelope{d(0, "a")}})
	_, ok := f.applyBatchLocked(&outBatch{subject: subj, seq: 4, live: true, entries: []events.Envelope{d(2, "c"), d(1, "b", "c"), d(3, "d")}})
	f.mu.Unlock()
	f.view(func(p *projections.Request) {
		if !ok || p.Text() != "abcd" {
			t.Errorf("ok %v, text %q: want the batch applied, %q", ok, p.Text(), "abcd")
		}
	})
}

// TestFollowerReadsTheLastCopiedBatchAgain: a copy on the partition noted
// the attempt's output through batch 5, whose tokens it held, but batch 5
// also held the attempt's end, and the owner died before it copied that.
// Read back again (readOutput starts at the batch noted), batch 5 ends the
// attempt, and its tokens are not repeated; delivered live a second time,
// it is passed over.
func TestFollowerReadsTheLastCopiedBatchAgain(t *testing.T) {
	f := testFollower()
	subj := streams.WorkerOutput("w1", "fe-1")
	routeBatched(f)
	tokens := entry(events.TokensGenerated{RequestID: "r1", Offset: 0, Tokens: []string{"a", "b"}})
	f.mu.Lock()
	f.applyLocked(tokens)  // the copy's tokens, folded from the partition
	f.outSeqs.set(subj, 5) // and its outseq (noteConsolidated)
	end := entry(events.RequestCompleted{RequestID: "r1", FinishReason: "stop"})
	b := &outBatch{subject: subj, seq: 5, entries: []events.Envelope{tokens, end}}
	if changed, _ := f.applyBatchLocked(b); changed {
		t.Error("batch 5 delivered live, after the copy that noted it: applied, want passed over")
	}
	b.again = true
	changed, ok := f.applyBatchLocked(b)
	f.mu.Unlock()
	f.view(func(p *projections.Request) {
		if !changed || !ok || p.Status != projections.StatusCompleted || p.Text() != "ab" {
			t.Errorf("batch 5 read again: changed %v ok %v, the fold %s %q; want completed %q", changed, ok, p.Status, p.Text(), "ab")
		}
	})
}

// TestFollowerReadsForeignOutputBeforeLive: a follower of an attempt
// batched on another frontend's subject (a request taken over, or followed
// here while another owns it) applies no live batch of it before it has
// read the attempt's output back: the live batch is refused, and the
// follower's place in the subject stays where it was, so the read starts
// before the output it never saw. Formerly the live batch was applied (a
// gap, its tokens ignored) and moved the place past them: the churn soak
// with --batched-output stored answers completed with 1 of 198 tokens.
func TestFollowerReadsForeignOutputBeforeLive(t *testing.T) {
	f := testFollower()
	f.subs.outs.self = "fe-2" // the attempt was dispatched by fe-1
	subj := streams.WorkerOutput("w1", "fe-1")
	routeBatched(f)
	live := &outBatch{subject: subj, seq: 7, live: true,
		entries: []events.Envelope{entry(events.TokensGenerated{RequestID: "r1", Offset: 0, Tokens: []string{"a"}})}}
	f.mu.Lock()
	defer f.mu.Unlock()
	if changed, ok := f.applyBatchLocked(live); changed || ok || f.outSeqs.get(subj) != 0 {
		t.Fatalf("a live batch before the read back: changed %v ok %v, place %d; want refused at 0", changed, ok, f.outSeqs.get(subj))
	}
	f.readTo = 1 // readOutput read attempt 0 back
	if _, ok := f.applyBatchLocked(live); !ok || f.outSeqs.get(subj) != 7 {
		t.Errorf("a live batch after the read back: ok %v, place %d; want applied at 7", ok, f.outSeqs.get(subj))
	}
}

// TestFollowerReadsBackAfterALiveGap: a live batch whose tokens lie past
// the fold's end (batches before it never reached this follower, or a
// worker's repair is to come) leaves the follower's place before it and
// is refused, so that run reads the output back from there; once the
// missing tokens are folded, the same batch is applied and the place
// moves on. Formerly the place moved past it, and a read back started
// after the tokens it had missed.
func TestFollowerReadsBackAfterALiveGap(t *testing.T) {
	f := testFollower()
	subj := streams.WorkerOutput("w1", "fe-1")
	routeBatched(f)
	tok := func(off int, s string) events.Envelope {
		return entry(events.TokensGenerated{RequestID: "r1", Offset: off, Tokens: []string{s}})
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.applyBatchLocked(&outBatch{subject: subj, seq: 3, live: true, entries: []events.Envelope{tok(0, "a")}})
	past := &outBatch{subject: subj, seq: 6, live: true, entries: []events.Envelope{tok(2, "c")}}
	if _, ok := f.applyBatchLocked(past); ok || f.outSeqs.get(subj) != 3 {
		t.Fatalf("a live batch past a gap: ok %v, place %d; want refused at 3", ok, f.outSeqs.get(subj))
	}
	// The read back: batch 5 held token 1.
	f.applyBatchLocked(&outBatch{subject: subj, seq: 5, entries: []events.Envelope{tok(1, "b")}})
	if _, ok := f.applyBatchLocked(past); !ok || f.outSeqs.get(subj) != 6 || f.proj.Text() != "abc" {
		t.Errorf("the batch again, the gap filled: ok %v, place %d, text %q; want applied at 6, %q", ok, f.outSeqs.get(subj), f.proj.Text(), "abc")
	}
}

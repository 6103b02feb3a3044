package runner

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/streams"
)

// TestAdoptRank: for every request exactly one live frontend tries first,
// each frontend has its own rank, and the first tries are spread.
func TestAdoptRank(t *testing.T) {
	live := []string{"fe-a", "fe-b", "fe-c"}
	first := map[string]int{}
	for seq := uint64(1); seq <= 300; seq++ {
		at := events.StoredAt{Partition: int(seq % 3), Seq: seq}
		seen := map[int]bool{}
		for _, id := range live {
			r := adoptRank(at, id, live)
			if r < 0 || r >= len(live) || seen[r] {
				t.Fatalf("%v: got rank %d for %s (ranks so far %v), want a distinct rank below %d", at, r, id, seen, len(live))
			}
			seen[r] = true
			if r == 0 {
				first[id]++
			}
		}
	}
	for _, id := range live {
		if n := first[id]; n < 60 || n > 140 {
			t.Errorf("%s tries first for %d of 300 requests, want about 100", id, n)
		}
	}
}

// TestAdoptableList: the list is in order, and bounded.
func TestAdoptableList(t *testing.T) {
	a := newAdoptable()
	a.add(events.StoredAt{Partition: 1, Seq: 3})
	a.add(events.StoredAt{Partition: 0, Seq: 9})
	a.add(events.StoredAt{Partition: 1, Seq: 2})
	a.remove(events.StoredAt{Partition: 1, Seq: 3})
	got, left := a.list()
	if want := []events.StoredAt{{Partition: 0, Seq: 9}, {Partition: 1, Seq: 2}}; fmt.Sprint(got) != fmt.Sprint(want) || left != 0 {
		t.Errorf("got %v (%d left out), want %v", got, left, want)
	}
	for seq := range uint64(maxAdoptable + 5) {
		a.add(events.StoredAt{Partition: 2, Seq: seq + 1})
	}
	if got, left := a.list(); len(got) != maxAdoptable || left != 7 {
		t.Errorf("got %d listed, %d left out, want %d and 7", len(got), left, maxAdoptable)
	}
}

// TestAdoptsOrphans: when a frontend's key goes, the background request it
// listed is adopted with no reader and runs to its end here; a request of
// the list that is not meant to outlive its client (a plain one: a
// departed frontend of another build could list anything) is left alone.
// This frontend's own key lists what it runs.
func TestAdoptsOrphans(t *testing.T) {
	x := newRunnerFixture(t, fakeWorker{id: "w1"})
	rn := x.start()
	accept := func(id string, background bool) events.StoredAt {
		acc := events.RequestAccepted{RequestID: id, Model: "m", Prompt: "p", PromptTokens: 1, MaxTokens: 2, Frontend: "fe-gone", Background: background}
		seq, err := x.log.Append(x.ctx, streams.RequestEvents(id), x.log.Envelope(events.ID(id, "accepted"), id, acc), 0)
		if err != nil {
			t.Fatal(err)
		}
		return events.StoredAt{Partition: rn.parts.PartitionOf(id), Seq: seq}
	}
	list := []events.StoredAt{accept("bg", true), accept("plain", false)}
	x.put(streams.FrontendsBucket, "fe-gone", events.FrontendPresence{FrontendID: "fe-gone", Adoptable: list})
	x.depart("fe-gone")
	// Adopted before it is attached to here: an attach first would take
	// it over as a client's resume does, and leave nothing to adopt.
	for x.counter("baton_frontend_requests_adopted_total") < 1 && x.ctx.Err() == nil {
		time.Sleep(5 * time.Millisecond)
	}

	bg, err := rn.Attach(x.ctx, "bg")
	if err != nil {
		t.Fatal(err)
	}
	defer bg.Release()
	err = bg.f.waitFor(x.ctx, func(p *projections.Request) bool { return p.Owner == "fe" && p.Status.Terminal() })
	var st projections.State
	bg.View(func(p *projections.Request) { st = p.State() })
	if err != nil || st.Status != "completed" || st.Owner != "fe" {
		t.Fatalf("background request: %v, state %+v, want adopted by fe and completed", err, st)
	}
	if got := x.counter("baton_frontend_requests_adopted_total"); got != 1 {
		t.Errorf("adoptions counted %v, want 1", got)
	}
	p, err := rn.Load(x.ctx, "plain")
	if err != nil || p.Owner != "fe-gone" || len(p.Attempts) != 0 {
		t.Errorf("plain request: %v, owner %q, %d attempts, want left to fe-gone", err, p.Owner, len(p.Attempts))
	}
	x.wg.Wait()
}

// TestAdoptionStepsIn: a request whose first-ranked live frontend does not
// adopt it is adopted by the next one adoptStagger later; one that a live
// frontend lists as its own is left to it.
func TestAdoptionStepsIn(t *testing.T) {
	x := newRunnerFixture(t, fakeWorker{id: "w1"})
	rn := x.start()
	live := []string{"fe", "fe-other"}
	byRank := map[int]string{} // rank of fe → a request
	ats := map[string]events.StoredAt{}
	for i := 0; len(byRank) < 2; i++ {
		id := fmt.Sprintf("r%d", i)
		acc := events.RequestAccepted{RequestID: id, Model: "m", Prompt: "p", PromptTokens: 1, MaxTokens: 2, Frontend: "fe-gone", Background: true}
		seq, err := x.log.Append(x.ctx, streams.RequestEvents(id), x.log.Envelope(events.ID(id, "accepted"), id, acc), 0)
		if err != nil {
			t.Fatal(err)
		}
		at := events.StoredAt{Partition: rn.parts.PartitionOf(id), Seq: seq}
		if r := adoptRank(at, "fe", live); byRank[r] == "" {
			byRank[r], ats[id] = id, at
		}
	}
	first, second := byRank[0], byRank[1] // fe tries first / second
	// fe-other lists first as its own (it took it over, say), and lists
	// nothing else: it never adopts second.
	x.put(streams.FrontendsBucket, "fe-other", events.FrontendPresence{FrontendID: "fe-other", Adoptable: []events.StoredAt{ats[first]}})
	x.put(streams.FrontendsBucket, "fe-gone", events.FrontendPresence{FrontendID: "fe-gone", Adoptable: []events.StoredAt{ats[first], ats[second]}})
	// Timed from before the delete: the fleet view's watch may see the
	// departure, and the adopter start its stagger, before the delete
	// returns (taken after it, "adopted 1.998s after its frontend went"
	// failed the test under load).
	gone := x.depart("fe-gone", "fe-other", "fe")
	req, err := rn.Attach(x.ctx, second)
	if err != nil {
		t.Fatal(err)
	}
	defer req.Release()
	if err := req.f.waitFor(x.ctx, func(p *projections.Request) bool { return p.Owner == "fe" }); err != nil {
		t.Fatalf("%s (fe second in line) never adopted: %v", second, err)
	}
	if took := time.Since(gone); took < adoptStagger {
		t.Errorf("%s adopted %v after its frontend went, want after %v (fe-other first in line)", second, took, adoptStagger)
	}
	p, err := rn.Load(x.ctx, first)
	if err != nil || p.Owner != "fe-gone" {
		t.Errorf("%s (listed by fe-other): %v, owner %q, want left alone", first, err, p.Owner)
	}
	// Adopted, second is dispatched to w1 and runs to its end: the fake
	// worker's serving (x.wg.Add) must come before the wait for its writes,
	// which otherwise raced a dispatch still on its way (the race detector
	// failed the test so under load).
	if err := req.f.waitFor(x.ctx, func(p *projections.Request) bool { return p.Status.Terminal() }); err != nil {
		t.Fatalf("%s, adopted, never ended: %v", second, err)
	}
	x.wg.Wait()
}

// TestListsAdoptable: a background request run here is listed in this
// frontend's presence key while it runs, and no longer once it ended.
func TestListsAdoptable(t *testing.T) {
	x := newRunnerFixture(t, fakeWorker{id: "w1", silent: true})
	rn := x.start()
	req, err := rn.Accept(x.ctx, events.RequestAccepted{RequestID: "bg", Model: "m", Prompt: "p", PromptTokens: 1, MaxTokens: 2, Frontend: "fe", Background: true})
	if err != nil {
		t.Fatal(err)
	}
	defer req.Release()
	var want events.StoredAt
	req.View(func(p *projections.Request) {
		want = events.StoredAt{Partition: rn.parts.PartitionOf("bg"), Seq: p.AcceptedSeq()}
	})
	kv, err := x.js.KeyValue(x.ctx, streams.FrontendsBucket)
	if err != nil {
		t.Fatal(err)
	}
	w, err := kv.Watch(x.ctx, "fe")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop() }()
	waitListed := func(what string, yes bool) {
		t.Helper()
		for {
			select {
			case e := <-w.Updates():
				var v events.FrontendPresence
				if e != nil && json.Unmarshal(e.Value(), &v) == nil && slices.Contains(v.Adoptable, want) == yes {
					return
				}
			case <-x.ctx.Done():
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}
	waitListed("bg listed in fe's key", true)
	if err := rn.Cancel(x.ctx, "bg", events.CancelKill, "test", ""); err != nil {
		t.Fatal(err)
	}
	waitListed("bg no longer listed", false)
}

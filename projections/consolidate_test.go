package projections_test

import (
	"testing"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
)

// batchedRouted is routed, batched to frontend fe-1.
func batchedRouted(k int, worker string, start int) events.RequestRouted {
	r := routed(k, worker, start)
	r.Output, r.OutputTo = events.OutputBatched, "fe-1"
	return r
}

// TestConsolidationFoldsToTheSameRequest: what an owner folded of batched
// attempts (here as the events themselves, with no stream sequence, as a
// batch's entries come) is copied to the partition as one delta per
// attempt and its closing event (Consolidation, Closing); a reader of the
// partition alone folds the copies to the owner's request, a migration's
// cut included.
func TestConsolidationFoldsToTheSameRequest(t *testing.T) {
	first := delta(0, 0, "abc")
	first.IDs, first.PromptIDs = []int{1, 2, 3}, []int{7, 8}
	first.Model = "upstream-model"
	second := delta(0, 3, "de")
	second.IDs = []int{4, 5}
	done := completed(1)
	done.PromptTokens, done.CompletionTokens = 2, 9
	// The owner: decisions from the partition, entries from the batches.
	owner := projections.NewRequest()
	decisions := stored(accepted(0), batchedRouted(0, "w1", 0), migrated(0, 5), batchedRouted(1, "w2", 5))
	entries := func(evs ...events.Event) {
		for _, ev := range evs {
			owner.Apply(events.Envelope{ID: "x", Subject: "r1", Time: t0, Event: ev})
		}
	}
	owner.Apply(decisions[0])
	owner.Apply(decisions[1])
	entries(first, second, fenced(0, 0)) // a fence among the batches closes attempt 0 at 5
	if _, ok := owner.Closing(1); ok {
		t.Error("Closing of an attempt not routed yet: ok")
	}
	// What the owner copies of attempt 0, before its decision.
	var partition []events.Event
	partition = append(partition, accepted(0), batchedRouted(0, "w1", 0))
	copyOf := func(k, from int) {
		if d, ok := owner.Consolidation(k, from); ok {
			partition = append(partition, d)
		}
		if ev, ok := owner.Closing(k); ok {
			partition = append(partition, ev)
		}
	}
	copyOf(0, 0)
	owner.Apply(decisions[2])
	owner.Apply(decisions[3])
	partition = append(partition, migrated(0, 5), batchedRouted(1, "w2", 5))
	entries(delta(1, 5, "fg"))
	// A copy while attempt 1 runs, then the rest and its completion.
	if d, ok := owner.Consolidation(1, 5); !ok || d.Offset != 5 || len(d.Tokens) != 2 {
		t.Fatalf("Consolidation of the running attempt 1: %+v %v", d, ok)
	} else {
		partition = append(partition, d)
	}
	entries(delta(1, 7, "hi"), done)
	copyOf(1, 7)
	log := stored(partition...)
	log[len(log)-1].Time = t0 // the copy of a completion keeps its time (batcher.consolidate in services/frontend/runner)
	reader := fold(log)
	same(t, reader, owner)
	if reader.Text() != "abcdefghi" || reader.Attempts[0].Cut != 5 || reader.Status != projections.StatusCompleted {
		t.Errorf("the partition folds to %q, attempt 0 cut at %d, %s", reader.Text(), reader.Attempts[0].Cut, reader.Status)
	}
	if d, ok := owner.Consolidation(1, 9); ok {
		t.Errorf("Consolidation past the end: %+v", d)
	}
}

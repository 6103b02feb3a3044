package streams_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/internal/natstest"
	"github.com/baton-dev/baton/streams"
)

// TestLastOfEach: the last message of each of 1,500 subjects asked (two
// batched gets), with its headers; subjects that hold nothing are missing
// from the answer, which is complete.
func TestLastOfEach(t *testing.T) {
	js := natstest.Start(t).JetStream(t)
	ctx := context.Background()
	if _, err := streams.Provision(ctx, js, streams.Config{MemoryStorage: true}); err != nil {
		t.Fatal(err)
	}
	log := streams.NewLog(js, "baton/frontend/fe-1")
	var subjects []string
	for i := range 1500 {
		id := fmt.Sprintf("r%d", i)
		subjects = append(subjects, streams.RequestEvents(id))
		if i%2 == 1 {
			continue
		}
		for k := range 2 {
			e := log.Envelope(fmt.Sprintf("%s-%d", id, k), id, events.RequestCancelled{RequestID: id})
			if _, err := log.Append(ctx, streams.RequestEvents(id), e, -1); err != nil {
				t.Fatal(err)
			}
		}
	}
	last, complete, err := streams.LastOfEach(ctx, js, streams.RequestsStream, subjects, 8<<20, false)
	if err != nil || !complete {
		t.Fatalf("LastOfEach: complete %v, %v", complete, err)
	}
	if len(last) != 750 {
		t.Errorf("got %d subjects, want 750", len(last))
	}
	for i, subj := range subjects {
		m, ok := last[subj]
		if ok != (i%2 == 0) {
			t.Fatalf("%s: in the answer %v", subj, ok)
		}
		if ok && (m.Header.Get(events.HeaderType) != events.TypeRequestCancelled || m.Sequence == 0) {
			t.Fatalf("%s: %+v", subj, m)
		}
	}
}

package streams_test

import (
	"testing"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/internal/natstest"
	"github.com/baton-dev/baton/streams"
)

// TestEndsPlace: an end stored in the ends place is read back, yielded by
// ReadRequest after the request's events up to its Through and before the
// later ones, stored once (a retry is the same end, another end does not
// replace it), replaced only when it is an earlier request's, and purged.
func TestEndsPlace(t *testing.T) {
	srv := natstest.Start(t)
	js := srv.Provision(t)
	ctx := testCtx(t)
	fe := streams.NewLog(js, "baton/frontend/fe-1")
	const id = "ends-1"
	app := func(subj string, evid string, ev events.Event) uint64 {
		t.Helper()
		return natstest.Append(ctx, t, fe, subj, evid, id, ev)
	}
	accepted := app(streams.RequestEvents(id), "a", events.RequestAccepted{RequestID: id, Model: "mock", Endpoint: events.EndpointCompletions, Prompt: "p", Frontend: "fe-1"})
	routed := app(streams.RequestEvents(id), "r", events.RequestRouted{RequestID: id, WorkerID: "w1"})
	app(streams.RequestTokens(id, 0, "w1"), "t", events.TokensGenerated{RequestID: id, Offset: 0, Tokens: []string{"late "}})

	if e, err := streams.ReadEnd(ctx, js, id); err != nil || e != nil {
		t.Fatalf("no end yet: got %v, %v", e, err)
	}
	failed := events.RequestFailed{RequestID: id, Code: "log_full", Status: 503}
	end := events.RequestEnded{RequestID: id, Frontend: "fe-1", Through: routed, Failed: &failed}
	for try := range 2 {
		if ok, err := streams.StoreEnd(ctx, fe, "ends-1.ended", end, accepted); !ok || err != nil {
			t.Fatalf("store the end (try %d): %v %v", try, ok, err)
		}
	}
	other := end
	other.Failed = &events.RequestFailed{RequestID: id, Code: "other"}
	if ok, err := streams.StoreEnd(ctx, fe, "ends-1.other", other, accepted); ok || err != nil {
		t.Fatalf("a second end: stored %v (%v), want the first to stand", ok, err)
	}
	var kinds []string
	for e, err := range streams.ReadRequest(ctx, js, 1, id, 1) {
		if err != nil {
			t.Fatal(err)
		}
		kinds = append(kinds, e.Type())
		if _, ok := e.Event.(events.RequestEnded); ok && (e.Seq != 0 || !streams.IsEndSubject(e.Stored) || e.Event.(events.RequestEnded).Failed.Code != "log_full") {
			t.Errorf("the end as read: seq %d on %s, %+v", e.Seq, e.Stored, e.Event)
		}
	}
	want := []string{events.TypeRequestAccepted, events.TypeRequestRouted, events.TypeRequestEnded, events.TypeTokensGenerated}
	if len(kinds) != len(want) {
		t.Fatalf("ReadRequest yields %v, want %v", kinds, want)
	}
	for i := range want {
		if kinds[i] != want[i] {
			t.Fatalf("ReadRequest yields %v, want %v", kinds, want)
		}
	}
	// From past the end's position, the end still comes first.
	var first string
	for e, err := range streams.ReadRequest(ctx, js, 1, id, routed+1) {
		if err == nil && first == "" {
			first = e.Type()
		}
	}
	if first != events.TypeRequestEnded {
		t.Errorf("a read from %d begins with %q, want the end", routed+1, first)
	}
	// A later request of the same id replaces the earlier one's end.
	next := end
	next.Through, next.Failed = accepted+100, &events.RequestFailed{RequestID: id, Code: "next"}
	if ok, err := streams.StoreEnd(ctx, fe, "ends-1.next", next, accepted+50); !ok || err != nil {
		t.Fatalf("the end of a later request of the id: %v %v", ok, err)
	}
	if e, _ := streams.ReadEnd(ctx, js, id); e == nil || e.Event.(events.RequestEnded).Failed.Code != "next" {
		t.Fatalf("after the later request's end: %+v", e)
	}
	if err := streams.PurgeEnd(ctx, js, id); err != nil {
		t.Fatal(err)
	}
	if e, err := streams.ReadEnd(ctx, js, id); err != nil || e != nil {
		t.Fatalf("after the purge: %v, %v", e, err)
	}
	// Nothing in the log: the end alone is not a request.
	if _, err := streams.StoreEnd(ctx, fe, "ends-2.ended", events.RequestEnded{RequestID: "ends-2", Through: 1, Failed: &events.RequestFailed{RequestID: "ends-2"}}, 0); err != nil {
		t.Fatal(err)
	}
	for _, err := range streams.ReadRequest(ctx, js, 1, "ends-2", 1) {
		if err != streams.ErrNotFound {
			t.Errorf("a request with only an end: got %v, want ErrNotFound", err)
		}
	}
}

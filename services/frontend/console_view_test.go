package frontend

import (
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/streams"
)

func TestParseCursor(t *testing.T) {
	cases := []struct {
		in      string
		parts   streams.Partitions
		want    feedCursor
		wantErr bool
	}{
		{in: "0.0", want: feedCursor{Requests: []uint64{0}}},
		{in: "12.7", want: feedCursor{[]uint64{12}, 7}},
		{in: " 3.4 ", want: feedCursor{[]uint64{3}, 4}},
		{in: "18446744073709551615.1", want: feedCursor{[]uint64{1<<64 - 1}, 1}},
		{in: "", wantErr: true},
		{in: "12", wantErr: true},
		{in: "a.1", wantErr: true},
		{in: "1.b", wantErr: true},
		{in: "-1.2", wantErr: true},
		{in: "1.2.3", wantErr: true},
		{in: ".", wantErr: true},
		// Three request partitions: three request sequences, then the workers'.
		{in: "1.2.3.4", parts: 3, want: feedCursor{[]uint64{1, 2, 3}, 4}},
		{in: "0.0.0.0", parts: 3, want: feedCursor{[]uint64{0, 0, 0}, 0}},
		{in: "1.2", parts: 3, wantErr: true},
		{in: "1.2.3", parts: 3, wantErr: true},
		{in: "1.2.3.4.5", parts: 3, wantErr: true},
	}
	for _, tc := range cases {
		t.Run(tc.in, func(t *testing.T) {
			got, err := parseCursor(tc.in, tc.parts)
			if (err != nil) != tc.wantErr {
				t.Fatalf("got err %v, want error %v", err, tc.wantErr)
			}
			if !tc.wantErr && !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
			if !tc.wantErr {
				if back, _ := parseCursor(got.String(), tc.parts); !reflect.DeepEqual(back, got) {
					t.Errorf("got %+v back from %q, want %+v", back, got.String(), got)
				}
			}
		})
	}
}

func TestFeedCursorAfter(t *testing.T) {
	c := feedCursor{Requests: []uint64{10, 2}, Workers: 3}
	cases := []struct {
		name string
		e    feedEntry
		want bool
	}{
		{"a later request event", feedEntry{Stream: "BATON_REQUESTS_0", Seq: 11}, true},
		{"the cursor's request event", feedEntry{Stream: "BATON_REQUESTS_0", Seq: 10}, false},
		{"a request event past the workers' cursor only", feedEntry{Stream: "BATON_REQUESTS_0", Seq: 5}, false},
		{"another partition counts by its own", feedEntry{Stream: "BATON_REQUESTS_1", Seq: 5, partition: 1}, true},
		{"another partition's cursor event", feedEntry{Stream: "BATON_REQUESTS_1", Seq: 2, partition: 1}, false},
		{"a later worker event", feedEntry{Stream: streams.WorkersStream, Seq: 4, partition: -1}, true},
		{"the cursor's worker event", feedEntry{Stream: streams.WorkersStream, Seq: 3, partition: -1}, false},
		{"a worker event below the requests' cursor still counts by its own", feedEntry{Stream: streams.WorkersStream, Seq: 9, partition: -1}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := c.after(tc.e); got != tc.want {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func envelope(seq uint64, subject string, ev events.Event) events.Envelope {
	return events.Envelope{ID: subject + "-" + ev.EventType(), Source: "test", Subject: subject,
		Time: time.Unix(int64(1000+seq), 0), Seq: seq, Event: ev}
}

// TestConsoleViewApply folds events as the console's consumers do: the
// recent requests from BATON_REQUESTS, the feed (incidents only) from both
// streams, each stream's sequence moving the cursor.
func TestConsoleViewApply(t *testing.T) {
	c := newConsoleView(&Frontend{requests: &requests{cfg: Config{ConsoleRequests: 2}.withDefaults()}})
	accepted := func(id, model string) events.RequestAccepted {
		return events.RequestAccepted{RequestID: id, Model: model, Endpoint: events.EndpointCompletions, Prompt: "p", MaxTokens: 5, Frontend: "fe"}
	}
	steps := []struct {
		stream      string
		e           events.Envelope
		wantChanged bool
	}{
		{streams.RequestsStream, envelope(1, "r1", accepted("r1", "m1")), true},
		{streams.RequestsStream, envelope(2, "r1", events.RequestRouted{RequestID: "r1", WorkerID: "w1"}), true},
		{streams.WorkersStream, envelope(1, "w1", events.WorkerRegistered{WorkerID: "w1", LeaseID: "l1", Model: "m1"}), true},
		{streams.RequestsStream, envelope(3, "r2", accepted("r2", "m2")), true},
		{streams.RequestsStream, envelope(4, "r2", events.RequestFailed{RequestID: "r2", Code: "no_workers", Message: "none", Status: 503}), true},
		{streams.RequestsStream, envelope(4, "r2", events.RequestFailed{RequestID: "r2", Code: "no_workers", Message: "again", Status: 503}), false}, // redelivered
		{streams.WorkersStream, envelope(2, "w1", events.WorkerLost{WorkerID: "w1", LeaseID: "l1", Reason: "lease expired"}), true},
	}
	for i, s := range steps {
		ch := c.changed.C()
		c.apply(s.stream, s.e)
		select {
		case <-ch:
			if !s.wantChanged {
				t.Errorf("step %d (%s): got a change notification, want none", i, s.e.Type())
			}
		default:
			if s.wantChanged {
				t.Errorf("step %d (%s): got no change notification, want one", i, s.e.Type())
			}
		}
	}

	feed := since(c, newCursor(1))
	var kinds []string
	for _, f := range feed {
		kinds = append(kinds, f.Kind+"@"+f.ID)
	}
	// In time order (each envelope's time is 1000 s + its sequence).
	if want := []string{"registered@0.1", "lost@0.2", "failed@4.2"}; !slices.Equal(kinds, want) {
		t.Errorf("got feed %v, want %v (accepted and routed are no incidents)", kinds, want)
	}
	if feed[2].RequestID != "r2" || feed[2].WorkerID != "" || feed[1].WorkerID != "w1" || feed[1].RequestID != "" {
		t.Errorf("got feed subjects %+v, %+v; want r2's request id, w1's worker id", feed[2], feed[1])
	}
	if got := since(c, feedCursor{Requests: []uint64{4}, Workers: 1}); len(got) != 1 || got[0].Kind != "lost" {
		t.Errorf("got %v after 4.1, want only lost", got)
	}

	cases := []struct {
		name          string
		model, status string
		limit         int
		want          []string
	}{
		{name: "all, newest first", want: []string{"r2", "r1"}},
		{name: "by model", model: "m1", want: []string{"r1"}},
		{name: "by status", status: "failed", want: []string{"r2"}},
		{name: "limited", limit: 1, want: []string{"r2"}},
		{name: "no match", model: "m3", want: nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, r := range c.requests(tc.model, tc.status, tc.limit) {
				got = append(got, r.ID)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// TestConsoleViewFeedBound: the feed keeps four entries per recent request,
// the newest.
func TestConsoleViewFeedBound(t *testing.T) {
	c := newConsoleView(&Frontend{requests: &requests{cfg: Config{ConsoleRequests: 1}.withDefaults()}})
	for i := range uint64(10) {
		c.apply(streams.WorkersStream, envelope(i+1, "w1", events.WorkerDraining{WorkerID: "w1", LeaseID: "l", Reason: "r"}))
	}
	feed := since(c, newCursor(1))
	var seqs []uint64
	for _, f := range feed {
		seqs = append(seqs, f.Seq)
	}
	if want := []uint64{7, 8, 9, 10}; !slices.Equal(seqs, want) {
		t.Errorf("got feed seqs %v, want %v", seqs, want)
	}
}

// TestConsoleViewPartitions: with a request log of three partitions, whose
// sequences overlap, the feed keeps each partition's events by its own
// sequence, and the cursor has one sequence per partition.
func TestConsoleViewPartitions(t *testing.T) {
	fe := &Frontend{requests: &requests{cfg: Config{ConsoleRequests: 4}.withDefaults()}, parts: 3}
	c := newConsoleView(fe)
	failed := func(id string) events.RequestFailed {
		return events.RequestFailed{RequestID: id, Code: "no_workers", Message: "none", Status: 503}
	}
	accepted := func(id string) events.RequestAccepted {
		return events.RequestAccepted{RequestID: id, Model: "m", Endpoint: events.EndpointCompletions, Prompt: "p", MaxTokens: 5, Frontend: "fe"}
	}
	c.apply("BATON_REQUESTS_0", envelope(1, "a", accepted("a")))
	c.apply("BATON_REQUESTS_2", envelope(1, "b", accepted("b")))
	c.apply("BATON_REQUESTS_2", envelope(2, "b", failed("b")))
	c.apply("BATON_REQUESTS_0", envelope(2, "a", failed("a")))
	c.apply("BATON_REQUESTS_0", envelope(2, "a", failed("a"))) // redelivered
	c.apply(streams.WorkersStream, envelope(1, "w1", events.WorkerLost{WorkerID: "w1", LeaseID: "l1", Reason: "lease expired"}))
	var ids []string
	for _, f := range since(c, newCursor(3)) {
		ids = append(ids, f.RequestID+f.WorkerID+"@"+f.ID)
	}
	// In time order: w1's loss at 1001 s, then b's and a's failures at
	// 1002 s, in the order they came.
	if want := []string{"w1@0.0.0.1", "b@0.0.2.1", "a@2.0.2.1"}; !slices.Equal(ids, want) {
		t.Errorf("got feed %v, want %v", ids, want)
	}
	cur, err := parseCursor("0.0.2.0", 3)
	if err != nil {
		t.Fatal(err)
	}
	if got := since(c, cur); len(got) != 2 || got[0].WorkerID != "w1" || got[1].RequestID != "a" {
		t.Errorf("after 0.0.2.0 got %+v, want w1's loss and a's failure", got)
	}
	if got := len(c.requests("", "", 0)); got != 2 {
		t.Errorf("%d requests in the view, want 2", got)
	}
}

// since is consoleView.since from a copy of cur.
func since(c *consoleView, cur feedCursor) []feedEntry {
	cur.Requests = slices.Clone(cur.Requests)
	return c.since(&cur)
}

// TestConsoleViewTimeOrder: the readers of the streams deliver their
// backlogs concurrently, one stream's after the other's; the feed is in
// time order all the same, each stream in its log's order (a writer whose
// clock is behind does not move its event before its stream's earlier
// ones), and a reader resuming after any id it was sent gets exactly the
// entries after it, on every partition.
func TestConsoleViewTimeOrder(t *testing.T) {
	fe := &Frontend{requests: &requests{cfg: Config{ConsoleRequests: 10}.withDefaults()}, parts: 2}
	c := newConsoleView(fe)
	at := func(e events.Envelope, s float64) events.Envelope {
		e.Time = time.Unix(1000, 0).Add(time.Duration(s * float64(time.Second)))
		return e
	}
	failed := func(id string) events.RequestFailed {
		return events.RequestFailed{RequestID: id, Code: "no_workers", Message: "none", Status: 503}
	}
	drained := func(id string) events.WorkerDraining {
		return events.WorkerDraining{WorkerID: id, LeaseID: "l", Reason: "r"}
	}
	// The request backlogs, then the workers'.
	c.apply("BATON_REQUESTS_0", at(envelope(1, "r1", failed("r1")), 2))
	c.apply("BATON_REQUESTS_1", at(envelope(1, "r2", failed("r2")), 4))
	c.apply("BATON_REQUESTS_0", at(envelope(2, "r3", failed("r3")), 6))
	c.apply(streams.WorkersStream, at(envelope(1, "w1", drained("w1")), 1))
	c.apply(streams.WorkersStream, at(envelope(2, "w2", drained("w2")), 3))
	c.apply(streams.WorkersStream, at(envelope(3, "w3", drained("w3")), 5))
	c.apply(streams.WorkersStream, at(envelope(4, "w4", drained("w4")), 7))
	c.apply(streams.WorkersStream, at(envelope(5, "w5", drained("w5")), 4.5)) // its clock is behind
	feed := since(c, newCursor(2))
	var got []string
	for _, f := range feed {
		got = append(got, f.RequestID+f.WorkerID+"@"+f.ID)
	}
	want := []string{"w1@0.0.1", "r1@1.0.1", "w2@1.0.2", "r2@1.1.2", "w3@1.1.3", "r3@2.1.3", "w4@2.1.4", "w5@2.1.5"}
	if !slices.Equal(got, want) {
		t.Errorf("got feed %v, want %v", got, want)
	}
	for i, f := range feed {
		cur, err := parseCursor(f.ID, 2)
		if err != nil {
			t.Fatal(err)
		}
		var rest []string
		for _, g := range since(c, cur) {
			rest = append(rest, g.RequestID+g.WorkerID+"@"+g.ID)
		}
		if !slices.Equal(rest, got[i+1:]) {
			t.Errorf("resumed after %s: got %v, want %v", f.ID, rest, got[i+1:])
		}
	}
}

// TestRecentlyLost: the console lists a lost worker for
// Config.ConsoleLostWorkers after its lease ended, unless it is live again.
func TestRecentlyLost(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	lost := func(id string, ago time.Duration) projections.Worker {
		return projections.Worker{ID: id, State: projections.WorkerLost, Departed: now.Add(-ago)}
	}
	all := []projections.Worker{lost("w1", time.Second), lost("w2", 5*time.Minute), lost("w3", 5*time.Minute+time.Millisecond), lost("w4", 0)}
	live := []projections.Worker{{ID: "w4", State: projections.WorkerReady}}
	var got []string
	for _, w := range recentlyLost(all, live, now.Add(-DefaultConsoleLostWorkers)) {
		got = append(got, w.ID)
	}
	if want := []string{"w1", "w2"}; !slices.Equal(got, want) {
		t.Errorf("got %v, want %v (w3 departed too long ago, w4 is back)", got, want)
	}
	if got := recentlyLost(nil, nil, now); got == nil {
		t.Error("got nil, want an empty list (JSON [])")
	}
}

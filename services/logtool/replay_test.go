package logtool

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/internal/histories"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/streams"
)

func TestBuildReplay(t *testing.T) {
	doc, ok := BuildReplay(histories.Envelopes(histories.Migrated()))
	if !ok {
		t.Fatal("got not found, want a replay")
	}
	if want := "t0 t1 t2 t3 t4 t5 t6 t7 t8 t9 "; doc.Output != want {
		t.Errorf("got output %q, want %q", doc.Output, want)
	}
	st := doc.Request
	if st.Status != "completed" || st.Owner != "fe-2" || st.TokensGenerated != 10 || len(st.Attempts) != 2 || len(st.Migrations) != 1 {
		t.Errorf("got state %+v", st)
	}
	tests := []struct {
		seq     uint64
		subject string
		applied bool
		note    string
	}{
		{1, "events", true, ""},
		{3, "tokens.0", true, ""},
		{5, "tokens.0", true, ""},
		{8, "tokens.0", false, "ignored (fenced)"},
		{9, "tokens.1", true, ""},
		{10, "tokens.1", false, "ignored (duplicate)"},
		{11, "events", true, ""},
		{14, "tokens.1", true, ""},
		{15, "tokens.0", false, "ignored (after the end)"},
	}
	for _, tt := range tests {
		e := doc.Timeline[tt.seq-1]
		if e.Seq != tt.seq || e.Subject != tt.subject || e.Applied != tt.applied || e.Note != tt.note {
			t.Errorf("seq %d: got subject %q applied %v note %q, want %q %v %q", tt.seq, e.Subject, e.Applied, e.Note, tt.subject, tt.applied, tt.note)
		}
	}
	if got := doc.Timeline[13].Since; got != 0.13 {
		t.Errorf("got %v s since accepted for seq 14, want 0.13", got)
	}
}

func TestBuildReplayNotFound(t *testing.T) {
	tests := []struct {
		name string
		envs []events.Envelope
	}{
		{"empty", nil},
		{"tokens without accepted (past retention)", histories.Envelopes(histories.Migrated()[2:4])},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, ok := BuildReplay(tt.envs); ok {
				t.Errorf("got ok, want not found")
			}
		})
	}
}

func TestReplayTimelineLines(t *testing.T) {
	doc, _ := BuildReplay(histories.Envelopes(histories.Migrated()))
	got := timelineLines(doc)
	want := []string{
		"+0.000s #1 events accepted model mock (completions), 2 prompt tokens, max_tokens 10, owner fe-1, streaming",
		"+0.010s #2 events routed attempt 0 → worker w1, from token 0",
		"+0.020s #3-4 tokens.0 tokens attempt 0: tokens 0-4 (5 tokens in 2 deltas)",
		"+0.040s #5 tokens.0 attempt_failed attempt 0 (worker w1) fenced by frontend fe-1 at token 5: worker_lost",
		"+0.050s #6 events migrated ongoing_request migration: attempt 0 (worker w1) cut at token 5 by frontend fe-1: worker_lost",
		"+0.060s #7 events routed attempt 1 → worker w2, from token 5",
		"+0.070s #8 tokens.0 tokens attempt 0: token 5 [ignored (fenced)]",
		"+0.080s #9 tokens.1 tokens attempt 1: tokens 5-6 (2)",
		"+0.090s #10 tokens.1 tokens attempt 1: tokens 5-6 (2) [ignored (duplicate)]",
		"+0.100s #11 events attached attached to frontend fe-2 (client at token 7)",
		"+0.110s #12-13 tokens.1 tokens attempt 1: tokens 7-9 (3 tokens in 2 deltas)",
		"+0.130s #14 tokens.1 completed attempt 1 completed: finish reason length, 10 completion tokens",
		"+0.140s #15 tokens.0 completed attempt 0 completed: finish reason length, 6 completion tokens [ignored (after the end)]",
	}
	sameLines(t, got, want)
}

func TestWriteReplay(t *testing.T) {
	doc, _ := BuildReplay(histories.Envelopes(histories.Migrated()))
	var b strings.Builder
	if err := WriteReplay(&b, doc); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"request r1: completed, finish reason length\n",
		"attempts    2: 0 on w1 from token 0, closed at token 5 (worker_lost); 1 on w2 from token 5\n",
		"migrations  1: ongoing_request from w1 at token 5 (worker_lost)\n",
		"owner       fe-2\n",
		"output (10 tokens):\nt0 t1 t2 t3 t4 t5 t6 t7 t8 t9 \n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("replay text lacks %q:\n%s", want, b.String())
		}
	}
}

func TestDescribe(t *testing.T) {
	tests := []struct {
		name   string
		source string
		ev     events.Event
		want   string
	}{
		{"worker report", "baton/worker/w1", events.AttemptFailed{Attempt: 2, WorkerID: "w1", Offset: 9, Reason: "engine_error"}, "attempt 2 failed, reported by worker w1 at token 9: engine_error"},
		{"cancel", "baton/frontend/fe", events.RequestCancelled{Mode: "stop", Reason: "client"}, "cancel (stop): client"},
		{"failed", "baton/frontend/fe", events.RequestFailed{Code: "migration_exhausted", Status: 500, Offset: 3, Message: "gave up"}, "failed: migration_exhausted (status 500) after 3 tokens: gave up"},
		{"child", "baton/frontend/fe", events.ChildAdded{RequestID: "p", ChildID: "p-1"}, "child request p-1"},
		{"empty delta", "baton/worker/w1", events.TokensGenerated{Attempt: 0, Offset: 4}, "attempt 0: no tokens at 4"},
		{"registered", "baton/worker/w1", events.WorkerRegistered{WorkerID: "w1", Model: "mock", PID: 7, Host: "h", LeaseTTLMS: 10000, KVBlocks: 16}, "worker w1 registered: model mock, pid 7 on h, lease ttl 10s, 16 KV blocks"},
		{"draining", "baton/worker/w1", events.WorkerDraining{WorkerID: "w1", Reason: "sigterm"}, "worker w1 draining: sigterm"},
		{"lost", "baton/frontend/fe", events.WorkerLost{WorkerID: "w1", Reason: "lease expired"}, "worker w1 lost: lease expired"},
		{"deregistered", "baton/worker/w1", events.WorkerDeregistered{WorkerID: "w1"}, "worker w1 deregistered"},
		{"accepted child, pinned, n", "baton/frontend/fe", events.RequestAccepted{Model: "m", Endpoint: "chat_completions", Frontend: "fe", ParentID: "p", PinnedWorker: "w1", Choices: 2, Resumable: true}, "model m (chat_completions), 0 prompt tokens, max_tokens 0, owner fe, resumable, parent p, pinned to w1, n=2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := describe(events.Envelope{Source: tt.source, Event: tt.ev}); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

// TestWriteReplayColumnsAlign: a subject longer than the default column
// ("tokens.0.up-w1", as baton up names its workers) widens the column for
// every line, so the type column starts at the same place on each
// (formerly the lines of a long subject were pushed out of line).
func TestWriteReplayColumnsAlign(t *testing.T) {
	lines := []timelineLine{
		{first: replayEntry{Seq: 1, Subject: "events", Type: events.TypeRequestAccepted, Summary: "accepted"}},
		{first: replayEntry{Seq: 2, Subject: "tokens.0.up-w1", Type: events.TypeRequestCompleted, Summary: "completed"}},
	}
	seqWidth, subjectWidth := columnWidths(lines)
	a, b := lines[0].format(seqWidth, subjectWidth), lines[1].format(seqWidth, subjectWidth)
	if i, j := strings.Index(a, "accepted"), strings.Index(b, "completed"); i != j {
		t.Errorf("the type columns start at %d and %d:\n%s\n%s", i, j, a, b)
	}
}

// TestBuildReplayResponse: the replay of a response of the Responses API
// shows the response object its client got (formerly a text_completion
// named cmpl-…), its function calls on the tool-calls line.
func TestBuildReplayResponse(t *testing.T) {
	const id = "alice:resp_1"
	call := json.RawMessage(`{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get","arguments":"{}"}}]}`)
	envs := histories.Envelopes([]histories.Stored{
		{Event: events.RequestAccepted{RequestID: id, Tenant: "alice", Model: "mock", Endpoint: events.EndpointResponses,
			Body: json.RawMessage(`{"model":"mock","input":"weather?"}`), MaxTokens: 8, Created: 100}},
		{Event: events.RequestRouted{RequestID: id, WorkerID: "w1"}},
		{Event: events.TokensGenerated{RequestID: id, Tokens: []string{"sunny ", ""}, Details: []json.RawMessage{nil, call}}},
		{Event: events.RequestCompleted{RequestID: id, FinishReason: "tool_calls"}},
	})
	doc, ok := BuildReplay(envs)
	if !ok {
		t.Fatal("got not found, want a replay")
	}
	r := doc.Response
	if r["object"] != "response" || r["id"] != "resp_1" || r["status"] != "completed" {
		t.Fatalf("got response %v, want the response object resp_1, completed", r)
	}
	if out, _ := r["output"].([]map[string]any); len(out) != 2 || out[0]["type"] != "message" || out[1]["type"] != "function_call" {
		t.Errorf("got output %v, want a message and a function call", r["output"])
	}
	var b strings.Builder
	if err := WriteReplay(&b, doc); err != nil {
		t.Fatal(err)
	}
	if want := "tool calls  get({})\n"; !strings.Contains(b.String(), want) {
		t.Errorf("replay text lacks %q:\n%s", want, b.String())
	}
}

// compacted is histories.Migrated's log once compacted: its lifecycle
// events, the carry for older readers on the last attempt's subject (under
// projections.CarryID), and the compact record.
func compacted(t *testing.T) []events.Envelope {
	t.Helper()
	const id = "r1"
	h := histories.Migrated()
	p := projections.NewRequest()
	for _, e := range histories.Envelopes(h) {
		p.Apply(e)
	}
	rec, err := p.Compact()
	if err != nil {
		t.Fatal(err)
	}
	attempt, worker, carry := p.Carry()
	var kept []histories.Stored
	for _, s := range h {
		if s.Subject == streams.RequestEvents(id) {
			kept = append(kept, s)
		}
	}
	first := len(kept)
	for _, ev := range carry {
		kept = append(kept, histories.Stored{Subject: streams.RequestTokens(id, attempt, worker), Source: "baton/frontend/fe-2", Event: ev})
	}
	kept = append(kept, histories.Stored{Subject: streams.RequestEvents(id), Source: "baton/frontend/fe-2", Event: rec})
	envs := histories.Envelopes(kept)
	for i := range carry {
		envs[first+i].ID = projections.CarryID(id, i)
	}
	return envs
}

// TestReplayTellsTheCarry: the replay of a compacted request labels the
// carry as what it is, and its record's line says what each attempt
// produced. Formerly the carry read "attempt 1: tokens 0-9 (10)" for an
// attempt that began at token 5, as if it had produced the whole answer.
func TestReplayTellsTheCarry(t *testing.T) {
	doc, ok := BuildReplay(compacted(t))
	if !ok {
		t.Fatal("got not found, want a replay")
	}
	if want := "t0 t1 t2 t3 t4 t5 t6 t7 t8 t9 "; doc.Output != want || doc.Request.Status != "completed" {
		t.Fatalf("got %s, output %q; want completed, %q", doc.Request.Status, doc.Output, want)
	}
	got := timelineLines(doc)
	want := []string{
		"+0.000s #1 events accepted model mock (completions), 2 prompt tokens, max_tokens 10, owner fe-1, streaming",
		"+0.010s #2 events routed attempt 0 → worker w1, from token 0",
		"+0.020s #3 events migrated ongoing_request migration: attempt 0 (worker w1) cut at token 5 by frontend fe-1: worker_lost",
		"+0.030s #4 events routed attempt 1 → worker w2, from token 5",
		"+0.040s #5 events attached attached to frontend fe-2 (client at token 7)",
		"+0.050s #6 tokens.1 tokens carry for older readers: tokens 0-9 (10)",
		"+0.060s #7 tokens.1 completed carry for older readers: completed, finish reason length, 10 completion tokens",
		"+0.070s #8 events compacted compacted: 10 tokens, the history through sequence 15 in one record: attempt 0: tokens 0-4 (5), attempt 1: tokens 5-9 (5)",
	}
	sameLines(t, got, want)
	for _, e := range doc.Timeline {
		if wantCarry := e.Seq == 6 || e.Seq == 7; e.Carry != wantCarry {
			t.Errorf("seq %d: got carry %v, want %v", e.Seq, e.Carry, wantCarry)
		}
	}
}

// sameLines fails t unless got and want hold the same lines.
func sameLines(t *testing.T, got, want []string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d lines, want %d:\n%s", len(got), len(want), strings.Join(got, "\n"))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("line %d:\n got %s\nwant %s", i, got[i], want[i])
		}
	}
}

// timelineLines is doc's coalesced timeline, a line an entry, its runs of
// spaces made one.
func timelineLines(doc Doc) []string {
	var got []string
	for _, l := range coalesce(doc.Timeline) {
		got = append(got, strings.Join(strings.Fields(l.String()), " "))
	}
	return got
}

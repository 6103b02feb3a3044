package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/internal/natstest"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go"
)

// storedEvent is an event of a test history and the subject it is stored on.
type storedEvent struct {
	subject string
	source  string
	ev      events.Event
}

// migratedHistory is the log of request "r1": attempt 0 on w1 fenced at
// token 5 and migrated to w2, a zombie w1 writing after the fence, a
// duplicate delta, a resume on frontend fe-2, and a late zombie completion.
func migratedHistory() []storedEvent {
	const id = "r1"
	fe1, fe2, w1, w2 := "baton/frontend/fe-1", "baton/frontend/fe-2", "baton/worker/w1", "baton/worker/w2"
	ev, tok := streams.RequestEvents(id), func(k int) string { return streams.RequestTokens(id, k, fmt.Sprintf("w%d", k+1)) }
	return []storedEvent{
		{ev, fe1, events.RequestAccepted{RequestID: id, Model: "mock", Endpoint: events.EndpointCompletions, Prompt: "a b", PromptTokens: 2, MaxTokens: 10, Frontend: "fe-1", Stream: true}},
		{ev, fe1, events.RequestRouted{RequestID: id, Attempt: 0, WorkerID: "w1"}},
		{tok(0), w1, events.TokensGenerated{RequestID: id, Attempt: 0, Offset: 0, Tokens: []string{"t0 ", "t1 ", "t2 "}}},
		{tok(0), w1, events.TokensGenerated{RequestID: id, Attempt: 0, Offset: 3, Tokens: []string{"t3 ", "t4 "}}},
		{tok(0), fe1, events.AttemptFailed{RequestID: id, Attempt: 0, WorkerID: "w1", Offset: 5, Reason: "worker_lost"}},
		{ev, fe1, events.RequestMigrated{RequestID: id, FromAttempt: 0, FromWorker: "w1", Cut: 5, MigrationType: events.MigrationOngoingRequest, Reason: "worker_lost", Frontend: "fe-1"}},
		{ev, fe1, events.RequestRouted{RequestID: id, Attempt: 1, WorkerID: "w2", StartOffset: 5}},
		{tok(0), w1, events.TokensGenerated{RequestID: id, Attempt: 0, Offset: 5, Tokens: []string{"zombie "}}},
		{tok(1), w2, events.TokensGenerated{RequestID: id, Attempt: 1, Offset: 5, Tokens: []string{"t5 ", "t6 "}}},
		{tok(1), w2, events.TokensGenerated{RequestID: id, Attempt: 1, Offset: 5, Tokens: []string{"t5 ", "t6 "}}},
		{ev, fe2, events.RequestAttached{RequestID: id, Frontend: "fe-2", Offset: 7}},
		{tok(1), w2, events.TokensGenerated{RequestID: id, Attempt: 1, Offset: 7, Tokens: []string{"t7 ", "t8 "}}},
		{tok(1), w2, events.TokensGenerated{RequestID: id, Attempt: 1, Offset: 9, Tokens: []string{"t9 "}}},
		{tok(1), w2, events.RequestCompleted{RequestID: id, Attempt: 1, FinishReason: "length", PromptTokens: 2, CompletionTokens: 10}},
		{tok(0), w1, events.RequestCompleted{RequestID: id, Attempt: 0, FinishReason: "length", CompletionTokens: 6}},
	}
}

// envelopes turns a history into stored envelopes: sequences from 1, 10 ms apart.
func envelopes(h []storedEvent) []events.Envelope {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	out := make([]events.Envelope, len(h))
	for i, s := range h {
		out[i] = events.Envelope{ID: events.ID("e", i), Source: s.source, Subject: "r1",
			Time: t0.Add(time.Duration(i) * 10 * time.Millisecond), Event: s.ev, Seq: uint64(i + 1)}
	}
	return out
}

func TestBuildReplay(t *testing.T) {
	doc, ok := buildReplay(envelopes(migratedHistory()))
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
		{"tokens without accepted (past retention)", envelopes(migratedHistory()[2:4])},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, ok := buildReplay(tt.envs); ok {
				t.Errorf("got ok, want not found")
			}
		})
	}
}

func TestReplayTimelineLines(t *testing.T) {
	doc, _ := buildReplay(envelopes(migratedHistory()))
	var got []string
	for _, l := range coalesce(doc.Timeline) {
		got = append(got, strings.Join(strings.Fields(l.String()), " "))
	}
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
	if len(got) != len(want) {
		t.Fatalf("got %d lines, want %d:\n%s", len(got), len(want), strings.Join(got, "\n"))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("line %d:\n got %s\nwant %s", i, got[i], want[i])
		}
	}
}

func TestWriteReplay(t *testing.T) {
	doc, _ := buildReplay(envelopes(migratedHistory()))
	var b strings.Builder
	if err := writeReplay(&b, doc); err != nil {
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

func TestReplayAndEventsBadFlagsExit2(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"replay without id", []string{"replay"}, "want one request id"},
		{"replay two ids", []string{"replay", "a", "b"}, "got 2 arguments"},
		{"replay bad id", []string{"replay", "a.b"}, "not a request id"},
		{"replay unknown flag", []string{"replay", "a", "--bogus"}, "--bogus"},
		{"replay bad nats", []string{"replay", "a", "--nats", "http://x"}, "--nats"},
		{"events bad request id", []string{"events", "--request", "a>"}, "--request"},
		{"events bad worker id", []string{"events", "--worker", "w.1"}, "--worker"},
		{"events negative since", []string{"events", "--since", "-1m"}, "--since"},
		{"events positional", []string{"events", "extra"}, "extra"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env, _, stderr := testEnv(nil)
			if code := run(tt.args, env); code != 2 {
				t.Fatalf("got exit code %d, want 2 (stderr %q)", code, stderr)
			}
			if msg := stderr.String(); !strings.Contains(msg, tt.want) || strings.Count(strings.TrimSpace(msg), "\n") != 0 {
				t.Errorf("got stderr %q, want one line containing %q", msg, tt.want)
			}
		})
	}
	for _, args := range [][]string{{"replay", "--help"}, {"events", "--help"}, {"help", "replay"}} {
		env, stdout, _ := testEnv(nil)
		if code := run(args, env); code != 0 || !strings.Contains(stdout.String(), "--json") {
			t.Errorf("%v: got exit code %d and help %q, want 0 and the flags", args, code, stdout)
		}
	}
}

// TestReplayAndEventsFromLog runs both commands in-process against a real
// embedded JetStream holding migratedHistory.
func TestReplayAndEventsFromLog(t *testing.T) {
	s := natstest.Start(t)
	js := s.Provision(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i, e := range migratedHistory() {
		l := streams.NewLog(js, e.source)
		if _, err := l.Append(ctx, e.subject, l.Envelope(events.ID("r1", i), "r1", e.ev), -1); err != nil {
			t.Fatal(err)
		}
	}
	wl := streams.NewLog(js, "baton/worker/w1")
	if _, err := wl.Append(ctx, streams.WorkerEvents("w1"), wl.Envelope("w1.reg", "w1", events.WorkerRegistered{WorkerID: "w1", Model: "mock"}), -1); err != nil {
		t.Fatal(err)
	}
	// A newer producer's event type this build does not know.
	h, data, _ := events.Marshal(events.Envelope{ID: "x1", Source: "baton/future", Time: time.Now(), Event: events.ChildAdded{RequestID: "r1", ChildID: "c"}})
	h[events.HeaderType] = []string{"baton.request.teleported.v9"}
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: streams.RequestEvents("r1"), Header: nats.Header(h), Data: data}); err != nil {
		t.Fatal(err)
	}

	env, stdout, stderr := testEnv(nil)
	if code := run([]string{"replay", "r1", "--nats", s.URL}, env); code != 0 {
		t.Fatalf("replay: exit %d: %s", code, stderr)
	}
	if !strings.Contains(stdout.String(), "[ignored (fenced)]") || !strings.Contains(stdout.String(), "t0 t1 t2 t3 t4 t5 t6 t7 t8 t9 \n") {
		t.Errorf("replay output:\n%s", stdout)
	}

	env, stdout, stderr = testEnv(nil)
	if code := run([]string{"replay", "--nats", s.URL, "r1", "--json"}, env); code != 0 {
		t.Fatalf("replay --json: exit %d: %s", code, stderr)
	}
	var doc struct {
		Request  struct{ Status, Owner string }
		Timeline []struct{ Type, Note string }
		Output   string
	}
	if err := json.Unmarshal(stdout.Bytes(), &doc); err != nil {
		t.Fatalf("replay --json: %v\n%s", err, stdout)
	}
	if doc.Request.Status != "completed" || doc.Request.Owner != "fe-2" || len(doc.Timeline) != 15 || doc.Output != "t0 t1 t2 t3 t4 t5 t6 t7 t8 t9 " {
		t.Errorf("replay --json: got %+v", doc)
	}

	env, _, stderr = testEnv(nil)
	if code := run([]string{"replay", "nope", "--nats", s.URL}, env); code != 1 ||
		!strings.Contains(stderr.String(), "request nope not found in the log (never accepted, or past retention)") {
		t.Errorf("unknown id: got exit %d, stderr %q", code, stderr)
	}

	tests := []struct {
		name  string
		args  []string
		lines int
		want  []string
	}{
		{"everything", nil, 17, []string{"workers  1", "worker w1 registered", "(unknown type baton.request.teleported.v9"}},
		{"one request", []string{"--request", "r1"}, 16, []string{"baton.request.migrated.v1", streams.RequestTokens("r1", 1, "w2")}},
		{"one worker", []string{"--worker", "w1"}, 1, []string{"baton.workers.w1.events"}},
		{"unknown request", []string{"--request", "nope"}, 0, nil},
		{"recent", []string{"--since", "1h", "--request", "r1"}, 16, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env, stdout, stderr := testEnv(nil)
			if code := run(append([]string{"events", "--nats", s.URL}, tt.args...), env); code != 0 {
				t.Fatalf("exit %d: %s", code, stderr)
			}
			out := stdout.String()
			if got := strings.Count(out, "\n"); got != tt.lines {
				t.Errorf("got %d lines, want %d:\n%s", got, tt.lines, out)
			}
			for _, w := range tt.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
		})
	}

	env, stdout, _ = testEnv(nil)
	if code := run([]string{"events", "--nats", s.URL, "--worker", "w1", "--json"}, env); code != 0 {
		t.Fatalf("events --json: exit %d", code)
	}
	var rec jsonRecord
	if err := json.Unmarshal(stdout.Bytes(), &rec); err != nil || rec.Type != events.TypeWorkerRegistered || rec.Seq != 1 {
		t.Errorf("events --json: got %+v (%v) from %s", rec, err, stdout)
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

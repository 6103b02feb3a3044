package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/internal/histories"
	"github.com/baton-dev/baton/internal/natstest"
	"github.com/baton-dev/baton/services/logtool"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go"
)

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
	for i, e := range histories.Migrated() {
		l := streams.NewLog(js, e.Source)
		natstest.Append(ctx, t, l, e.Subject, events.ID("r1", i), "r1", e.Event)
	}
	wl := streams.NewLog(js, "baton/worker/w1")
	natstest.Append(ctx, t, wl, streams.WorkerEvents("w1"), "w1.reg", "w1", events.WorkerRegistered{WorkerID: "w1", Model: "mock"})
	// Another request's end in the ends place (a frontend stores one there
	// when the log cannot take it): `baton events` shows it.
	fl := streams.NewLog(js, "baton/frontend/fe-2")
	if ok, err := streams.StoreEnd(ctx, fl, "r2.ended", events.RequestEnded{RequestID: "r2", Frontend: "fe-2", Through: 1,
		Failed: &events.RequestFailed{RequestID: "r2", Code: "log_full", Message: "request log full"}}, 0); !ok || err != nil {
		t.Fatalf("store the end: %v %v", ok, err)
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
	if !strings.Contains(stdout.String(), "[ignored (fenced)]") || !strings.Contains(stdout.String(), "t0 t1 t2 t3 t4 t5 t6 t7 t8 t9 \n") ||
		!strings.Contains(stdout.String(), "[skipped (unknown event type (written by a newer build?))]") {
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
	// The unknown type is in the timeline, skipped with its reason
	// (docs/compatibility.md).
	if doc.Request.Status != "completed" || doc.Request.Owner != "fe-2" || len(doc.Timeline) != 16 || doc.Output != "t0 t1 t2 t3 t4 t5 t6 t7 t8 t9 " {
		t.Errorf("replay --json: got %+v", doc)
	} else if last := doc.Timeline[15]; last.Type != "baton.request.teleported.v9" || last.Note != "skipped (unknown event type (written by a newer build?))" {
		t.Errorf("replay --json: the unknown event is %+v, want it skipped with its reason", last)
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
		{"everything", nil, 18, []string{"workers  1", "worker w1 registered", "(unknown type baton.request.teleported.v9", "ends     1", streams.RequestEnd("r2")}},
		{"one request", []string{"--request", "r1"}, 16, []string{"baton.request.migrated.v1", streams.RequestTokens("r1", 1, "w2")}},
		{"its end in the ends place", []string{"--request", "r2"}, 1, []string{"ends     1", streams.RequestEnd("r2"), "log_full"}},
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

	// A log provisioned by a release before the ends place has none: the
	// other streams are read all the same.
	if err := js.DeleteStream(ctx, streams.EndsStream); err != nil {
		t.Fatal(err)
	}
	env, stdout, stderr = testEnv(nil)
	if code := run([]string{"events", "--nats", s.URL}, env); code != 0 || strings.Count(stdout.String(), "\n") != 17 {
		t.Errorf("events without BATON_ENDS: exit %d, %d lines, stderr %s:\n%s", code, strings.Count(stdout.String(), "\n"), stderr, stdout)
	}

	env, stdout, _ = testEnv(nil)
	if code := run([]string{"events", "--nats", s.URL, "--worker", "w1", "--json"}, env); code != 0 {
		t.Fatalf("events --json: exit %d", code)
	}
	var rec logtool.JSONRecord
	if err := json.Unmarshal(stdout.Bytes(), &rec); err != nil || rec.Type != events.TypeWorkerRegistered || rec.Seq != 1 {
		t.Errorf("events --json: got %+v (%v) from %s", rec, err, stdout)
	}
}

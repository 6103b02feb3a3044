package migrations_test

import (
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/migrations"
	"github.com/baton-dev/baton/projections"
)

const (
	stall  = 30 * time.Second
	detach = 2 * time.Minute
)

func policy(limit, maxSeqLen int) migrations.Policy {
	return migrations.Policy{Limit: limit, MaxSeqLen: maxSeqLen, Frontend: "fe", StallTimeout: stall, DetachTimeout: detach}
}

// req builds a request's projection event by event, the way a follower does.
type req struct{ *projections.Request }

func newReq(pinned string) req {
	r := req{projections.NewRequest()}
	r.apply(events.RequestAccepted{RequestID: "r", Model: "m", Prompt: "p", PromptTokens: 2, MaxTokens: 100, Frontend: "fe", PinnedWorker: pinned})
	return r
}

func (r req) apply(ev events.Event) req {
	r.Apply(events.Envelope{Event: ev})
	return r
}

func (r req) routed(attempt int, worker string) req {
	return r.apply(events.RequestRouted{RequestID: "r", Attempt: attempt, WorkerID: worker, StartOffset: r.Len()})
}

func (r req) tokens(attempt, n int) req {
	toks := make([]string, n)
	for i := range toks {
		toks[i] = "t "
	}
	return r.apply(events.TokensGenerated{RequestID: "r", Attempt: attempt, Offset: r.Len(), Tokens: toks})
}

func (r req) closed(ev events.AttemptFailed) req {
	ev.RequestID = "r"
	return r.apply(ev)
}

func (r req) migrated(from int, worker, typ, frontend string) req {
	return r.apply(events.RequestMigrated{RequestID: "r", FromAttempt: from, FromWorker: worker, Cut: r.Len(), MigrationType: typ, Frontend: frontend})
}

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func watching(attempt int, worker string, since time.Time) migrations.Memory {
	return migrations.Memory{Watch: migrations.Watch{Active: true, Attempt: attempt, WorkerID: worker, LeaseID: "L-" + worker, Since: since}}
}

func present(worker string) migrations.WorkerSeen {
	return migrations.WorkerSeen{Present: true, LeaseID: "L-" + worker}
}

// queued is a present worker that keeps a first-token deadline of d.
func queued(worker string, d time.Duration) migrations.WorkerSeen {
	w := present(worker)
	w.FirstTokenTimeout = d
	return w
}

func failed(attempt int, worker, typ, reason string) *migrations.Failure {
	return &migrations.Failure{Attempt: attempt, WorkerID: worker, MigrationType: typ, Reason: reason, At: t0}
}

// want is what a case checks of an action; zero fields are not checked
// unless named in the case.
type want struct {
	kind        migrations.ActionKind
	until       time.Duration // Wait: Until - now
	code        string        // Fail
	status      int           // Fail
	reason      string        // Fence
	migType     string        // Fence: the failure's type; Migrate: the event's
	inhibit     bool          // Fence
	inhibitFor  time.Duration // Fence
	appendFence bool          // Fence
	exclude     []string      // DispatchNext
	attempt     int           // DispatchNext, Fence, Migrate
	counted     string        // Report.Migrated's type ("" none)
	migFailed   bool          // Report.MigrationFailed set
	rejected    bool
	exceeded    bool
}

func check(t *testing.T, a migrations.Action, now time.Time, w want) {
	t.Helper()
	if a.Kind != w.kind {
		t.Fatalf("kind = %v, want %v (action %+v)", a.Kind, w.kind, a)
	}
	switch a.Kind {
	case migrations.Wait:
		if got := a.Until.Sub(now); got != w.until {
			t.Errorf("wait %v, want %v", got, w.until)
		}
	case migrations.Fail:
		if a.Failed.Code != w.code || a.Failed.Status != w.status {
			t.Errorf("fail %s %d (%s), want %s %d", a.Failed.Code, a.Failed.Status, a.Failed.Message, w.code, w.status)
		}
	case migrations.Fence:
		if a.Fence.Reason != w.reason || a.Inhibit != w.inhibit || a.InhibitFor != w.inhibitFor || a.AppendFence != w.appendFence || a.Fence.Attempt != w.attempt {
			t.Errorf("fence %+v inhibit %v for %v append %v, want reason %s attempt %d inhibit %v for %v append %v",
				a.Fence, a.Inhibit, a.InhibitFor, a.AppendFence, w.reason, w.attempt, w.inhibit, w.inhibitFor, w.appendFence)
		}
		if f := a.Next.Failure; f == nil || f.MigrationType != w.migType || f.Reason != w.reason {
			t.Errorf("remembered failure %+v, want %s %s", f, w.migType, w.reason)
		}
	case migrations.Migrate:
		if m := a.Migrated; m.MigrationType != w.migType || m.FromAttempt != w.attempt || m.Frontend != "fe" {
			t.Errorf("migrated %+v, want type %s from attempt %d by fe", m, w.migType, w.attempt)
		}
	case migrations.DispatchNext:
		if a.Dispatch.Attempt != w.attempt || len(a.Exclude) != len(w.exclude) {
			t.Errorf("dispatch attempt %d excluding %v, want %d excluding %v", a.Dispatch.Attempt, a.Exclude, w.attempt, w.exclude)
		}
		for i := range w.exclude {
			if i < len(a.Exclude) && a.Exclude[i] != w.exclude[i] {
				t.Errorf("exclude %v, want %v", a.Exclude, w.exclude)
			}
		}
	}
	got := ""
	if a.Report.Migrated != nil {
		got = a.Report.Migrated.MigrationType
	}
	if got != w.counted {
		t.Errorf("counted migration %q, want %q", got, w.counted)
	}
	if (a.Report.MigrationFailed != nil) != w.migFailed || a.Report.Rejected != w.rejected || a.Report.MaxSeqLenExceeded != w.exceeded {
		t.Errorf("report %+v, want migration failed %v, rejected %v, exceeded %v", a.Report, w.migFailed, w.rejected, w.exceeded)
	}
}

func TestStep(t *testing.T) {
	ongoing, newReq_ := events.MigrationOngoingRequest, events.MigrationNewRequest
	for _, tc := range []struct {
		name   string
		policy migrations.Policy
		req    req
		mem    migrations.Memory
		obs    migrations.Observation
		want   want
	}{
		{name: "accepted: dispatch the first attempt", policy: policy(3, 0), req: newReq(""),
			want: want{kind: migrations.DispatchNext, attempt: 0}},
		{name: "owned by another frontend: stop", policy: policy(3, 0),
			req:  newReq("").apply(events.RequestAttached{RequestID: "r", Frontend: "other"}),
			want: want{kind: migrations.Stop}},
		{name: "ended: stop", policy: policy(3, 0),
			req:  newReq("").apply(events.RequestFailed{RequestID: "r", Code: "x"}),
			want: want{kind: migrations.Stop}},
		{name: "parent of choices: stop", policy: policy(3, 0),
			req:  req{projections.NewRequest()}.apply(events.RequestAccepted{RequestID: "r", Model: "m", Frontend: "fe", Choices: 2}),
			want: want{kind: migrations.Stop}},
		{name: "dispatch accepted: watch for the stall timeout", policy: policy(3, 0), req: newReq("").routed(0, "w1"),
			obs:  migrations.Observation{Worker: present("w1"), Dispatch: &migrations.DispatchOutcome{Attempt: 0, WorkerID: "w1", LeaseID: "L-w1"}},
			want: want{kind: migrations.Wait, until: stall}},
		{name: "stall: nothing for the stall timeout", policy: policy(3, 0), req: newReq("").routed(0, "w1").tokens(0, 3),
			mem: watching(0, "w1", t0.Add(-time.Minute)), obs: migrations.Observation{Worker: present("w1"), LastProgress: t0.Add(-stall)},
			want: want{kind: migrations.Fence, reason: "stalled", migType: ongoing, inhibit: true, appendFence: true}},
		// Issue 22, failure 3: time in an engine's queue is not a stall.
		{name: "queued: no first token yet, the worker keeps a first-token deadline: wait for it", policy: policy(3, 0), req: newReq("").routed(0, "w1"),
			mem: watching(0, "w1", t0.Add(-time.Minute)), obs: migrations.Observation{Worker: queued("w1", 2*time.Minute)},
			want: want{kind: migrations.Wait, until: 2*time.Minute + stall - time.Minute}},
		{name: "queued past the worker's deadline and the stall timeout: stalled", policy: policy(3, 0), req: newReq("").routed(0, "w1"),
			mem: watching(0, "w1", t0.Add(-2*time.Minute-stall)), obs: migrations.Observation{Worker: queued("w1", 2*time.Minute)},
			want: want{kind: migrations.Fence, reason: "stalled", migType: ongoing, inhibit: true, appendFence: true}},
		{name: "after the first token the stall timeout applies, deadline or not", policy: policy(3, 0), req: newReq("").routed(0, "w1").tokens(0, 1),
			mem: watching(0, "w1", t0.Add(-time.Minute)), obs: migrations.Observation{Worker: queued("w1", 2*time.Minute), LastProgress: t0.Add(-stall)},
			want: want{kind: migrations.Fence, reason: "stalled", migType: ongoing, inhibit: true, appendFence: true}},
		{name: "a continuation's first token is its own: the deadline applies again", policy: policy(3, 0),
			req: newReq("").routed(0, "w1").tokens(0, 3).closed(events.AttemptFailed{Attempt: 0, WorkerID: "w1", Reason: "worker_lost"}).
				migrated(0, "w1", ongoing, "fe").routed(1, "w2"),
			mem: watching(1, "w2", t0.Add(-time.Minute)), obs: migrations.Observation{Worker: queued("w2", 2*time.Minute), LastProgress: t0.Add(-time.Hour)},
			want: want{kind: migrations.Wait, until: 2*time.Minute + stall - time.Minute}},
		{name: "no first token from a worker without a deadline (the mock): the stall timeout", policy: policy(3, 0), req: newReq("").routed(0, "w1"),
			mem: watching(0, "w1", t0.Add(-stall)), obs: migrations.Observation{Worker: present("w1")},
			want: want{kind: migrations.Fence, reason: "stalled", migType: ongoing, inhibit: true, appendFence: true}},
		{name: "stall clock starts when watching starts", policy: policy(3, 0), req: newReq("").routed(0, "w1").tokens(0, 3),
			mem: watching(0, "w1", t0.Add(-time.Second)), obs: migrations.Observation{Worker: present("w1"), LastProgress: t0.Add(-time.Hour)},
			want: want{kind: migrations.Wait, until: stall - time.Second}},
		{name: "lease lost: read the log once first", policy: policy(3, 0), req: newReq("").routed(0, "w1"),
			mem: watching(0, "w1", t0), want: want{kind: migrations.CatchUp}},
		{name: "lease lost after the catch-up: worker_lost", policy: policy(3, 0), req: newReq("").routed(0, "w1"),
			mem:  func() migrations.Memory { m := watching(0, "w1", t0); m.Watch.CaughtUp = true; return m }(),
			want: want{kind: migrations.Fence, reason: "worker_lost", migType: ongoing, inhibit: true, appendFence: true}},
		{name: "advisory revoked the lease and the worker re-registered: worker_lost", policy: policy(3, 0), req: newReq("").routed(0, "w1"),
			mem:  func() migrations.Memory { m := watching(0, "w1", t0); m.Watch.CaughtUp = true; return m }(),
			obs:  migrations.Observation{Worker: migrations.WorkerSeen{Present: true, LeaseID: "L-new"}},
			want: want{kind: migrations.Fence, reason: "worker_lost", migType: ongoing, inhibit: true, appendFence: true}},
		{name: "taken over with the worker gone: read the log, then worker_lost", policy: policy(3, 0), req: newReq("").routed(0, "w1"),
			want: want{kind: migrations.CatchUp}},
		// A frontend that cannot read the log (its catch-ups fail) decides
		// nothing: every decision would be refused for a stale sequence,
		// and a refused dispatch used to be tried again for ever.
		{name: "log unread: read again rather than dispatch", policy: policy(3, 0), req: newReq(""),
			obs: migrations.Observation{Unread: t0.Add(-time.Second)}, want: want{kind: migrations.CatchUp}},
		{name: "log unread: read again rather than watch", policy: policy(3, 0), req: newReq("").routed(0, "w1").tokens(0, 3),
			mem: watching(0, "w1", t0.Add(-time.Minute)), obs: migrations.Observation{Worker: present("w1"), LastProgress: t0.Add(-stall), Unread: t0.Add(-time.Second)},
			want: want{kind: migrations.CatchUp}},
		{name: "dispatch superseded while the log is unread: read again, no new dispatch", policy: policy(3, 0), req: newReq(""),
			obs:  migrations.Observation{Unread: t0.Add(-time.Second), Dispatch: &migrations.DispatchOutcome{Result: migrations.DispatchSuperseded}},
			want: want{kind: migrations.CatchUp}},
		{name: "log unread for the stall timeout: fail 503 log_unreadable", policy: policy(3, 0), req: newReq("").routed(0, "w1").tokens(0, 3),
			mem: watching(0, "w1", t0), obs: migrations.Observation{Worker: present("w1"), Unread: t0.Add(-stall)},
			want: want{kind: migrations.Fail, code: migrations.CodeLogUnreadable, status: http.StatusServiceUnavailable}},
		{name: "engine error reported by the worker", policy: policy(3, 0),
			req: newReq("").routed(0, "w1").tokens(0, 2).closed(events.AttemptFailed{Attempt: 0, WorkerID: "w1", Reason: "engine_error"}),
			mem: watching(0, "w1", t0), obs: migrations.Observation{Worker: present("w1")},
			want: want{kind: migrations.Fence, reason: "engine_error", migType: ongoing, inhibit: true}},
		{name: "shutdown hand-off: migrate without inhibiting", policy: policy(3, 0),
			req: newReq("").routed(0, "w1").tokens(0, 2).closed(events.AttemptFailed{Attempt: 0, WorkerID: "w1", Reason: "shutdown"}),
			mem: watching(0, "w1", t0), obs: migrations.Observation{Worker: present("w1")},
			want: want{kind: migrations.Fence, reason: "shutdown", migType: ongoing}},
		{name: "upstream rejected the request: fail with its status, no migration", policy: policy(3, 0),
			req: newReq("").routed(0, "w1").closed(events.AttemptFailed{Attempt: 0, WorkerID: "w1", Reason: "engine_error",
				Class: events.FailureClient, Status: 422, Code: "context_length_exceeded", Message: "too long"}),
			mem: watching(0, "w1", t0), obs: migrations.Observation{Worker: present("w1")},
			want: want{kind: migrations.Fail, code: "context_length_exceeded", status: 422}},
		// The log refused the attempt's tokens, and has room again by now
		// (LogFull false): the request's failure, not the worker's.
		{name: "the log refused the attempt's tokens: fail with log_full, no migration, no inhibition", policy: policy(3, 0),
			req: newReq("").routed(0, "w1").tokens(0, 2).closed(events.AttemptFailed{Attempt: 0, WorkerID: "w1", Reason: events.FailureLogFull,
				Class: events.FailureLogFull}),
			mem: watching(0, "w1", t0), obs: migrations.Observation{Worker: present("w1"), LastProgress: t0},
			want: want{kind: migrations.Fail, code: migrations.CodeLogFull, status: http.StatusServiceUnavailable}},
		{name: "upstream overloaded: new_request, inhibited for its Retry-After", policy: policy(3, 0),
			req: newReq("").routed(0, "w1").closed(events.AttemptFailed{Attempt: 0, WorkerID: "w1", Reason: "engine_error",
				Class: events.FailureUnavailable, Status: 429, RetryAfterMS: 7000}),
			mem: watching(0, "w1", t0), obs: migrations.Observation{Worker: present("w1")},
			want: want{kind: migrations.Fence, reason: "engine_error", migType: newReq_, inhibit: true, inhibitFor: 7 * time.Second}},
		{name: "upstream not ready: new_request", policy: policy(3, 0),
			req: newReq("").routed(0, "w1").closed(events.AttemptFailed{Attempt: 0, WorkerID: "w1", Reason: "engine_error",
				Class: events.FailureNotReady, Status: 404}),
			mem: watching(0, "w1", t0), obs: migrations.Observation{Worker: present("w1")},
			want: want{kind: migrations.Fence, reason: "engine_error", migType: newReq_, inhibit: true}},
		// Issue 22, failure 2: a request the upstream answers with 500 before
		// any token must not take the pool out.
		{name: "upstream 500 before any token: migrate without inhibiting", policy: policy(3, 0),
			req: newReq("").routed(0, "w1").closed(events.AttemptFailed{Attempt: 0, WorkerID: "w1", Reason: "engine_error",
				Status: 500, Message: "invalid JSON schema"}),
			mem: watching(0, "w1", t0), obs: migrations.Observation{Worker: present("w1")},
			want: want{kind: migrations.Fence, reason: "engine_error", migType: ongoing}},
		{name: "upstream 500 after tokens: the worker's fault, inhibit", policy: policy(3, 0),
			req: newReq("").routed(0, "w1").tokens(0, 2).closed(events.AttemptFailed{Attempt: 0, WorkerID: "w1", Reason: "engine_error",
				Status: 500, Message: "runner died"}),
			mem: watching(0, "w1", t0), obs: migrations.Observation{Worker: present("w1")},
			want: want{kind: migrations.Fence, reason: "engine_error", migType: ongoing, inhibit: true}},
		{name: "no answer from the upstream before any token: inhibit", policy: policy(3, 0),
			req: newReq("").routed(0, "w1").closed(events.AttemptFailed{Attempt: 0, WorkerID: "w1", Reason: "engine_error",
				Message: "connection refused"}),
			mem: watching(0, "w1", t0), obs: migrations.Observation{Worker: present("w1")},
			want: want{kind: migrations.Fence, reason: "engine_error", migType: ongoing, inhibit: true}},
		{name: "the same 500 from a second worker: the request's fault, fail with the upstream's answer", policy: policy(3, 0),
			req: newReq("").routed(0, "w1").closed(events.AttemptFailed{Attempt: 0, WorkerID: "w1", Reason: "engine_error", Status: 500, Message: "invalid JSON schema"}).
				migrated(0, "w1", ongoing, "fe").routed(1, "w2").
				closed(events.AttemptFailed{Attempt: 1, WorkerID: "w2", Reason: "engine_error", Status: 500, Message: "invalid JSON schema"}),
			mem: watching(1, "w2", t0), obs: migrations.Observation{Worker: present("w2")},
			want: want{kind: migrations.Fail, code: migrations.CodeUpstreamError, status: 500}},
		{name: "the same empty answer from a second worker: the request's fault, 502", policy: policy(3, 0),
			req: newReq("").routed(0, "w1").closed(events.AttemptFailed{Attempt: 0, WorkerID: "w1", Reason: "engine_error", Code: events.CodeEmptyAnswer, Message: "ended"}).
				migrated(0, "w1", ongoing, "fe").routed(1, "w2").
				closed(events.AttemptFailed{Attempt: 1, WorkerID: "w2", Reason: "engine_error", Code: events.CodeEmptyAnswer, Message: "ended"}),
			mem: watching(1, "w2", t0), obs: migrations.Observation{Worker: present("w2")},
			want: want{kind: migrations.Fail, code: events.CodeEmptyAnswer, status: http.StatusBadGateway}},
		{name: "an empty answer before any token: migrate without inhibiting", policy: policy(3, 0),
			req: newReq("").routed(0, "w1").closed(events.AttemptFailed{Attempt: 0, WorkerID: "w1", Reason: "engine_error", Code: events.CodeEmptyAnswer, Message: "ended"}),
			mem: watching(0, "w1", t0), obs: migrations.Observation{Worker: present("w1")},
			want: want{kind: migrations.Fence, reason: "engine_error", migType: ongoing}},
		{name: "another 500 from a second worker: migrate again", policy: policy(3, 0),
			req: newReq("").routed(0, "w1").closed(events.AttemptFailed{Attempt: 0, WorkerID: "w1", Reason: "engine_error", Status: 500, Message: "out of memory"}).
				migrated(0, "w1", ongoing, "fe").routed(1, "w2").
				closed(events.AttemptFailed{Attempt: 1, WorkerID: "w2", Reason: "engine_error", Status: 502, Message: "bad gateway"}),
			mem: watching(1, "w2", t0), obs: migrations.Observation{Worker: present("w2")},
			want: want{kind: migrations.Fence, reason: "engine_error", migType: ongoing, attempt: 1}},
		{name: "limit 0, upstream 500 before any token: the upstream's answer", policy: policy(0, 0),
			req:  newReq("").routed(0, "w1").closed(events.AttemptFailed{Attempt: 0, WorkerID: "w1", Reason: "engine_error", Status: 500, Code: "schema", Message: "invalid JSON schema"}),
			mem:  migrations.Memory{Failure: failed(0, "w1", ongoing, "engine_error"), LastFailed: "w1"},
			want: want{kind: migrations.Fail, code: "schema", status: 500, migFailed: true}},
		{name: "no other worker after an upstream 500: the upstream's answer", policy: policy(3, 0),
			req: newReq("").routed(0, "w1").closed(events.AttemptFailed{Attempt: 0, WorkerID: "w1", Reason: "engine_error", Status: 500, Message: "invalid JSON schema"}).
				migrated(0, "w1", ongoing, "fe"),
			mem:  migrations.Memory{Migration: failed(0, "w1", ongoing, "engine_error"), LastFailed: "w1"},
			obs:  migrations.Observation{Dispatch: &migrations.DispatchOutcome{Result: migrations.DispatchUnroutable, Err: "no worker"}},
			want: want{kind: migrations.Fail, code: migrations.CodeUpstreamError, status: 500, migFailed: true}},
		{name: "failed, migration allowed: record the migration", policy: policy(3, 0),
			req:  newReq("").routed(0, "w1").tokens(0, 5).closed(events.AttemptFailed{Attempt: 0, WorkerID: "w1", Reason: "stalled"}),
			mem:  migrations.Memory{Failure: failed(0, "w1", ongoing, "stalled"), LastFailed: "w1"},
			want: want{kind: migrations.Migrate, migType: ongoing, attempt: 0}},
		{name: "limit 0, no token produced: 503, a retry is safe", policy: policy(0, 0),
			req:  newReq("").routed(0, "w1").closed(events.AttemptFailed{Attempt: 0, WorkerID: "w1", Reason: "engine_error"}),
			mem:  migrations.Memory{Failure: failed(0, "w1", ongoing, "engine_error"), LastFailed: "w1"},
			want: want{kind: migrations.Fail, code: "migration_disabled", status: http.StatusServiceUnavailable, migFailed: true}},
		{name: "limit 0, tokens produced: 500, the answer is truncated", policy: policy(0, 0),
			req:  newReq("").routed(0, "w1").tokens(0, 1).closed(events.AttemptFailed{Attempt: 0, WorkerID: "w1", Reason: "engine_error"}),
			mem:  migrations.Memory{Failure: failed(0, "w1", ongoing, "engine_error"), LastFailed: "w1"},
			want: want{kind: migrations.Fail, code: "migration_disabled", status: http.StatusInternalServerError, migFailed: true}},
		{name: "limit exhausted", policy: policy(1, 0),
			req: newReq("").routed(0, "w1").tokens(0, 2).migrated(0, "w1", ongoing, "fe").routed(1, "w2").tokens(1, 2).
				closed(events.AttemptFailed{Attempt: 1, WorkerID: "w2", Reason: "worker_lost"}),
			mem:  migrations.Memory{Failure: failed(1, "w2", ongoing, "worker_lost"), LastFailed: "w2"},
			want: want{kind: migrations.Fail, code: "migration_exhausted", status: http.StatusInternalServerError, migFailed: true}},
		{name: "max-seq-len exceeded: no migration, counted once", policy: policy(3, 4),
			req:  newReq("").routed(0, "w1").tokens(0, 3).closed(events.AttemptFailed{Attempt: 0, WorkerID: "w1", Reason: "stalled"}),
			mem:  migrations.Memory{Failure: failed(0, "w1", ongoing, "stalled")},
			want: want{kind: migrations.Fail, code: "migration_max_seq_len_exceeded", status: http.StatusInternalServerError, migFailed: true, exceeded: true}},
		{name: "max-seq-len already counted", policy: policy(3, 4), req: newReq("").routed(0, "w1").tokens(0, 3),
			mem: func() migrations.Memory { m := watching(0, "w1", t0); m.Exceeded = true; return m }(), obs: migrations.Observation{Worker: present("w1"), LastProgress: t0},
			want: want{kind: migrations.Wait, until: stall}},
		{name: "pinned: never migrated", policy: policy(3, 0),
			req:  newReq("w1").routed(0, "w1").tokens(0, 2).closed(events.AttemptFailed{Attempt: 0, WorkerID: "w1", Reason: "worker_lost"}),
			mem:  migrations.Memory{Failure: failed(0, "w1", ongoing, "worker_lost")},
			want: want{kind: migrations.Fail, code: "pinned_worker_failed", status: http.StatusInternalServerError, migFailed: true}},
		{name: "migration recorded: dispatch the continuation elsewhere, not counted yet", policy: policy(3, 0),
			req:  newReq("").routed(0, "w1").tokens(0, 2).migrated(0, "w1", ongoing, "fe"),
			mem:  migrations.Memory{Failure: failed(0, "w1", ongoing, "worker_lost"), LastFailed: "w1"},
			want: want{kind: migrations.DispatchNext, attempt: 1, exclude: []string{"w1"}}},
		{name: "continuation accepted: one re-dispatch counted", policy: policy(3, 0),
			req:  newReq("").routed(0, "w1").tokens(0, 2).migrated(0, "w1", ongoing, "fe").routed(1, "w2"),
			mem:  migrations.Memory{Migration: failed(0, "w1", ongoing, "worker_lost"), LastFailed: "w1"},
			obs:  migrations.Observation{Worker: present("w2"), Dispatch: &migrations.DispatchOutcome{Attempt: 1, WorkerID: "w2", LeaseID: "L-w2"}},
			want: want{kind: migrations.Wait, until: stall, counted: ongoing}},
		{name: "continuation accepted and already completed: still counted", policy: policy(3, 0),
			req: newReq("").routed(0, "w1").tokens(0, 2).migrated(0, "w1", ongoing, "fe").routed(1, "w2").tokens(1, 2).
				apply(events.RequestCompleted{RequestID: "r", Attempt: 1, FinishReason: "length"}),
			mem:  migrations.Memory{Migration: failed(0, "w1", ongoing, "worker_lost"), LastFailed: "w1"},
			obs:  migrations.Observation{Dispatch: &migrations.DispatchOutcome{Attempt: 1, WorkerID: "w2", LeaseID: "L-w2"}},
			want: want{kind: migrations.Stop, counted: ongoing}},
		{name: "continuation finds no worker: fail, nothing counted", policy: policy(3, 0),
			req:  newReq("").routed(0, "w1").tokens(0, 2).migrated(0, "w1", ongoing, "fe"),
			mem:  migrations.Memory{Migration: failed(0, "w1", ongoing, "worker_lost"), LastFailed: "w1"},
			obs:  migrations.Observation{Dispatch: &migrations.DispatchOutcome{Result: migrations.DispatchUnroutable, Err: "no worker"}},
			want: want{kind: migrations.Fail, code: "no_worker", status: http.StatusInternalServerError, migFailed: true}},
		{name: "busy before the first dispatch: a rejection", policy: policy(3, 0), req: newReq(""),
			obs:  migrations.Observation{Dispatch: &migrations.DispatchOutcome{Result: migrations.DispatchUnroutable, Busy: true, Err: "busy"}},
			want: want{kind: migrations.Fail, code: "all_workers_busy", status: http.StatusServiceUnavailable, rejected: true}},
		{name: "busy after a failure: no other worker", policy: policy(3, 0),
			req:  newReq("").routed(0, "w1").closed(events.AttemptFailed{Attempt: 0, WorkerID: "w1", Reason: "dispatch_failed"}).migrated(0, "w1", newReq_, "fe"),
			mem:  migrations.Memory{Migration: failed(0, "w1", newReq_, "dispatch_failed"), LastFailed: "w1"},
			obs:  migrations.Observation{Dispatch: &migrations.DispatchOutcome{Result: migrations.DispatchUnroutable, Busy: true, Err: "busy"}},
			want: want{kind: migrations.Fail, code: "no_worker", status: http.StatusServiceUnavailable, migFailed: true}},
		{name: "refused: try another worker, not a failure", policy: policy(3, 0),
			req:  newReq("").routed(0, "w1").closed(events.AttemptFailed{Attempt: 0, WorkerID: "w1", Reason: "refused_busy"}),
			obs:  migrations.Observation{Dispatch: &migrations.DispatchOutcome{Result: migrations.DispatchRefused, Attempt: 0, WorkerID: "w1", Reason: "busy"}},
			want: want{kind: migrations.DispatchNext, attempt: 1, exclude: []string{"w1"}}},
		{name: "refused, its closure not folded yet: still the next attempt", policy: policy(3, 0),
			req:  newReq("").routed(0, "w1"),
			obs:  migrations.Observation{Dispatch: &migrations.DispatchOutcome{Result: migrations.DispatchRefused, Attempt: 0, WorkerID: "w1", Reason: "busy"}},
			want: want{kind: migrations.DispatchNext, attempt: 1, exclude: []string{"w1"}}},
		{name: "pinned worker refused: fail", policy: policy(3, 0),
			req:  newReq("w1").routed(0, "w1").closed(events.AttemptFailed{Attempt: 0, WorkerID: "w1", Reason: "refused_busy"}),
			obs:  migrations.Observation{Dispatch: &migrations.DispatchOutcome{Result: migrations.DispatchRefused, Attempt: 0, WorkerID: "w1", Reason: "busy"}},
			want: want{kind: migrations.Fail, code: "no_worker", status: http.StatusServiceUnavailable}},
		{name: "no answer to the dispatch: a new_request failure", policy: policy(3, 0), req: newReq("").routed(0, "w1"),
			obs:  migrations.Observation{Dispatch: &migrations.DispatchOutcome{Result: migrations.DispatchNoAnswer, Attempt: 0, WorkerID: "w1"}},
			want: want{kind: migrations.Fence, reason: "dispatch_failed", migType: newReq_, inhibit: true, appendFence: true}},
		{name: "racing frontend: the routed decision lost, look again", policy: policy(3, 0), req: newReq(""),
			obs:  migrations.Observation{Dispatch: &migrations.DispatchOutcome{Result: migrations.DispatchSuperseded}},
			want: want{kind: migrations.DispatchNext, attempt: 0}},
		{name: "racing frontend: its migration landed first, it owns the request", policy: policy(3, 0),
			req:  newReq("").routed(0, "w1").tokens(0, 2).migrated(0, "w1", ongoing, "other"),
			mem:  migrations.Memory{Failure: failed(0, "w1", ongoing, "worker_lost")},
			want: want{kind: migrations.Stop}},
		{name: "migration superseded by a stop cancel: decide again", policy: policy(3, 0),
			req: newReq("").routed(0, "w1").tokens(0, 2).closed(events.AttemptFailed{Attempt: 0, WorkerID: "w1", Reason: "stalled"}).
				apply(events.RequestCancelled{RequestID: "r", Mode: events.CancelStop}),
			mem:  migrations.Memory{Failure: failed(0, "w1", ongoing, "stalled")},
			want: want{kind: migrations.Migrate, migType: ongoing, attempt: 0}},
		{name: "no client for the detach timeout: cancel", policy: policy(3, 0), req: newReq("").routed(0, "w1"),
			mem: watching(0, "w1", t0), obs: migrations.Observation{Worker: present("w1"), LastProgress: t0, DetachedSince: t0.Add(-detach)},
			want: want{kind: migrations.Detach}},
		{name: "detached for less than the timeout: wait for the rest", policy: policy(3, 0), req: newReq("").routed(0, "w1"),
			mem: watching(0, "w1", t0), obs: migrations.Observation{Worker: present("w1"), LastProgress: t0, DetachedSince: t0.Add(-detach + 10*time.Second)},
			want: want{kind: migrations.Wait, until: 10 * time.Second}},
		{name: "taken over after a frontend crash while running: watch", policy: policy(3, 0), req: newReq("").routed(0, "w1"),
			obs:  migrations.Observation{Worker: present("w1"), LastProgress: t0},
			want: want{kind: migrations.Wait, until: stall}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := migrations.State{Request: tc.req.Request, Memory: tc.mem}
			check(t, tc.policy.Step(s, tc.obs, t0), t0, tc.want)
		})
	}
}

// TestStepTimers runs the runner's loop on synctest's fake clock: each Wait
// is slept for real, so a 30 s stall and a 2 min detach take microseconds.
func TestStepTimers(t *testing.T) {
	t.Run("stall after the last token", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			p := policy(3, 0)
			r := newReq("").routed(0, "w1")
			start := time.Now()
			obs := migrations.Observation{Worker: present("w1"), Dispatch: &migrations.DispatchOutcome{Attempt: 0, WorkerID: "w1", LeaseID: "L-w1"}}
			a := p.Step(migrations.State{Request: r.Request}, obs, time.Now())
			check(t, a, time.Now(), want{kind: migrations.Wait, until: stall})
			time.Sleep(10 * time.Second)
			r.tokens(0, 4) // progress: the stall clock restarts
			obs = migrations.Observation{Worker: present("w1"), LastProgress: time.Now()}
			a = p.Step(migrations.State{Request: r.Request, Memory: a.Next}, obs, time.Now())
			check(t, a, time.Now(), want{kind: migrations.Wait, until: stall})
			time.Sleep(time.Until(a.Until))
			a = p.Step(migrations.State{Request: r.Request, Memory: a.Next}, obs, time.Now())
			check(t, a, time.Now(), want{kind: migrations.Fence, reason: "stalled", migType: events.MigrationOngoingRequest, inhibit: true, appendFence: true})
			if got := time.Since(start); got != 40*time.Second {
				t.Errorf("stalled after %v, want 40s", got)
			}
		})
	})
	t.Run("detach, then again if the cancel did not take", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			p := policy(3, 0)
			r := newReq("").routed(0, "w1")
			left := time.Now()
			mem := watching(0, "w1", time.Now())
			for {
				obs := migrations.Observation{Worker: present("w1"), LastProgress: time.Now(), DetachedSince: left}
				a := p.Step(migrations.State{Request: r.Request, Memory: mem}, obs, time.Now())
				mem = a.Next
				if a.Kind == migrations.Detach {
					break
				}
				time.Sleep(time.Until(a.Until))
			}
			if got := time.Since(left); got != detach {
				t.Errorf("detached after %v, want %v", got, detach)
			}
			obs := migrations.Observation{Worker: present("w1"), LastProgress: time.Now(), DetachedSince: left}
			a := p.Step(migrations.State{Request: r.Request, Memory: mem}, obs, time.Now())
			check(t, a, time.Now(), want{kind: migrations.Wait, until: time.Second})
			time.Sleep(time.Second)
			a = p.Step(migrations.State{Request: r.Request, Memory: a.Next}, obs, time.Now())
			check(t, a, time.Now(), want{kind: migrations.Detach})
		})
	})
}

// TestStepFailRetried: when a terminal failure could not be recorded (the
// log was unavailable), the next step records it again; it never
// dispatches a request the policy refused to migrate.
func TestStepFailRetried(t *testing.T) {
	for _, tc := range []struct {
		name   string
		policy migrations.Policy
		req    req
		mem    migrations.Memory
		code   string
	}{
		{"migration disabled", policy(0, 0),
			newReq("").routed(0, "w1").tokens(0, 2).closed(events.AttemptFailed{Attempt: 0, WorkerID: "w1", Reason: "engine_error"}),
			watching(0, "w1", t0), "migration_disabled"},
		{"upstream rejected the request", policy(3, 0),
			newReq("").routed(0, "w1").closed(events.AttemptFailed{Attempt: 0, WorkerID: "w1", Reason: "engine_error", Class: events.FailureClient, Status: 400, Code: "bad"}),
			watching(0, "w1", t0), "bad"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem := tc.mem
			for try := range 3 {
				a := tc.policy.Step(migrations.State{Request: tc.req.Request, Memory: mem}, migrations.Observation{Worker: present("w1")}, t0)
				if a.Kind == migrations.Fence {
					mem = a.Next
					a = tc.policy.Step(migrations.State{Request: tc.req.Request, Memory: mem}, migrations.Observation{}, t0)
				}
				if a.Kind != migrations.Fail || a.Failed.Code != tc.code {
					t.Fatalf("try %d: %v %+v, want Fail %s", try, a.Kind, a.Failed, tc.code)
				}
				mem = a.Next // the append failed: the request is not terminal
			}
		})
	}
}

// TestStepMigrationCountedOnce walks a whole migration whose continuation
// finds no worker: the decision is recorded, but no re-dispatch happened,
// so nothing is counted; then one that succeeds is counted exactly once.
func TestStepMigrationCountedOnce(t *testing.T) {
	p := policy(3, 0)
	r := newReq("").routed(0, "w1").tokens(0, 3)
	counted := 0
	step := func(mem migrations.Memory, obs migrations.Observation) migrations.Action {
		a := p.Step(migrations.State{Request: r.Request, Memory: mem}, obs, t0)
		if a.Report.Migrated != nil {
			counted++
		}
		return a
	}
	// w1 fails; the runner fences it and records the migration.
	a := step(watching(0, "w1", t0.Add(-stall)), migrations.Observation{Worker: present("w1"), LastProgress: t0.Add(-stall)})
	check(t, a, t0, want{kind: migrations.Fence, reason: "stalled", migType: events.MigrationOngoingRequest, inhibit: true, appendFence: true})
	r.closed(a.Fence)
	a = step(a.Next, migrations.Observation{})
	check(t, a, t0, want{kind: migrations.Migrate, migType: events.MigrationOngoingRequest})
	r.apply(a.Migrated)
	a = step(a.Next, migrations.Observation{})
	check(t, a, t0, want{kind: migrations.DispatchNext, attempt: 1, exclude: []string{"w1"}})
	// w2 accepts, then fails at once; again a migration is recorded...
	r.routed(1, "w2")
	a = step(a.Next, migrations.Observation{Worker: present("w2"), Dispatch: &migrations.DispatchOutcome{Attempt: 1, WorkerID: "w2", LeaseID: "L-w2"}})
	r.closed(events.AttemptFailed{Attempt: 1, WorkerID: "w2", Reason: "engine_error"})
	a = step(a.Next, migrations.Observation{Worker: present("w2")})
	check(t, a, t0, want{kind: migrations.Fence, reason: "engine_error", migType: events.MigrationOngoingRequest, inhibit: true, attempt: 1})
	a = step(a.Next, migrations.Observation{})
	r.apply(a.Migrated)
	a = step(a.Next, migrations.Observation{})
	check(t, a, t0, want{kind: migrations.DispatchNext, attempt: 2, exclude: []string{"w2"}})
	// ...but no worker is left to continue it.
	a = step(a.Next, migrations.Observation{Dispatch: &migrations.DispatchOutcome{Result: migrations.DispatchUnroutable, Err: "no worker"}})
	check(t, a, t0, want{kind: migrations.Fail, code: "no_worker", status: http.StatusInternalServerError, migFailed: true})
	if counted != 1 {
		t.Errorf("migrations counted = %d for one re-dispatch that happened, want 1", counted)
	}
}

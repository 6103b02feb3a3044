package runner

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/streams"
)

// fold applies evs, in order, to a new projection of request "r".
func fold(evs ...events.Event) *projections.Request {
	p := projections.NewRequest()
	for i, ev := range append([]events.Event{events.RequestAccepted{RequestID: "r", Model: "m", Frontend: "fe"}}, evs...) {
		p.Apply(events.Envelope{Seq: uint64(i + 1), Event: ev})
	}
	return p
}

func TestAttemptCommand(t *testing.T) {
	routed := func(k int, w string) events.Event {
		return events.RequestRouted{RequestID: "r", Attempt: k, WorkerID: w}
	}
	kill := events.RequestCancelled{RequestID: "r", Mode: events.CancelKill, Reason: "k"}
	stop := events.RequestCancelled{RequestID: "r", Mode: events.CancelStop, Reason: "s"}
	migrated := events.RequestMigrated{RequestID: "r", FromAttempt: 0, FromWorker: "w1"}
	for _, tc := range []struct {
		name    string
		p       *projections.Request
		attempt int
		want    string // "kind mode", "" for none
	}{
		{name: "running: nothing", p: fold(routed(0, "w1")), attempt: 0},
		{name: "no such attempt (yet)", p: fold(routed(0, "w1")), attempt: 1},
		{name: "killed: kill", p: fold(routed(0, "w1"), kill), attempt: 0, want: "cancel kill"},
		{name: "stopped: stop", p: fold(routed(0, "w1"), stop), attempt: 0, want: "cancel stop"},
		{name: "stop then kill: kill", p: fold(routed(0, "w1"), stop, kill), attempt: 0, want: "cancel kill"},
		{name: "migrated away: fence", p: fold(routed(0, "w1"), migrated), attempt: 0, want: "fence "},
		{name: "an earlier attempt: fence", p: fold(routed(0, "w1"), migrated, routed(1, "w2")), attempt: 0, want: "fence "},
		{name: "the continuation of a stopped request: stop", p: fold(routed(0, "w1"), stop, migrated, routed(1, "w2")), attempt: 1, want: "cancel stop"},
		{name: "failed: fence", p: fold(routed(0, "w1"), events.RequestFailed{RequestID: "r"}), attempt: 0, want: "fence "},
		{name: "completed: nothing", p: fold(routed(0, "w1"), events.RequestCompleted{RequestID: "r", Attempt: 0}), attempt: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := ""
			if c := attemptCommand(tc.p, tc.attempt); c != nil {
				got = c.Kind + " " + c.Mode
				if c.RequestID != "r" || c.Attempt != tc.attempt {
					t.Errorf("command %+v, want request r attempt %d", c, tc.attempt)
				}
			}
			if got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// TestRelayCancelAfterDispatch: a cancel stored by another frontend while
// the dispatch was in flight (it saw no attempt to send a command to)
// reaches the worker: the owner's runner relays it once the worker has
// accepted. Formerly the worker read the log for this; now it reads none.
func TestRelayCancelAfterDispatch(t *testing.T) {
	for _, mode := range []string{events.CancelKill, events.CancelStop} {
		t.Run(mode, func(t *testing.T) {
			x := newRunnerFixture(t, fakeWorker{id: "w1", cancelFirst: mode})
			st := x.run("r")
			want := streams.Command{RequestID: "r", Attempt: 0, Kind: streams.CommandCancel, Mode: mode, Reason: "elsewhere"}
			deadline := time.Now().Add(5 * time.Second)
			for !slices.Contains(x.received(), want) {
				if time.Now().After(deadline) {
					t.Fatalf("w1 received %+v, want %+v", x.received(), want)
				}
				time.Sleep(5 * time.Millisecond)
			}
			if wantSt := map[string]string{events.CancelKill: "cancelled", events.CancelStop: "completed"}[mode]; string(st.Status) != wantSt {
				t.Errorf("status %s, want %s", st.Status, wantSt)
			}
		})
	}
}

// TestCheck: a frontend answers a worker's check from the log, about
// attempts routed to that worker only; a detach check cancels a request
// whose owner is gone.
func TestCheck(t *testing.T) {
	x := newRunnerFixture(t)
	appendEv := func(id string, ev events.Event) {
		t.Helper()
		if _, err := x.log.Append(x.ctx, streams.RequestEvents(id), x.log.Envelope(events.ID(id, ev.EventType()), id, ev), -1); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"run", "killed", "gone"} {
		appendEv(id, events.RequestAccepted{RequestID: id, Model: "m", Frontend: "fe-gone"})
		appendEv(id, events.RequestRouted{RequestID: id, Attempt: 0, WorkerID: "w1"})
	}
	appendEv("killed", events.RequestCancelled{RequestID: "killed", Mode: events.CancelKill})
	ask := func(worker string, c streams.Check) streams.CheckReply {
		data, _ := json.Marshal(c)
		ctx, cancel := context.WithTimeout(x.ctx, 5*time.Second)
		defer cancel()
		return x.rn.checks.check(ctx, streams.CheckSubject(worker), data)
	}
	if r := ask("w1", streams.Check{RequestID: "run", Attempt: 0}); r.Command != nil || r.Owner != "fe-gone" || r.Error != "" {
		t.Errorf("running: %+v, want no command, owner fe-gone", r)
	}
	if r := ask("w1", streams.Check{RequestID: "killed", Attempt: 0}); r.Command == nil || r.Command.Mode != events.CancelKill {
		t.Errorf("killed: %+v, want a kill", r)
	}
	if r := ask("w2", streams.Check{RequestID: "killed", Attempt: 0, Detach: true}); r.Command != nil || r.Owner != "" {
		t.Errorf("another worker's attempt: %+v, want nothing", r)
	}
	if r := ask("w2", streams.Check{RequestID: "gone", Attempt: 0, Detach: true}); r.Command != nil {
		t.Errorf("another worker's detach: %+v, want nothing", r)
	}
	if p, _ := x.rn.Load(x.ctx, "gone"); p.Cancel != nil {
		t.Fatalf("another worker's detach cancelled the request: %+v", p.Cancel)
	}
	if r := ask("w1", streams.Check{RequestID: "gone", Attempt: 0, Detach: true}); r.Command == nil || r.Command.Mode != events.CancelKill {
		t.Errorf("detach: %+v, want a kill", r)
	}
	if p, _ := x.rn.Load(x.ctx, "gone"); p.Status != projections.StatusCancelled {
		t.Errorf("after the detach check: status %s, want cancelled", p.Status)
	}
	if r := x.rn.checks.check(x.ctx, "baton.checks.a.b", []byte(`{}`)); r.Error == "" {
		t.Errorf("malformed check: %+v, want an error", r)
	}
}

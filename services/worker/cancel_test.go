package worker_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/internal/natstest"
	"github.com/baton-dev/baton/services/engine"
	"github.com/baton-dev/baton/services/worker"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go"
)

// cancel does what a frontend does for a cancel of request id, attempt 0,
// running on workerID: it appends the cancelled event and sends the command
// to the worker. It returns the event's sequence.
func (e *env) cancel(workerID, id, mode string) uint64 {
	e.t.Helper()
	c := events.RequestCancelled{RequestID: id, Mode: mode, Reason: "test"}
	seq, err := e.log.Append(context.Background(), streams.RequestEvents(id), e.log.Envelope(id+".cancel", id, c), -1)
	if err != nil {
		e.t.Fatal(err)
	}
	e.command(workerID, streams.Command{RequestID: id, Attempt: 0, Kind: streams.CommandCancel, Mode: mode, Reason: "test"})
	return seq
}

// command publishes c on workerID's command subject.
func (e *env) command(workerID string, c streams.Command) {
	e.t.Helper()
	data, _ := json.Marshal(c)
	if err := e.nc.Publish(streams.CommandSubject(workerID), data); err != nil {
		e.t.Fatal(err)
	}
}

func countTokens(es []events.Envelope) int {
	n := 0
	for _, ev := range es {
		if d, ok := ev.Event.(events.TokensGenerated); ok {
			n += len(d.Tokens)
		}
	}
	return n
}

// A kill stops the engine, the in-flight gauge returns to 0, and no token is
// appended after the cancel.
func TestCancelKillStopsEngine(t *testing.T) {
	e := newEnv(t)
	mock, _ := engine.NewMock(slow)
	r, _ := e.startStatus(mock, worker.Config{ID: "w-kill", DeltaMaxTokens: 1})
	e.dispatched("r-k", "p q", 1000, "w-kill")
	e.waitFor("two tokens", func() bool { return countTokens(e.request("r-k")) >= 2 })
	start := time.Now()
	cancelSeq := e.cancel("w-kill", "r-k", events.CancelKill)
	e.waitFor("inflight back to 0", func() bool {
		return value(t, r.reg, "dynamo_component_inflight_requests") == 0 && mock.Stats().ActiveRequests == 0
	})
	// How fast is a measurement, not a test (timings flake on shared
	// machines); what must hold is below: nothing after the kill.
	t.Logf("engine stopped %v after the kill", time.Since(start))
	// Give a straggler the time of several tokens to show up.
	time.Sleep(300 * time.Millisecond)
	log := e.request("r-k")
	for _, ev := range log {
		if _, ok := ev.Event.(events.TokensGenerated); ok && ev.Seq > cancelSeq {
			t.Errorf("token delta at seq %d after the kill at seq %d", ev.Seq, cancelSeq)
		}
		switch ev.Event.(type) {
		case events.RequestCompleted, events.AttemptFailed:
			t.Errorf("%s appended after a kill; the cancelled event ends the request", ev.Type())
		}
	}
	if got := value(t, r.reg, "dynamo_component_cancellation_total"); got != 1 {
		t.Errorf("cancellation_total = %v, want 1", got)
	}
}

// A worker reads no request's log: it obeys the commands on its own
// subject for the attempts it runs, in either mode, and ignores those for
// attempts it does not run (another attempt of the same request, another
// request). The frontend closes the race of a cancel stored while a dispatch
// was in flight by relaying it once the dispatch is accepted
// (TestRelayCancelAfterDispatch).
func TestCommandsOnlyForRunningAttempts(t *testing.T) {
	for _, tc := range []struct {
		mode string
		want string // outcome on the tokens subject; "" means none
	}{
		{events.CancelKill, ""},
		{events.CancelStop, worker.FinishCancelled},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			e := newEnv(t)
			r := e.start(nil, slow, worker.Config{ID: "w-cmd"})
			e.accept("r-run", "x", 1000, "w-cmd")
			if rep := e.dispatch("w-cmd", newDispatch("r-run", "x", 8)); !rep.Accepted {
				t.Fatalf("dispatch: %+v", rep)
			}
			e.dispatched("r-c", "y", 1000, "w-cmd")
			for _, c := range []streams.Command{
				{RequestID: "r-run", Attempt: 1, Kind: streams.CommandCancel, Mode: events.CancelKill},
				{RequestID: "r-none", Attempt: 0, Kind: streams.CommandFence},
				{RequestID: "r-c", Attempt: 0, Kind: streams.CommandCancel, Mode: tc.mode},
			} {
				e.command("w-cmd", c)
			}
			e.waitFor("cancellation counted", func() bool {
				return value(t, r.reg, "dynamo_component_cancellation_total") == 1 &&
					value(t, r.reg, "dynamo_component_inflight_requests") == 0
			})
			if last, ok := ended(e.request("r-run")); !ok {
				t.Error("r-run did not run to its end")
			} else if c, isC := last.Event.(events.RequestCompleted); !isC || c.FinishReason != "length" {
				t.Errorf("r-run ended with %+v, want completed length", last.Event)
			}
			last, ok := ended(e.request("r-c"))
			switch {
			case tc.want == "" && ok:
				t.Errorf("outcome %s after a kill, want none", last.Type())
			case tc.want != "":
				if c, isC := last.Event.(events.RequestCompleted); !ok || !isC || c.FinishReason != tc.want {
					t.Errorf("outcome %+v, want completed %s", last.Event, tc.want)
				}
			}
		})
	}
}

// Regression: a cancel stored while the worker's connection was down never
// reached it, and the request ran to its end. The worker now asks a live
// frontend about each of its jobs when the connection comes back (here a
// stand-in answering as a frontend would from the log: kill).
func TestCancelStoredWhileDisconnectedIsObeyed(t *testing.T) {
	e := newEnv(t)
	p := natstest.NewProxy(t, e.s.Addr().String())
	nc, err := nats.Connect(p.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	checks := make(chan streams.Check, 8)
	sub, err := e.nc.QueueSubscribe(streams.CheckSubjects, streams.CheckQueue, func(m *nats.Msg) {
		var c streams.Check
		_ = json.Unmarshal(m.Data, &c)
		if w, err := streams.CheckWorker(m.Subject); err != nil || w != "w-dc" {
			t.Errorf("check on %s, want w-dc's subject", m.Subject)
		}
		checks <- c
		data, _ := json.Marshal(streams.CheckReply{Owner: "fe-test", Command: &streams.Command{
			RequestID: c.RequestID, Attempt: c.Attempt, Kind: streams.CommandCancel, Mode: events.CancelKill}})
		_ = m.Respond(data)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	// A lease long enough to survive the outage.
	r := e.start(nc, slow, worker.Config{ID: "w-dc", LeaseTTL: 30 * time.Second, DeltaMaxTokens: 1})
	e.dispatched("r-dc", "p q", 1000, "w-dc")
	e.waitFor("two tokens", func() bool { return countTokens(e.request("r-dc")) >= 2 })
	p.Cut()
	e.cancel("w-dc", "r-dc", events.CancelKill) // the command is lost: the worker is cut off
	p.Restore()
	e.waitFor("the kill to be obeyed after the reconnect", func() bool {
		return value(t, r.reg, "dynamo_component_cancellation_total") == 1 &&
			value(t, r.reg, "dynamo_component_inflight_requests") == 0
	})
	if c := <-checks; c.RequestID != "r-dc" || c.Attempt != 0 || c.Detach {
		t.Errorf("check %+v, want r-dc attempt 0 without detach", c)
	}
}

// A request whose owning frontend is gone for the detach timeout: the worker
// asks a live frontend (here a stand-in that cancels it: kill), and with no
// frontend to answer it stops the job itself and closes its attempt
// ("detached"). It never writes the request's events subject.
func TestDetachAsksAFrontend(t *testing.T) {
	for _, tc := range []struct {
		name      string
		frontend  bool
		want      string // the attempt's close reason; "" for none (killed)
		cancelled float64
	}{
		{name: "a frontend cancels it", frontend: true, cancelled: 1},
		{name: "no frontend answers", want: "detached"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			if tc.frontend {
				sub, err := e.nc.QueueSubscribe(streams.CheckSubjects, streams.CheckQueue, func(m *nats.Msg) {
					var c streams.Check
					_ = json.Unmarshal(m.Data, &c)
					r := streams.CheckReply{Owner: c.Owner}
					if c.Detach {
						r.Command = &streams.Command{RequestID: c.RequestID, Attempt: c.Attempt, Kind: streams.CommandCancel, Mode: events.CancelKill}
					}
					data, _ := json.Marshal(r)
					_ = m.Respond(data)
				})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = sub.Unsubscribe() })
			}
			r := e.start(nil, slow, worker.Config{ID: "w-det"})
			e.accept("r-det", "x", 1000, "w-det")
			d := newDispatch("r-det", "x", 1000)
			d.Frontend, d.DetachTimeoutMS = "fe-gone", 200 // never alive in the frontends bucket
			if rep := e.dispatch("w-det", d); !rep.Accepted {
				t.Fatalf("dispatch: %+v", rep)
			}
			e.waitFor("the job to end", func() bool { return value(t, r.reg, "dynamo_component_inflight_requests") == 0 })
			last, ok := ended(e.request("r-det"))
			f, isF := last.Event.(events.AttemptFailed)
			switch {
			case tc.want == "" && ok:
				t.Errorf("outcome %s, want none after a kill", last.Type())
			case tc.want != "" && (!isF || f.Reason != tc.want):
				t.Errorf("outcome %+v, want attempt_failed %s", last.Event, tc.want)
			}
			if got := value(t, r.reg, "dynamo_component_cancellation_total"); got != tc.cancelled {
				t.Errorf("cancellation_total = %v, want %v", got, tc.cancelled)
			}
			for _, ev := range e.request("r-det") {
				if ev.Stored == streams.RequestEvents("r-det") && ev.Source == "baton/worker/w-det" {
					t.Errorf("the worker wrote %s on the events subject", ev.Type())
				}
			}
		})
	}
}

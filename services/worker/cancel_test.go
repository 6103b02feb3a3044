package worker_test

import (
	"context"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/internal/natstest"
	"github.com/baton-dev/baton/services/engine"
	"github.com/baton-dev/baton/services/worker"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go"
)

func (e *env) cancel(id, mode string) uint64 {
	e.t.Helper()
	c := events.RequestCancelled{RequestID: id, Mode: mode, Reason: "test"}
	seq, err := e.log.Append(context.Background(), streams.RequestEvents(id), e.log.Envelope(id+".cancel", id, c), -1)
	if err != nil {
		e.t.Fatal(err)
	}
	return seq
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
	e.accept("r-k", "p q", 1000, "w-kill")
	if rep := e.dispatch("w-kill", newDispatch("r-k", "p q", 1000)); !rep.Accepted {
		t.Fatalf("dispatch: %+v", rep)
	}
	e.waitFor("two tokens", func() bool { return countTokens(e.request("r-k")) >= 2 })
	start := time.Now()
	cancelSeq := e.cancel("r-k", events.CancelKill)
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

// Regression: a cancel stored before the worker's per-request subscription
// was active used to be missed, and the request ran to its end.
func TestCancelStoredBeforeDispatchIsObeyed(t *testing.T) {
	for _, tc := range []struct {
		mode string
		want string // outcome on the tokens subject; "" means none
	}{
		{events.CancelKill, ""},
		{events.CancelStop, worker.FinishCancelled},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			e := newEnv(t)
			r := e.start(nil, slow, worker.Config{ID: "w-early"})
			e.accept("r-e", "x", 1000, "w-early")
			e.cancel("r-e", tc.mode)
			if rep := e.dispatch("w-early", newDispatch("r-e", "x", 1000)); !rep.Accepted {
				t.Fatalf("dispatch: %+v", rep)
			}
			e.waitFor("cancellation counted", func() bool {
				return value(t, r.reg, "dynamo_component_cancellation_total") == 1 &&
					value(t, r.reg, "dynamo_component_inflight_requests") == 0
			})
			log := e.request("r-e")
			if n := countTokens(log); n != 0 {
				t.Errorf("%d tokens generated for a request cancelled before its dispatch", n)
			}
			last, ok := ended(log)
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

// Regression: a cancel stored while the worker's connection was down was
// republished to nobody, and the request ran to its end. The worker now
// re-reads its jobs' commands when the connection comes back.
func TestCancelStoredWhileDisconnectedIsObeyed(t *testing.T) {
	e := newEnv(t)
	p := natstest.NewProxy(t, e.s.Addr().String())
	nc, err := nats.Connect(p.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	// A lease long enough to survive the outage.
	r := e.start(nc, slow, worker.Config{ID: "w-dc", LeaseTTL: 30 * time.Second, DeltaMaxTokens: 1})
	e.accept("r-dc", "p q", 1000, "w-dc")
	if rep := e.dispatch("w-dc", newDispatch("r-dc", "p q", 1000)); !rep.Accepted {
		t.Fatalf("dispatch: %+v", rep)
	}
	e.waitFor("two tokens", func() bool { return countTokens(e.request("r-dc")) >= 2 })
	p.Cut()
	e.cancel("r-dc", events.CancelKill)
	p.Restore()
	e.waitFor("the kill to be obeyed after the reconnect", func() bool {
		return value(t, r.reg, "dynamo_component_cancellation_total") == 1 &&
			value(t, r.reg, "dynamo_component_inflight_requests") == 0
	})
}

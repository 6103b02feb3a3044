package worker_test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/services/engine"
	"github.com/baton-dev/baton/services/worker"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go"
)

// finishing is an engine that reports each generation's return on done.
type finishing struct {
	engine.Engine
	done chan struct{}
}

func (f finishing) Generate(ctx context.Context, req engine.Request, emit func(engine.Token) error) (engine.Result, error) {
	res, err := f.Engine.Generate(ctx, req, emit)
	f.done <- struct{}{}
	return res, err
}

// outputOf is what attempt 0 of request id stored on its tokens subject.
func (e *env) outputOf(id, workerID string) []events.Envelope {
	e.t.Helper()
	var out []events.Envelope
	for _, ev := range e.request(id) {
		if ev.Stored == streams.RequestTokens(id, 0, workerID) {
			out = append(out, ev)
		}
	}
	return out
}

// A dispatch sent before its routed decision was stored (events.Dispatch
// .Hold) runs the engine at once and stores nothing of the attempt until
// the worker knows the decision is stored: the engine's whole answer is
// made and nothing is in the log; then, told, the worker stores all of it
// and the end. A fence naming the dispatch ends it with nothing stored; a
// fence naming another dispatch of the same attempt does not touch it, nor
// does one naming it while another held dispatch of the attempt joined it
// (two frontends racing to create one request); a
// notice that overtook the dispatch releases it when it comes; a stop
// releases it (a cancel is sent only for an attempt the log routes here)
// and stores what was made.
func TestHeldDispatchStoresNothingUntilRouted(t *testing.T) {
	for _, tc := range []struct {
		name   string
		before []streams.Command // commands sent before the dispatch
		join   string            // a second held dispatch of the attempt, with this hold
		after  []streams.Command // sent once the engine finished
		stored bool              // the answer and its end are stored, else nothing
	}{
		{name: "routed", after: []streams.Command{{Kind: streams.CommandRouted}}, stored: true},
		{name: "fenced", after: []streams.Command{{Kind: streams.CommandFence, Hold: "h1"}}},
		{name: "another dispatch's fence", after: []streams.Command{{Kind: streams.CommandFence, Hold: "h0"}, {Kind: streams.CommandRouted}}, stored: true},
		// Two frontends raced to create the request: the loser's dispatch
		// started the job, the winner's joined it; the loser's fence must
		// leave it to the winner's notice.
		{name: "the fence of a raced dispatch", join: "h2", after: []streams.Command{{Kind: streams.CommandFence, Hold: "h1"}, {Kind: streams.CommandRouted}}, stored: true},
		{name: "both raced dispatches fenced", join: "h2", after: []streams.Command{{Kind: streams.CommandFence, Hold: "h1"}, {Kind: streams.CommandFence, Hold: "h2"}}},
		{name: "notice before the dispatch", before: []streams.Command{{Kind: streams.CommandRouted}}, stored: true},
		// The answer was whole before the stop: its end says length.
		{name: "stopped", after: []streams.Command{{Kind: streams.CommandCancel, Mode: events.CancelStop}}, stored: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			mock, _ := engine.NewMock(fullSpeed)
			eng := finishing{Engine: mock, done: make(chan struct{}, 1)}
			r := e.startEngine(nil, eng, worker.Config{ID: "w-hold", DeltaMaxTokens: 1})
			if l, _ := e.lease("w-hold"); !l.HoldsUntilRouted {
				t.Fatalf("lease %+v does not say the worker holds", l)
			}
			e.accept("r-h", "a b c", 12, "w-hold")
			send := func(cs []streams.Command) {
				for _, c := range cs {
					c.RequestID, c.Attempt = "r-h", 0
					e.command("w-hold", c)
				}
				if err := e.nc.Flush(); err != nil {
					t.Fatal(err)
				}
			}
			// A notice sent first may still be handled after the dispatch
			// (another subscription): either way it releases the job.
			send(tc.before)
			d := newDispatch("r-h", "a b c", 12)
			d.Hold = "h1"
			if rep := e.dispatch("w-hold", d); !rep.Accepted {
				t.Fatalf("dispatch: %+v", rep)
			}
			if tc.join != "" {
				d.Hold = tc.join
				if rep := e.dispatch("w-hold", d); !rep.Accepted {
					t.Fatalf("second dispatch: %+v", rep)
				}
			}
			<-eng.done // the whole answer is made
			if len(tc.before) == 0 {
				if out := e.outputOf("r-h", "w-hold"); len(out) > 0 {
					t.Fatalf("stored before the decision was confirmed: %v", types(out))
				}
			}
			send(tc.after)
			e.waitFor("the job to end", func() bool { return value(t, r.reg, "dynamo_component_inflight_requests") == 0 })
			out := e.outputOf("r-h", "w-hold")
			end, ok := ended(out)
			c, completed := end.Event.(events.RequestCompleted)
			switch {
			case !tc.stored && len(out) > 0:
				t.Errorf("a fenced held attempt stored %v", types(out))
			case !tc.stored:
			case !ok || !completed:
				t.Errorf("no completion stored: %v", types(out))
			case countTokens(out) != 12 || c.FinishReason != "length":
				t.Errorf("stored %d tokens and %+v, want 12 and finish length", countTokens(out), c)
			}
		})
	}
}

// A held attempt whose notice never comes (lost on the way, or its
// frontend died once the decision was stored) is released by a check whose
// answer names the worker the attempt's; a check answered with a fence
// ends it with nothing stored.
func TestHeldDispatchAsksAFrontend(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer streams.CheckReply
		stored bool
	}{
		{name: "routed here", answer: streams.CheckReply{Owner: "fe-test"}, stored: true},
		{name: "fenced", answer: streams.CheckReply{Owner: "fe-test", Command: &streams.Command{RequestID: "r-ask", Kind: streams.CommandFence}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			asked := make(chan streams.Check, 8)
			sub, err := e.nc.QueueSubscribe(streams.CheckSubjects, streams.CheckQueue, func(m *nats.Msg) {
				var c streams.Check
				_ = json.Unmarshal(m.Data, &c)
				asked <- c
				data, _ := json.Marshal(tc.answer)
				_ = m.Respond(data)
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = sub.Unsubscribe() })
			r := e.start(nil, fullSpeed, worker.Config{ID: "w-ask"})
			e.accept("r-ask", "x y", 8, "w-ask")
			d := newDispatch("r-ask", "x y", 8)
			d.Hold = "h-ask"
			if rep := e.dispatch("w-ask", d); !rep.Accepted {
				t.Fatalf("dispatch: %+v", rep)
			}
			if c := <-asked; c.RequestID != "r-ask" || c.Attempt != 0 || c.Detach {
				t.Errorf("check %+v, want one about r-ask attempt 0", c)
			}
			e.waitFor("the job to end", func() bool { return value(t, r.reg, "dynamo_component_inflight_requests") == 0 })
			out := e.outputOf("r-ask", "w-ask")
			if _, ok := ended(out); ok != tc.stored || (tc.stored && countTokens(out) != 8) {
				t.Errorf("stored %v (%d tokens), want stored=%v", types(out), countTokens(out), tc.stored)
			}
		})
	}
}

// stalling is an engine whose first generation, once its context ends,
// returns only when let go: the job it runs stays in the worker's hands,
// ending, for as long as a test needs.
type stalling struct {
	engine.Engine
	started, stopping, letGo chan struct{}
	calls                    atomic.Int32
}

func (s *stalling) Generate(ctx context.Context, req engine.Request, emit func(engine.Token) error) (engine.Result, error) {
	if s.calls.Add(1) > 1 {
		return s.Engine.Generate(ctx, req, emit)
	}
	close(s.started)
	<-ctx.Done()
	close(s.stopping)
	<-s.letGo
	return engine.Result{}, ctx.Err()
}

// Two frontends race to create one request and both dispatch it, held; the
// loser's fence reaches the worker before the winner's dispatch does (they
// travel on different connections). The fence ends the only job, which
// stored nothing; the winner's dispatch, coming while that job still ends,
// starts a job of its own and is not refused, and the notice of its stored
// decision releases it: the whole answer is stored once.
func TestHeldDispatchAfterTheLosersFence(t *testing.T) {
	e := newEnv(t)
	mock, _ := engine.NewMock(fullSpeed)
	eng := &stalling{Engine: mock, started: make(chan struct{}), stopping: make(chan struct{}), letGo: make(chan struct{})}
	r := e.startEngine(nil, eng, worker.Config{ID: "w-race", DeltaMaxTokens: 1})
	e.accept("r-race", "a b c", 12, "w-race")
	d := newDispatch("r-race", "a b c", 12)
	d.Hold = "loser"
	if rep := e.dispatch("w-race", d); !rep.Accepted {
		t.Fatalf("the loser's dispatch: %+v", rep)
	}
	<-eng.started
	e.command("w-race", streams.Command{RequestID: "r-race", Kind: streams.CommandFence, Hold: "loser"})
	<-eng.stopping // the fence ended the job, which is still there
	d.Hold = "winner"
	if rep := e.dispatch("w-race", d); !rep.Accepted {
		t.Fatalf("the winner's dispatch: %+v", rep)
	}
	e.command("w-race", streams.Command{RequestID: "r-race", Kind: streams.CommandRouted})
	e.waitFor("the winner's answer stored", func() bool {
		_, ok := ended(e.outputOf("r-race", "w-race"))
		return ok
	})
	close(eng.letGo)
	e.waitFor("both jobs to end", func() bool { return value(t, r.reg, "dynamo_component_inflight_requests") == 0 })
	out := e.outputOf("r-race", "w-race")
	end, _ := ended(out)
	if c, ok := end.Event.(events.RequestCompleted); !ok || countTokens(out) != 12 || c.FinishReason != "length" {
		t.Errorf("stored %d tokens and %+v, want 12 and finish length", countTokens(out), end.Event)
	}
}

// returned is an engine that closes done when request id's generation
// returns (a canary's does not count).
type returned struct {
	engine.Engine
	id   string
	done chan struct{}
}

func (r returned) Generate(ctx context.Context, req engine.Request, emit func(engine.Token) error) (engine.Result, error) {
	res, err := r.Engine.Generate(ctx, req, emit)
	if req.RequestID == r.id {
		close(r.done)
	}
	return res, err
}

// A held dispatch whose engine has finished waits for its routed decision,
// which a log slowed by a junk flood took seconds to store. The engine is
// idle meanwhile: the health monitor runs its canaries, as for any idle
// engine, and never calls it stalled. Formerly the job counted as a request
// running without progress, and the worker left routing as stalled once
// HealthCheckTimeout passed, taking every request of the fleet's only
// honest worker with it (TestQuarantinedWorkerLargeJunkOnOwnAttempt on a
// loaded machine).
func TestHeldDispatchDoneIsNoStall(t *testing.T) {
	e := newEnv(t)
	mock, _ := engine.NewMock(fullSpeed)
	eng := returned{Engine: mock, id: "r-hd", done: make(chan struct{})}
	r, _ := e.startStatus(eng, worker.Config{ID: "w-hd", HealthCheck: true,
		CanaryWait: 50 * time.Millisecond, HealthCheckTimeout: 200 * time.Millisecond})
	e.accept("r-hd", "a b c", 12, "w-hd")
	d := newDispatch("r-hd", "a b c", 12)
	d.Hold = "h1"
	if rep := e.dispatch("w-hd", d); !rep.Accepted {
		t.Fatalf("dispatch: %+v", rep)
	}
	<-eng.done
	canaries := value(t, r.reg, "baton_worker_canary_total")
	// Two canaries after the engine returned: one in flight before it
	// could end after it whatever the fix.
	e.waitFor("two canaries while the held job waits", func() bool {
		if l, ok := e.lease("w-hd"); ok && l.NotReady {
			t.Fatalf("the worker left routing while its held job waited: %+v", l)
		}
		return value(t, r.reg, "baton_worker_canary_total") >= canaries+2
	})
	e.command("w-hd", streams.Command{RequestID: "r-hd", Attempt: 0, Kind: streams.CommandRouted})
	e.waitFor("the job to end", func() bool { return value(t, r.reg, "dynamo_component_inflight_requests") == 0 })
	if n := countTokens(e.outputOf("r-hd", "w-hd")); n != 12 {
		t.Errorf("stored %d tokens once routed, want 12", n)
	}
}

package runner

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/internal/waitfor"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/streams"
	"golang.org/x/sync/errgroup"
)

// startRunners runs the runtime's runners (not the rest of Start) until the
// test ends.
func (x *runnerFixture) startRunners() *Runner {
	var g errgroup.Group
	ctx, stop := context.WithCancel(x.ctx)
	g.Go(func() error { x.rn.runRunners(ctx, &g); return nil })
	x.t.Cleanup(func() { stop(); _ = g.Wait() })
	return x.rn
}

// acceptServed accepts acc through rn.Accept and fails the test unless it
// completes on w1 in one attempt.
func (x *runnerFixture) acceptServed(rn *Runner, acc events.RequestAccepted) {
	x.t.Helper()
	req, err := rn.Accept(x.ctx, acc)
	if err != nil {
		x.t.Fatal(err)
	}
	defer req.Release()
	if err := req.f.waitFor(x.ctx, func(p *projections.Request) bool { return p.Status.Terminal() }); err != nil {
		x.t.Fatal(err)
	}
	var st projections.State
	req.View(func(p *projections.Request) { st = p.State() })
	if st.Status != "completed" || st.Worker != "w1" || len(st.Attempts) != 1 {
		x.t.Fatalf("state %+v, want completed on w1 in one attempt", st)
	}
}

// TestAcceptDispatchesEarly: a request accepted here is dispatched to a
// worker that holds while its accepted event is appended; the runner's
// first dispatch takes that dispatch rather than sending another. When the
// append finds the id taken, the early dispatch is fenced, by its hold id
// only, once the worker answered: the running job of the request that has
// the id is not touched.
func TestAcceptDispatchesEarly(t *testing.T) {
	x := newRunnerFixture(t, fakeWorker{id: "w1", holds: true})
	acc := events.RequestAccepted{RequestID: "r-early", Model: "m", Prompt: "p", PromptTokens: 1, MaxTokens: 2, Frontend: "fe"}
	x.acceptServed(x.startRunners(), acc)
	if ds := x.sent(); len(ds) != 1 || ds[0].Hold == "" {
		t.Fatalf("dispatches %+v, want one held dispatch", ds)
	}

	if _, err := x.rn.Accept(x.ctx, acc); !errors.Is(err, ErrExists) {
		t.Fatalf("Accept of a taken id: %v, want ErrExists", err)
	}
	var second events.Dispatch
	waitfor.Signal(t, x.changed, "the second dispatch's fence", func() bool {
		ds := x.sent()
		if len(ds) < 2 {
			return false
		}
		second = ds[1]
		for _, c := range x.received() {
			if c.Kind == streams.CommandFence && c.RequestID == "r-early" {
				return true
			}
		}
		return false
	})
	for _, c := range x.received() {
		if c.Kind == streams.CommandFence && (c.Hold == "" || c.Hold != second.Hold || c.Hold == x.sent()[0].Hold) {
			t.Errorf("fence %+v, want one naming only the second dispatch's hold %q", c, second.Hold)
		}
	}
}

// TestAcceptStoresRouteWithAcceptance: with Config.RouteInAccepted, a held
// first dispatch's routed decision is stored in the accepted event while
// every live frontend folds it there, so the worker is told after one
// acknowledgement, not two; beside a frontend of an earlier release (its
// presence lacks reads_accepted_route), or without the switch (this
// release's default), it is stored after, as its own event.
func TestAcceptStoresRouteWithAcceptance(t *testing.T) {
	for _, tc := range []struct{ on, earlier bool }{{true, false}, {true, true}, {false, false}} {
		on, earlier := tc.on, tc.earlier
		t.Run(fmt.Sprintf("switch=%v,earlier_frontend=%v", on, earlier), func(t *testing.T) {
			x := newRunnerFixtureConfig(t, func(c *Config) { c.RouteInAccepted = on }, fakeWorker{id: "w1", holds: true})
			if earlier {
				x.put(streams.FrontendsBucket, "old", events.FrontendPresence{FrontendID: "old", ReadsCompacted: true})
				waitfor.Poll(t, "the earlier frontend in the fleet view", func() bool { return x.fl.FrontendAlive("old") })
			}
			const id = "r-route"
			x.acceptServed(x.startRunners(), events.RequestAccepted{RequestID: id, Model: "m", Prompt: "p", PromptTokens: 1, MaxTokens: 2, Frontend: "fe"})
			var route *events.RequestRouted
			var routed int
			for e, err := range streams.ReadRequest(x.ctx, x.js, x.rn.parts, id, 1) {
				if err != nil {
					t.Fatal(err)
				}
				switch ev := e.Event.(type) {
				case events.RequestAccepted:
					route = ev.Route
				case events.RequestRouted:
					routed++
				}
			}
			switch inAccepted := on && !earlier; {
			case inAccepted && (route == nil || route.WorkerID != "w1" || routed != 0):
				t.Errorf("accepted route %+v and %d routed events, want w1's route in the accepted event and none", route, routed)
			case !inAccepted && (route != nil || routed != 1):
				t.Errorf("accepted route %+v and %d routed events, want no route in the accepted event and one", route, routed)
			}
			var notices int
			for _, c := range x.received() {
				if c.Kind == streams.CommandRouted && c.RequestID == id {
					notices++
				}
			}
			if notices != 1 {
				t.Errorf("%d routed notices, want 1", notices)
			}
		})
	}
}

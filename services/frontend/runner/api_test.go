package runner

import (
	"errors"
	"testing"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/services/fleet"
	"github.com/baton-dev/baton/streams"
)

// TestAPI drives the runtime as the HTTP edge does, through its API only,
// on an embedded NATS with no HTTP: admit, accept, wait for the dispatch,
// read the request until it ends, attach to it again, cancel, stop.
func TestAPI(t *testing.T) {
	x := newRunnerFixture(t, fakeWorker{id: "w1"})
	rn := x.start()

	for _, tc := range []struct {
		name, model, pinned string
		want                error
	}{
		{name: "served", model: "m"},
		{name: "unknown model", model: "x", want: fleet.ErrUnknownModel},
		{name: "pinned to a worker not in discovery", model: "m", pinned: "w9", want: fleet.ErrWorkerNotFound},
		{name: "pinned", model: "m", pinned: "w1"},
	} {
		if got := rn.Admit(tc.model, events.EndpointCompletions, tc.pinned); !errors.Is(got, tc.want) {
			t.Errorf("Admit, %s: got %v, want %v", tc.name, got, tc.want)
		}
	}

	acc := events.RequestAccepted{RequestID: "r", Model: "m", Prompt: "p", PromptTokens: 1, MaxTokens: 2, Frontend: "fe"}
	req, err := rn.Accept(x.ctx, acc)
	if err != nil {
		t.Fatal(err)
	}
	wake := make(chan struct{}, 1)
	stop := req.Listen(wake)
	select {
	case <-req.Dispatched():
	case <-x.ctx.Done():
		t.Fatal("the first dispatch never settled")
	}
	for {
		var st projections.Status
		req.View(func(p *projections.Request) { st = p.Status })
		if st.Terminal() {
			break
		}
		select {
		case <-wake:
		case <-x.ctx.Done():
			t.Fatal("the request never ended")
		}
	}
	stop()
	x.wg.Wait()
	var text string
	req.View(func(p *projections.Request) { text = p.Text() })
	if text != "a b " || req.ID() != "r" {
		t.Errorf("request %s: text %q, want %q", req.ID(), text, "a b ")
	}

	again, err := rn.Attach(x.ctx, "r")
	if err != nil || again != req {
		t.Errorf("Attach of a followed request: got %p, %v, want the same request %p", again, err, req)
	}
	if _, err := rn.Accept(x.ctx, acc); !errors.Is(err, ErrExists) {
		t.Errorf("Accept of an existing id: got %v, want ErrExists", err)
	}
	if _, err := rn.Attach(x.ctx, "nope"); !errors.Is(err, streams.ErrNotFound) {
		t.Errorf("Attach of an unknown id: got %v, want streams.ErrNotFound", err)
	}
	if err := rn.Cancel(x.ctx, "r", events.CancelKill, "test", ""); err != nil {
		t.Errorf("Cancel of an ended request: %v", err)
	}
	if p, err := rn.Load(x.ctx, "r"); err != nil || p.Status != projections.StatusCompleted {
		t.Errorf("Load: got %v, %v, want completed (a cancel after the end changes nothing)", p, err)
	}
	again.Release()
	req.Release()
	if err := rn.Deregister(x.ctx); err != nil {
		t.Errorf("Deregister: %v", err)
	}
}

package runner

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/internal/natstest"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go"
	"golang.org/x/sync/errgroup"
)

// TestCatchUpOnReconnect: a completion stored while the frontend's
// connection was down reaches its follower as soon as the connection is back,
// not only when a later message reveals the gap.
func TestCatchUpOnReconnect(t *testing.T) {
	s := natstest.Start(t)
	js := s.Provision(t)
	log := streams.NewLog(js, "test")
	p := natstest.NewProxy(t, s.Addr().String())
	nc, err := nats.Connect(p.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	fjs := s.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	appendEv := func(subject, id string, ev events.Event) {
		t.Helper()
		natstest.Append(ctx, t, log, subject, id, "r1", ev)
	}
	appendEv(streams.RequestEvents("r1"), "a", events.RequestAccepted{RequestID: "r1", Model: "m", MaxTokens: 2})
	appendEv(streams.RequestEvents("r1"), "b", events.RequestRouted{RequestID: "r1", WorkerID: "w"})
	f, err := follow(ctx, liveOn(t, nc), fjs, 1, "r1", true)
	if err != nil {
		t.Fatal(err)
	}
	defer f.stop()
	rn := &Runner{nc: nc, log: slog.New(slog.DiscardHandler), requests: newRegistry()}
	rn.requests.requests["r1"] = &Request{id: "r1", f: f, refs: 1}
	var g errgroup.Group
	rctx, rcancel := context.WithCancel(ctx)
	rn.catchUpOnReconnect(rctx, &g)
	defer func() { rcancel(); _ = g.Wait() }()

	p.Cut()
	appendEv(streams.RequestTokens("r1", 0, "w"), "c", events.TokensGenerated{RequestID: "r1", Tokens: []string{"x ", "y "}})
	appendEv(streams.RequestTokens("r1", 0, "w"), "d", events.RequestCompleted{RequestID: "r1", FinishReason: "length", CompletionTokens: 2})
	p.Restore()
	if err := f.waitFor(ctx, func(p *projections.Request) bool { return p.Status == projections.StatusCompleted }); err != nil {
		t.Fatalf("the completion stored during the outage never reached the follower: %v", err)
	}
	f.view(func(p *projections.Request) {
		if p.Text() != "x y " {
			t.Errorf("text %q, want %q", p.Text(), "x y ")
		}
	})
}

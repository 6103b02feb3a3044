package frontend

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/internal/natstest"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go"
)

type followFixture struct {
	t   *testing.T
	ctx context.Context
	log *streams.Log
	n   int
}

func newFollowFixture(t *testing.T) (*followFixture, *natstest.Server) {
	s := natstest.Start(t)
	js := s.Provision(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return &followFixture{t: t, ctx: ctx, log: streams.NewLog(js, "test")}, s
}

func (x *followFixture) append(ev events.Event) {
	x.t.Helper()
	x.n++
	env := x.log.Envelope(events.ID("r1", x.n), "r1", ev)
	if _, err := x.log.Append(x.ctx, streams.SubjectOf("r1", "w", ev), env, -1); err != nil {
		x.t.Fatal(err)
	}
}

func (x *followFixture) tokens(offset int, toks ...string) {
	x.append(events.TokensGenerated{RequestID: "r1", Attempt: 0, Offset: offset, Tokens: toks})
}

func textIs(want string) func(p *projections.Request) bool {
	return func(p *projections.Request) bool { return p.Text() == want }
}

// TestFollowerHistoryThenLive: a follower reads what the log holds, then
// applies what is appended live, and knows the events subject's sequence.
func TestFollowerHistoryThenLive(t *testing.T) {
	x, s := newFollowFixture(t)
	x.append(events.RequestAccepted{RequestID: "r1", Model: "m", MaxTokens: 10})
	x.append(events.RequestRouted{RequestID: "r1", WorkerID: "w"})
	x.tokens(0, "a ")
	f, err := follow(x.ctx, s.Connect(t), s.JetStream(t), 1, "r1", true)
	if err != nil {
		t.Fatal(err)
	}
	defer f.stop()
	f.view(func(p *projections.Request) {
		if p.Text() != "a " || p.Status != projections.StatusRunning {
			t.Errorf("after history: text %q status %s, want %q running", p.Text(), p.Status, "a ")
		}
	})
	if got := f.eventsSeq(); got != 2 {
		t.Errorf("eventsSeq = %d, want 2 (the routed event)", got)
	}
	x.tokens(1, "b ")
	if err := f.waitFor(x.ctx, textIs("a b ")); err != nil {
		t.Fatalf("live tokens never arrived: %v", err)
	}
}

// TestFollowerFillsGap: a message missed while the connection was cut is
// read from the log as soon as the next one reveals the gap (no reconnect
// hook here: the follower's own gap detection does it).
func TestFollowerFillsGap(t *testing.T) {
	x, s := newFollowFixture(t)
	p := natstest.NewProxy(t, s.Addr().String())
	reconnected := make(chan struct{}, 1)
	nc, err := nats.Connect(p.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond),
		nats.ReconnectHandler(func(*nats.Conn) { reconnected <- struct{}{} }))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	x.append(events.RequestAccepted{RequestID: "r1", Model: "m", MaxTokens: 10})
	x.append(events.RequestRouted{RequestID: "r1", WorkerID: "w"})
	f, err := follow(x.ctx, nc, s.JetStream(t), 1, "r1", true)
	if err != nil {
		t.Fatal(err)
	}
	defer f.stop()
	p.Cut()
	x.tokens(0, "a ") // never delivered live
	p.Restore()
	select {
	case <-reconnected:
	case <-x.ctx.Done():
		t.Fatal("no reconnect")
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	x.tokens(1, "b ")
	if err := f.waitFor(x.ctx, textIs("a b ")); err != nil {
		f.view(func(p *projections.Request) { t.Fatalf("text %q, want %q: %v", p.Text(), "a b ", err) })
	}
}

// TestFollowerConcurrentCatchUps: catch-ups asked from many goroutines while
// tokens arrive are all answered, and every token is applied once, in order.
func TestFollowerConcurrentCatchUps(t *testing.T) {
	x, s := newFollowFixture(t)
	x.append(events.RequestAccepted{RequestID: "r1", Model: "m", MaxTokens: 100})
	x.append(events.RequestRouted{RequestID: "r1", WorkerID: "w"})
	f, err := follow(x.ctx, s.Connect(t), s.JetStream(t), 1, "r1", true)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 5 {
				if err := f.catchUp(x.ctx); err != nil {
					t.Errorf("catch up: %v", err)
					return
				}
			}
		})
	}
	want := ""
	for i := range 20 {
		x.tokens(i, "t ")
		want += "t "
	}
	wg.Wait()
	if err := f.waitFor(x.ctx, textIs(want)); err != nil {
		f.view(func(p *projections.Request) { t.Fatalf("text %q, want %q: %v", p.Text(), want, err) })
	}
	f.stop()
	if err := f.catchUp(x.ctx); !errors.Is(err, errStopped) {
		t.Errorf("catch up after stop = %v, want errStopped", err)
	}
}

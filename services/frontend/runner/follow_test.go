package runner

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/internal/natstest"
	"github.com/baton-dev/baton/internal/waitfor"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/services/retention"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
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

// start appends r1's acceptance, for at most maxTokens, and its routing
// to worker w.
func (x *followFixture) start(maxTokens int) {
	x.t.Helper()
	x.append(events.RequestAccepted{RequestID: "r1", Model: "m", MaxTokens: maxTokens})
	x.append(events.RequestRouted{RequestID: "r1", WorkerID: "w"})
}

// follow follows r1 from its history on a connection of its own to s.
func (x *followFixture) follow(s *natstest.Server) *follower {
	x.t.Helper()
	f, err := follow(x.ctx, liveOn(x.t, s.Connect(x.t)), s.JetStream(x.t), 1, "r1", true)
	if err != nil {
		x.t.Fatal(err)
	}
	return f
}

func textIs(want string) func(p *projections.Request) bool {
	return func(p *projections.Request) bool { return p.Text() == want }
}

// TestFollowerHistoryThenLive: a follower reads what the log holds, then
// applies what is appended live, and knows the events subject's sequence.
func TestFollowerHistoryThenLive(t *testing.T) {
	x, s := newFollowFixture(t)
	x.start(10)
	x.tokens(0, "a ")
	f := x.follow(s)
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
	x.start(10)
	f, err := follow(x.ctx, liveOn(t, nc), s.JetStream(t), 1, "r1", true)
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
	x.start(100)
	f := x.follow(s)
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

// liveOn is the live subscription of a test's connection.
func liveOn(t *testing.T, nc *nats.Conn) *live {
	t.Helper()
	l, err := newLive(nc, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil { // the server has the interest before the test appends
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.close() })
	return l
}

// TestLiveDispatchesByRequest: one subscription feeds the followers of
// several requests, each only its own messages; a stopped follower gets
// nothing more, and a second follower of the same request gets everything.
func TestLiveDispatchesByRequest(t *testing.T) {
	x, s := newFollowFixture(t)
	lv := liveOn(t, s.Connect(t))
	appendTo := func(id string, n int, ev events.Event) {
		t.Helper()
		env := x.log.Envelope(events.ID(id, n), id, ev)
		if _, err := x.log.Append(x.ctx, streams.SubjectOf(id, "w", ev), env, -1); err != nil {
			t.Fatal(err)
		}
	}
	fs := map[string]*follower{}
	for _, id := range []string{"a", "b"} {
		appendTo(id, 0, events.RequestAccepted{RequestID: id, Model: "m", MaxTokens: 10})
		appendTo(id, -1, events.RequestRouted{RequestID: id, WorkerID: "w"})
		f, err := follow(x.ctx, lv, s.JetStream(t), 1, id, true)
		if err != nil {
			t.Fatal(err)
		}
		defer f.stop()
		fs[id] = f
	}
	second, err := follow(x.ctx, lv, s.JetStream(t), 1, "a", true)
	if err != nil {
		t.Fatal(err)
	}
	for i, id := range []string{"a", "b", "a"} {
		appendTo(id, i+1, events.TokensGenerated{RequestID: id, Offset: map[int]int{0: 0, 1: 0, 2: 1}[i], Tokens: []string{id + " "}})
	}
	for _, f := range []*follower{fs["a"], second} {
		if err := f.waitFor(x.ctx, textIs("a a ")); err != nil {
			f.view(func(p *projections.Request) { t.Fatalf("follower of a: text %q: %v", p.Text(), err) })
		}
	}
	if err := fs["b"].waitFor(x.ctx, textIs("b ")); err != nil {
		fs["b"].view(func(p *projections.Request) { t.Fatalf("follower of b: text %q: %v", p.Text(), err) })
	}
	second.stop()
	lv.mu.RLock()
	got := len(lv.followers["a"])
	lv.mu.RUnlock()
	if got != 1 {
		t.Errorf("%d followers of a after one stopped, want 1", got)
	}
}

// TestFollowerRunEnds: the goroutine that reads the log runs while a
// catch-up is in hand and ends after it; a live message that follows no gap
// is applied without it.
func TestFollowerRunEnds(t *testing.T) {
	x, s := newFollowFixture(t)
	x.start(10)
	f := x.follow(s)
	defer f.stop()
	ended := make(chan struct{})
	go func() {
		f.runs.Wait() // nothing else is queued: no poke adds to it meanwhile
		close(ended)
	}()
	select {
	case <-ended:
	case <-x.ctx.Done():
		t.Fatal("run never ended after the history was read")
	}
	x.tokens(0, "a ")
	if err := f.waitFor(x.ctx, textIs("a ")); err != nil {
		t.Fatalf("the live token never arrived: %v", err)
	}
	f.qmu.Lock()
	running := f.running
	f.qmu.Unlock()
	if running {
		t.Error("run started for a live message that follows no gap")
	}
}

func TestSubjectSeqs(t *testing.T) {
	var s subjectSeqs
	for _, step := range []struct {
		set     string
		seq     uint64
		subject string
		want    uint64
	}{
		{subject: "a", want: 0},
		{set: "a", seq: 3, subject: "a", want: 3},
		{set: "b", seq: 5, subject: "a", want: 3},
		{subject: "b", want: 5},
		{set: "a", seq: 7, subject: "a", want: 7},
		{subject: "c", want: 0},
	} {
		if step.set != "" {
			s.set(step.set, step.seq)
		}
		if got := s.get(step.subject); got != step.want {
			t.Errorf("after set(%q, %d): get(%q) = %d, want %d", step.set, step.seq, step.subject, got, step.want)
		}
	}
	if got, want := len(s), 2; got != want {
		t.Errorf("got %d subjects, want %d", got, want)
	}
}

// TestFollowerReadsAnEndFromTheEndsPlace: a follower that does not own the
// request learns its end when the owner stores it in the ends place (the
// log had no room for it): the end is applied after what the owner had
// folded, and a token the log stored later is not read.
func TestFollowerReadsAnEndFromTheEndsPlace(t *testing.T) {
	x, s := newFollowFixture(t)
	x.start(10)
	x.tokens(0, "a ")
	f := x.follow(s)
	defer f.stop()
	x.tokens(1, "b ") // stored after the owner's decision: not read
	if err := f.waitFor(x.ctx, textIs("a b ")); err != nil {
		t.Fatal(err)
	}
	failed := events.RequestFailed{RequestID: "r1", Code: "log_full", Status: 503, Offset: 1}
	end := events.RequestEnded{RequestID: "r1", Frontend: "fe-1", Through: 3, Failed: &failed}
	if ok, err := streams.StoreEnd(x.ctx, x.log, "r1.ended", end, 1); !ok || err != nil {
		t.Fatalf("store the end: %v %v", ok, err)
	}
	if err := f.waitFor(x.ctx, func(p *projections.Request) bool { return p.Status == projections.StatusFailed }); err != nil {
		t.Fatalf("the end never reached the follower: %v", err)
	}
	// A fresh read of the log alone folds the owner's view: one token.
	g := x.follow(s)
	defer g.stop()
	g.view(func(p *projections.Request) {
		if p.Status != projections.StatusFailed || p.Text() != "a " || p.Failure.Code != "log_full" {
			t.Errorf("a fresh follower folds %s %q %+v, want failed after \"a \" with log_full", p.Status, p.Text(), p.Failure)
		}
	})
}

// TestFollowerQueueBoundedInBytes: while its reader is behind, a follower
// queues live messages up to maxQueuedBytes of bodies, not 4096 of any
// size: 1 MiB messages (a worker credential's junk on an attempt subject)
// past the bound are dropped and the log marked to be read instead.
func TestFollowerQueueBoundedInBytes(t *testing.T) {
	f := &follower{busy: true, halted: true} // run is behind, and not started again
	junk := make([]byte, 1<<20)
	for range 64 {
		f.onLive(&nats.Msg{Subject: "baton.requests.0.r1.tokens.0.w", Data: junk})
	}
	f.qmu.Lock()
	defer f.qmu.Unlock()
	held := 0
	for _, m := range f.queue {
		held += len(m.m.Data)
	}
	if held > maxQueuedBytes || held != f.queued || !f.overflow {
		t.Errorf("queued %d messages, %d bytes (counted %d), overflow %v: want at most %d bytes, the rest dropped for a read of the log",
			len(f.queue), held, f.queued, f.overflow, maxQueuedBytes)
	}
}

// TestFollowerReadsWhatLiveDropped: the live subscription's delivery is
// held up (a large message's suspect hook, here blocked) while more
// messages arrive than it may hold, so nats.go drops them, the request's
// completion among them, and no later message of its subject shows the
// gap. watchDrops sees the drops and has the follower read the log: it
// ends. Without it the follower waited for ever, and so did its client
// (TestQuarantinedWorkerLargeJunkOnOwnAttempt on a loaded machine, where
// 1 MiB junk on the request's own slot filled the subscription).
func TestFollowerReadsWhatLiveDropped(t *testing.T) {
	x, s := newFollowFixture(t)
	x.start(10)
	nc := s.Connect(t)
	lv := liveOn(t, nc)
	held, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	lv.suspect = func(string, string, uint64, int) {
		once.Do(func() { close(held); <-release })
	}
	f, err := follow(x.ctx, lv, s.JetStream(t), 1, "r1", true)
	if err != nil {
		t.Fatal(err)
	}
	defer f.stop()
	sub := lv.slots[streams.Slot("r1")].sub
	if err := sub.SetPendingLimits(2, -1); err != nil { // two messages held at most, the one delivered counted
		t.Fatal(err)
	}
	x.tokens(0, strings.Repeat("x", retention.SuspectSize)) // holds the delivery up
	<-held
	for i := 1; i < 9; i++ {
		x.tokens(i, "t ") // two held, the rest dropped
	}
	x.append(events.RequestCompleted{RequestID: "r1", FinishReason: "length", CompletionTokens: 9}) // dropped
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	// All ten reached the subscription: the one in the callback and one
	// more held, the eight after them dropped, the completion last.
	waitfor.Poll(t, "the completion dropped", func() bool {
		n, _ := sub.Dropped()
		return n == 8
	})
	close(release)
	ctx, cancel := context.WithCancel(x.ctx)
	defer cancel()
	go lv.watchDrops(ctx)
	if err := f.waitFor(x.ctx, func(p *projections.Request) bool { return p.Status.Terminal() }); err != nil {
		f.view(func(p *projections.Request) {
			t.Fatalf("status %v after the drops, text of %d bytes: %v", p.Status, len(p.Text()), err)
		})
	}
}

// TestFollowerSeesRequestGone: a follower that gets nothing live (its
// connection closed) reads nothing new while the request is in the log:
// no error. It misses the request's end; an eviction then purges the
// request, and the end is lost to it: its catch-up fails with errGone, so
// that its readers end the request rather than wait for ever.
func TestFollowerSeesRequestGone(t *testing.T) {
	x, s := newFollowFixture(t)
	x.start(10)
	x.tokens(0, "a ")
	nc := s.Connect(t)
	f, err := follow(x.ctx, liveOn(t, nc), s.JetStream(t), 1, "r1", true)
	if err != nil {
		t.Fatal(err)
	}
	defer f.stop()
	nc.Close()
	if err := f.catchUp(x.ctx); err != nil {
		t.Fatalf("catch-up with nothing new: %v", err)
	}
	x.append(events.RequestCompleted{RequestID: "r1", FinishReason: "stop", CompletionTokens: 1})
	str, err := s.JetStream(t).Stream(x.ctx, streams.RequestsStream)
	if err != nil {
		t.Fatal(err)
	}
	if err := str.Purge(x.ctx, jetstream.WithPurgeSubject(streams.RequestAll("r1"))); err != nil {
		t.Fatal(err)
	}
	if err := f.catchUp(x.ctx); !errors.Is(err, errGone) {
		t.Errorf("catch-up of an evicted request whose end was missed: %v, want errGone", err)
	}
}

package runner

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/streams"
	"golang.org/x/sync/errgroup"
)

// Request is a request this frontend follows: its follower, shared by every
// client stream of the request here, and, while this frontend owns it, the
// runner that carries out its migration decisions. A holder of a Request
// holds one reference to it and gives it back with Release.
type Request struct {
	requests   *registry // the registry that holds it
	id         string
	f          *follower
	dispatched chan struct{} // closed once the first dispatch settled (accepted or failed)
	settleOnce sync.Once
	acceptedAt time.Time // when its accepted event was stored, if here
	// early is the first dispatch, sent with the accepted event's append
	// (Runner.dispatchEarly); the runner's first dispatch takes it.
	early *heldDispatch
	// What Runner.waitForPlace keeps (only t's runner uses it): how many
	// times it waited, and when it first found the pool busy.
	busyWaits int
	busySince time.Time
	// cons is what t's runner copied of its batched attempts to the
	// partition (consolidate), per attempt.
	cons []consolidated

	// Guarded by requests.mu.
	refs          int       // holders: clients, the runner, lookups
	running       bool      // a runner runs for it here
	clients       int       // client responses being written
	detachedSince time.Time // when the last client left (zero while one is attached)
}

// ID is the request's (internal) id.
func (t *Request) ID() string { return t.id }

// View runs fn on the request's projection under its lock; fn must not keep
// references or block.
func (t *Request) View(fn func(p *projections.Request)) { t.f.view(fn) }

// CatchUp reads whatever the log holds of the request past what was
// applied (its live messages may still be on their way): a View after it
// shows every event stored before CatchUp began, wherever it was written.
func (t *Request) CatchUp(ctx context.Context) error { return t.f.catchUp(ctx) }

// Listen pokes ch (give it a capacity of 1) whenever an event of the request
// is applied, until stop is called.
func (t *Request) Listen(ch chan struct{}) (stop func()) { return t.f.changed.Listen(ch) }

// Dispatched is closed once the first dispatch of a request accepted here
// settled (a worker accepted it, or the request failed), and at once for a
// request attached to: until then "no worker" can still be a plain 503.
func (t *Request) Dispatched() <-chan struct{} { return t.dispatched }

// settle marks the first dispatch settled.
func (t *Request) settle() { t.settleOnce.Do(func() { close(t.dispatched) }) }

// takeEarly returns the dispatch sent with t's accepted event, once.
// Only t's runner calls it.
func (t *Request) takeEarly() *heldDispatch {
	h := t.early
	t.early = nil
	return h
}

// takeEarlyRouted is takeEarly of a dispatch whose routed decision was
// stored in the accepted event (nil for any other).
func (t *Request) takeEarlyRouted() *heldDispatch {
	if t.early == nil || !t.early.stored {
		return nil
	}
	return t.takeEarly()
}

// everyoneReadsAcceptedRoute reports whether every live frontend folds the
// routed decision stored in an accepted event (events.RequestAccepted.Route).
func (rn *Runner) everyoneReadsAcceptedRoute() bool {
	return everyFrontend(rn.fleet, func(f projections.Frontend) bool { return f.ReadsAcceptedRoute })
}

// everyFrontend reports whether every live frontend's presence says ok.
func everyFrontend(fl Fleet, ok func(projections.Frontend) bool) bool {
	return !slices.ContainsFunc(fl.Frontends(), func(f projections.Frontend) bool { return !ok(f) })
}

// ErrExists means a request with that id is already in the log.
var ErrExists = errors.New("runner: request exists")

// Release drops the caller's reference to t.
func (t *Request) Release() { t.requests.release(t) }

// Accept appends a new request to the log and starts running it. It
// returns ErrExists if the id is taken. The caller holds one reference.
func (rn *Runner) Accept(ctx context.Context, acc events.RequestAccepted) (*Request, error) {
	if err := rn.lifecycle.admit(acc.RequestID, nil); err != nil {
		return nil, err
	}
	env := rn.events.Envelope(events.ID(acc.RequestID, "accepted"), acc.RequestID, acc)
	// The dispatch goes first: nothing of it is stored before its routed
	// decision, which follows the accepted event or is stored in it, so
	// the follower is registered long before.
	early := rn.dispatchEarly(context.WithoutCancel(ctx), env)
	if early != nil && rn.cfg.RouteInAccepted && rn.everyoneReadsAcceptedRoute() {
		// Its routed decision is stored with the acceptance: the worker
		// is told after one acknowledgement, not two.
		route := routedOf(acc.RequestID, early.w, early.d)
		acc.Route = &route
		early.stored = true
		env = rn.events.Envelope(env.ID, acc.RequestID, acc)
	}
	f, err := follow(ctx, rn.live, rn.js, rn.parts, acc.RequestID, false)
	if err != nil {
		rn.dispatcher.abandon(early)
		return nil, err
	}
	appending := time.Now()
	seq, err := rn.events.Append(ctx, streams.RequestEvents(acc.RequestID), env, 0)
	appended := time.Now()
	if err != nil {
		rn.dispatcher.abandon(early)
		f.stop()
		if errors.Is(err, streams.ErrConflict) {
			return nil, ErrExists
		}
		return nil, rn.lifecycle.admit(acc.RequestID, err)
	}
	t := rn.requests.newRequest(acc.RequestID, f)
	t.acceptedAt, t.early = appended, early
	t.noteAccepted(appended.Sub(appending))
	// Fold the accepted event now: the runner must not wait for the
	// republished copy to know what to dispatch.
	env.Seq, env.Stored = seq, streams.RequestEvents(acc.RequestID)
	f.apply(env)
	rn.requests.register(t)
	rn.startRunner(t)
	return t, nil
}

// AcceptParent appends parent, a request whose n > 1 choices run as child
// requests (Accept each, then Link it), without following it. It returns
// ErrExists if the id is taken.
func (rn *Runner) AcceptParent(ctx context.Context, parent events.RequestAccepted) error {
	if err := rn.lifecycle.admit(parent.RequestID, nil); err != nil {
		return err
	}
	env := rn.events.Envelope(events.ID(parent.RequestID, "accepted"), parent.RequestID, parent)
	if _, err := rn.events.Append(ctx, streams.RequestEvents(parent.RequestID), env, 0); err != nil {
		if errors.Is(err, streams.ErrConflict) {
			return ErrExists
		}
		return rn.lifecycle.admit(parent.RequestID, err)
	}
	return nil
}

// Link records child under parent, so cancelling the parent cancels it;
// if the parent was cancelled already, the child is cancelled at once.
func (rn *Runner) Link(ctx context.Context, parent, child string) {
	ev := events.ChildAdded{RequestID: parent, ChildID: child}
	env := rn.events.Envelope(events.ID(parent, "child", child), parent, ev)
	if _, err := rn.events.Append(ctx, streams.RequestEvents(parent), env, -1); err != nil {
		rn.log.Warn("link child request", "request_id", child, "parent_id", parent, "err", err)
		return
	}
	if p, err := rn.Load(ctx, parent); err == nil && p.Cancel != nil {
		_ = rn.Cancel(ctx, child, p.Cancel.Mode, "parent cancelled", "")
	}
}

// startRunner has runRunners start the runner of t, unless one runs
// already, holding a reference while it runs.
func (rn *Runner) startRunner(t *Request) {
	if !rn.requests.startRunning(t) {
		return
	}
	select {
	case rn.requests.launch <- t:
	case <-rn.requests.stopped:
		t.settle() // nobody will dispatch it here
		rn.dispatcher.abandon(t.takeEarly())
		rn.requests.runnerEnded(t)
	}
}

// Claim asks the runtime to take t over if its owner is gone (and to run it
// if this frontend owns it). HTTP handlers call it; the work, which may
// append to the log, is done on the runtime's goroutines.
func (t *Request) Claim() {
	r := t.requests
	r.hold(t)
	select {
	case r.claims <- t:
	case <-r.stopped:
		r.release(t)
	}
}

// runRunners starts the runners startRunner asks for and the takeovers
// Claim asks for, on g, until ctx is done.
func (rn *Runner) runRunners(ctx context.Context, g *errgroup.Group) {
	defer close(rn.requests.stopped)
	for {
		select {
		case <-ctx.Done():
			return
		case t := <-rn.requests.launch:
			g.Go(func() error {
				defer rn.requests.runnerEnded(t)
				defer rn.adopter.list(t)() // adopted by another frontend if this one dies
				rn.run(ctx, t)
				return nil
			})
		case t := <-rn.requests.claims:
			g.Go(func() error {
				defer rn.requests.release(t)
				rn.ensureOwner(ctx, t)
				return nil
			})
		}
	}
}

// ensureOwner makes this frontend the owner of t if its owner is gone (its
// presence key expired or was deleted), and runs it if it owns it. The
// attached event is appended with the expected sequence, so of two frontends
// racing to take a request over, one wins and the other follows.
func (rn *Runner) ensureOwner(ctx context.Context, t *Request) {
	for range 3 {
		var owner string
		var offset int
		t.f.view(func(p *projections.Request) { owner, offset = p.Owner, p.Len() })
		switch {
		case t.f.settled():
			return
		case owner == rn.id:
			rn.startRunner(t)
			return
		case rn.fleet.FrontendAlive(owner):
			return // its owner is alive and runs it
		}
		seq := t.f.eventsSeq()
		ev := events.RequestAttached{RequestID: t.id, Frontend: rn.id, Offset: offset}
		ok, err := rn.decisions.append(ctx, t, events.ID(t.id, "attached", rn.id, seq), ev)
		if err != nil {
			rn.log.Warn("take over request", "request_id", t.id, "err", err)
			return
		}
		if ok {
			rn.log.Info("took over request", "request_id", t.id, "previous_owner", owner)
			rn.startRunner(t)
			return
		}
	}
}

// Enter and Leave count the clients of t; a request left without clients
// is cancelled after the detach timeout by its runner.
func (t *Request) Enter() {
	t.requests.mu.Lock()
	t.clients++
	t.detachedSince = time.Time{}
	t.requests.mu.Unlock()
}

// Leave ends a client of t (see Enter).
func (t *Request) Leave() {
	t.requests.mu.Lock()
	t.clients--
	if t.clients == 0 {
		t.detachedSince = time.Now()
	}
	t.requests.mu.Unlock()
	t.f.decided.Notify() // wake the runner to start its detach timer
}

// carryDetach cancels a request that no client came back to.
func (rn *Runner) carryDetach(ctx context.Context, t *Request) {
	if err := rn.Cancel(ctx, t.id, events.CancelKill, "detached: no client for "+rn.cfg.DetachTimeout.String(), ""); err != nil {
		rn.log.Warn("cancel detached request", "request_id", t.id, "err", err)
		return
	}
	rn.log.Info("cancelled detached request", "request_id", t.id)
}

// Attach follows an existing request (from this frontend's cache or the
// log). It returns streams.ErrNotFound for an unknown id. The caller holds one
// reference.
func (rn *Runner) Attach(ctx context.Context, id string) (*Request, error) {
	if t, ok := rn.requests.acquire(id); ok {
		return t, nil
	}
	f, err := follow(ctx, rn.live, rn.js, rn.parts, id, true)
	if err != nil {
		return nil, err
	}
	known := false
	f.view(func(p *projections.Request) { known = p.Known() })
	if !known {
		f.stop()
		return nil, fmt.Errorf("%w: %s", streams.ErrNotFound, id)
	}
	t := rn.requests.newRequest(id, f)
	t.settle()
	if existing, ok := rn.requests.registerNew(t); !ok { // lost a race with another client
		f.stop()
		return existing, nil
	}
	return t, nil
}

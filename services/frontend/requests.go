package frontend

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/streams"
	"golang.org/x/sync/errgroup"
)

// errExists means a request with that id is already in the log.
var errExists = errors.New("frontend: request exists")

// register adds t to the requests this frontend follows, with one reference
// held by the caller. The follower stops when the last reference is released.
func (fe *Frontend) register(t *tracked) {
	fe.mu.Lock()
	defer fe.mu.Unlock()
	t.refs = 1
	fe.requests[t.id] = t
}

// acquire returns the tracked request id with a new reference, if followed here.
func (fe *Frontend) acquire(id string) (*tracked, bool) {
	fe.mu.Lock()
	defer fe.mu.Unlock()
	t, ok := fe.requests[id]
	if ok {
		t.refs++
	}
	return t, ok
}

// release drops a reference to t.
func (fe *Frontend) release(t *tracked) {
	fe.mu.Lock()
	t.refs--
	last := t.refs == 0
	if last {
		delete(fe.requests, t.id)
	}
	fe.mu.Unlock()
	if last {
		t.f.stop()
	}
}

// start appends a new request to the log and starts supervising it. It
// returns errExists if the id is taken. The caller holds one reference.
func (fe *Frontend) start(ctx context.Context, acc events.RequestAccepted) (*tracked, error) {
	if err := fe.admitLog(acc.RequestID, nil); err != nil {
		return nil, err
	}
	f, err := follow(ctx, fe.live, fe.js, fe.parts, acc.RequestID, false)
	if err != nil {
		return nil, err
	}
	env := fe.events.Envelope(events.ID(acc.RequestID, "accepted"), acc.RequestID, acc)
	seq, err := fe.events.Append(ctx, streams.RequestEvents(acc.RequestID), env, 0)
	if err != nil {
		f.stop()
		if errors.Is(err, streams.ErrConflict) {
			return nil, errExists
		}
		return nil, fe.admitLog(acc.RequestID, err)
	}
	t := &tracked{id: acc.RequestID, f: f, dispatched: make(chan struct{})}
	// Fold the accepted event now: the supervisor must not wait for the
	// republished copy to know what to dispatch.
	env.Seq, env.Stored = seq, streams.RequestEvents(acc.RequestID)
	f.apply(env)
	fe.register(t)
	fe.acquireSupervisor(t)
	return t, nil
}

// acquireSupervisor has Run start the runner of t, unless one runs
// already, holding a reference while it runs.
func (fe *Frontend) acquireSupervisor(t *tracked) {
	fe.mu.Lock()
	if t.supervising {
		fe.mu.Unlock()
		return
	}
	t.supervising = true
	t.refs++
	fe.mu.Unlock()
	select {
	case fe.launch <- t:
	case <-fe.stopped:
		t.settle() // nobody will dispatch it here
		fe.supervised(t)
	}
}

// claim asks Run to take t over if its owner is gone (and to run it if this
// frontend owns it). HTTP handlers call it; the work, which may append to
// the log, is done on Run's goroutines.
func (fe *Frontend) claim(t *tracked) {
	fe.mu.Lock()
	t.refs++
	fe.mu.Unlock()
	select {
	case fe.claims <- t:
	case <-fe.stopped:
		fe.release(t)
	}
}

// runSupervisors starts the runners acquireSupervisor asks for and the
// takeovers claim asks for, on g, until ctx is done.
func (fe *Frontend) runSupervisors(ctx context.Context, g *errgroup.Group) {
	defer close(fe.stopped)
	for {
		select {
		case <-ctx.Done():
			return
		case t := <-fe.launch:
			g.Go(func() error {
				defer fe.supervised(t)
				fe.supervise(ctx, t)
				return nil
			})
		case t := <-fe.claims:
			g.Go(func() error {
				defer fe.release(t)
				fe.ensureOwner(ctx, t)
				return nil
			})
		}
	}
}

// supervised records that t's runner ended and drops its reference.
func (fe *Frontend) supervised(t *tracked) {
	fe.mu.Lock()
	t.supervising = false
	fe.mu.Unlock()
	fe.release(t)
}

// ensureOwner makes this frontend the owner of t if its owner is gone (its
// presence key expired or was deleted), and supervises it if it owns it. The
// attached event is appended with the expected sequence, so of two frontends
// racing to take a request over, one wins and the other follows.
func (fe *Frontend) ensureOwner(ctx context.Context, t *tracked) {
	for range 3 {
		var owner string
		var terminal bool
		var offset int
		t.f.view(func(p *projections.Request) { owner, terminal, offset = p.Owner, p.Status.Terminal(), p.Len() })
		switch {
		case terminal:
			return
		case owner == fe.id:
			fe.acquireSupervisor(t)
			return
		case fe.presence.isAlive(owner):
			return // its owner is alive and supervises it
		}
		seq := t.f.eventsSeq()
		ev := events.RequestAttached{RequestID: t.id, Frontend: fe.id, Offset: offset}
		ok, err := fe.decide(ctx, t, events.ID(t.id, "attached", fe.id, seq), ev)
		if err != nil {
			fe.log.Warn("take over request", "request_id", t.id, "err", err)
			return
		}
		if ok {
			fe.log.Info("took over request", "request_id", t.id, "previous_owner", owner)
			fe.acquireSupervisor(t)
			return
		}
	}
}

// clientEnter and clientLeave count the clients of t; a request left without
// clients is cancelled after the detach timeout by its supervisor.
func (fe *Frontend) clientEnter(t *tracked) {
	fe.mu.Lock()
	t.clients++
	t.detachedSince = time.Time{}
	fe.mu.Unlock()
}

func (fe *Frontend) clientLeave(t *tracked) {
	fe.mu.Lock()
	t.clients--
	if t.clients == 0 {
		t.detachedSince = time.Now()
	}
	fe.mu.Unlock()
	t.f.decided.Notify() // wake the supervisor to start its detach timer
}

func (fe *Frontend) detachedSince(t *tracked) time.Time {
	fe.mu.Lock()
	defer fe.mu.Unlock()
	return t.detachedSince
}

// detach cancels a request that no client came back to.
func (fe *Frontend) detach(ctx context.Context, t *tracked) {
	if err := fe.cancelTree(ctx, t.id, events.CancelKill, "detached: no client for "+fe.cfg.DetachTimeout.String()); err != nil {
		fe.log.Warn("cancel detached request", "request_id", t.id, "err", err)
		return
	}
	fe.log.Info("cancelled detached request", "request_id", t.id)
}

// attach follows an existing request (from this frontend's cache or the
// log). It returns streams.ErrNotFound for an unknown id. The caller holds one
// reference.
func (fe *Frontend) attach(ctx context.Context, id string) (*tracked, error) {
	if t, ok := fe.acquire(id); ok {
		return t, nil
	}
	f, err := follow(ctx, fe.live, fe.js, fe.parts, id, true)
	if err != nil {
		return nil, err
	}
	known := false
	f.view(func(p *projections.Request) { known = p.Known() })
	if !known {
		f.stop()
		return nil, fmt.Errorf("%w: %s", streams.ErrNotFound, id)
	}
	t := &tracked{id: id, f: f, dispatched: make(chan struct{})}
	t.settle()
	fe.mu.Lock()
	if existing, ok := fe.requests[id]; ok { // lost a race with another client
		existing.refs++
		fe.mu.Unlock()
		f.stop()
		return existing, nil
	}
	t.refs = 1
	fe.requests[id] = t
	fe.mu.Unlock()
	return t, nil
}

// cancel appends a cancel command for request id. It is idempotent.
func (fe *Frontend) cancel(ctx context.Context, id, mode, reason, tenant string) error {
	ev := events.RequestCancelled{RequestID: id, Mode: mode, Reason: reason, Tenant: tenant}
	env := fe.events.Envelope(events.ID(id, "cancelled", mode), id, ev)
	_, err := fe.events.Append(ctx, streams.RequestEvents(id), env, -1)
	return err
}

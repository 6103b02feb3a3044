package frontend

import (
	"context"
	"errors"
	"fmt"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/streams"
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
	f, err := follow(ctx, fe.nc, fe.js, acc.RequestID, false)
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
		return nil, err
	}
	t := &tracked{id: acc.RequestID, f: f, dispatched: make(chan struct{}), done: make(chan struct{})}
	// Fold the accepted event now: the supervisor must not wait for the
	// republished copy to know what to dispatch.
	env.Seq = seq
	f.mu.Lock()
	f.applyLocked(env)
	f.mu.Unlock()
	fe.register(t)
	fe.acquireSupervisor(t)
	return t, nil
}

// acquireSupervisor runs the supervisor of t, holding a reference while it runs.
func (fe *Frontend) acquireSupervisor(t *tracked) {
	fe.mu.Lock()
	t.refs++
	fe.mu.Unlock()
	fe.wg.Add(1)
	go func() {
		defer fe.wg.Done()
		defer fe.release(t)
		fe.supervise(fe.ctx, t)
	}()
}

// attach follows an existing request (from this frontend's cache or the
// log). It returns streams.ErrNotFound for an unknown id. The caller holds one
// reference.
func (fe *Frontend) attach(ctx context.Context, id string) (*tracked, error) {
	if t, ok := fe.acquire(id); ok {
		return t, nil
	}
	f, err := follow(ctx, fe.nc, fe.js, id, true)
	if err != nil {
		return nil, err
	}
	known := false
	f.view(func(p *projections.Request) { known = p.Known() })
	if !known {
		f.stop()
		return nil, fmt.Errorf("%w: %s", streams.ErrNotFound, id)
	}
	t := &tracked{id: id, f: f, dispatched: make(chan struct{}), done: make(chan struct{})}
	close(t.dispatched)
	close(t.done)
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
func (fe *Frontend) cancel(ctx context.Context, id, mode, reason string) error {
	ev := events.RequestCancelled{RequestID: id, Mode: mode, Reason: reason}
	env := fe.events.Envelope(events.ID(id, "cancelled", mode), id, ev)
	_, err := fe.events.Append(ctx, streams.RequestEvents(id), env, -1)
	return err
}

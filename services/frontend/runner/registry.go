package runner

import (
	"sync"
	"time"
)

// registry is the requests this frontend follows, with their reference and
// client counts, and the hand-off of runners and takeovers to runRunners.
// mu guards the map and the fields of each Request marked so; it is safe
// for concurrent use.
type registry struct {
	mu       sync.Mutex
	requests map[string]*Request

	launch  chan *Request // requests whose runner runRunners should start
	claims  chan *Request // requests runRunners should take over if their owner is gone
	stopped chan struct{} // closed when runRunners no longer starts runners
}

func newRegistry() *registry {
	return &registry{requests: map[string]*Request{},
		launch: make(chan *Request), claims: make(chan *Request), stopped: make(chan struct{})}
}

// newRequest is request id, followed by f, not registered yet.
func (r *registry) newRequest(id string, f *follower) *Request {
	return &Request{requests: r, id: id, f: f, dispatched: make(chan struct{})}
}

// register adds t to the requests this frontend follows, with one reference
// held by the caller. The follower stops when the last reference is released.
func (r *registry) register(t *Request) {
	r.mu.Lock()
	defer r.mu.Unlock()
	t.refs = 1
	r.requests[t.id] = t
}

// registerNew registers t as register does unless a request of its id is
// followed already: then it returns that one with a new reference, and false.
func (r *registry) registerNew(t *Request) (*Request, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if existing, ok := r.requests[t.id]; ok {
		existing.refs++
		return existing, false
	}
	t.refs = 1
	r.requests[t.id] = t
	return t, true
}

// acquire returns the tracked request id with a new reference, if followed here.
func (r *registry) acquire(id string) (*Request, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.requests[id]
	if ok {
		t.refs++
	}
	return t, ok
}

// hold takes a new reference to t, which the caller holds one of.
func (r *registry) hold(t *Request) {
	r.mu.Lock()
	t.refs++
	r.mu.Unlock()
}

// release drops a reference to t.
func (r *registry) release(t *Request) {
	r.mu.Lock()
	t.refs--
	last := t.refs == 0
	if last {
		delete(r.requests, t.id)
	}
	r.mu.Unlock()
	if last {
		t.f.stop()
	}
}

// followed returns every followed request, each with a new reference.
func (r *registry) followed() []*Request {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*Request, 0, len(r.requests))
	for _, t := range r.requests {
		t.refs++
		out = append(out, t)
	}
	return out
}

// startRunning marks t's runner running, with a reference for it, and
// reports whether it was not running already.
func (r *registry) startRunning(t *Request) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if t.running {
		return false
	}
	t.running = true
	t.refs++
	return true
}

// runnerEnded records that t's runner ended and drops its reference.
func (r *registry) runnerEnded(t *Request) {
	r.mu.Lock()
	t.running = false
	r.mu.Unlock()
	r.release(t)
}

func (r *registry) detachedSince(t *Request) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return t.detachedSince
}

// startDetachClock starts t's detach clock if no client follows it here: an
// adopted resumable request still ends after the detach timeout with
// nobody attached (the clock starts again at the adoption: when its client
// left the departed frontend is not in the log).
func (r *registry) startDetachClock(t *Request) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if t.clients == 0 && t.detachedSince.IsZero() {
		t.detachedSince = time.Now()
	}
}

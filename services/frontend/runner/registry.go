package runner

import "time"

// register adds t to the requests this frontend follows, with one reference
// held by the caller. The follower stops when the last reference is released.
func (rn *Runner) register(t *Request) {
	rn.mu.Lock()
	defer rn.mu.Unlock()
	t.refs = 1
	rn.requests[t.id] = t
}

// acquire returns the tracked request id with a new reference, if followed here.
func (rn *Runner) acquire(id string) (*Request, bool) {
	rn.mu.Lock()
	defer rn.mu.Unlock()
	t, ok := rn.requests[id]
	if ok {
		t.refs++
	}
	return t, ok
}

// release drops a reference to t.
func (rn *Runner) release(t *Request) {
	rn.mu.Lock()
	t.refs--
	last := t.refs == 0
	if last {
		delete(rn.requests, t.id)
	}
	rn.mu.Unlock()
	if last {
		t.f.stop()
	}
}

// runnerEnded records that t's runner ended and drops its reference.
func (rn *Runner) runnerEnded(t *Request) {
	rn.mu.Lock()
	t.running = false
	rn.mu.Unlock()
	rn.release(t)
}

func (rn *Runner) detachedSince(t *Request) time.Time {
	rn.mu.Lock()
	defer rn.mu.Unlock()
	return t.detachedSince
}

// startDetachClock starts t's detach clock if no client follows it here: an
// adopted resumable request still ends after the detach timeout with
// nobody attached (the clock starts again at the adoption: when its client
// left the departed frontend is not in the log).
func (rn *Runner) startDetachClock(t *Request) {
	rn.mu.Lock()
	defer rn.mu.Unlock()
	if t.clients == 0 && t.detachedSince.IsZero() {
		t.detachedSince = time.Now()
	}
}

package runner

import (
	"strconv"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/streams"
)

// timing is where a request's time went before its first token, as this
// frontend saw it: the accepted event's append, the first dispatch (routing,
// the routed append, the worker's answer), and the engine's own time to
// first token as the worker reported it (streams.HeaderUpstreamTTFT on the
// attempt's first delta). Guarded by the follower's mu.
type timing struct {
	accepted, dispatched time.Duration
	upstream             time.Duration
}

// note records the upstream time to first token of e, the delta that
// added the request's first tokens.
func (t *timing) note(e events.Envelope, before int) {
	if before != 0 || t.upstream != 0 {
		return
	}
	if v := e.Header[streams.HeaderUpstreamTTFT]; len(v) > 0 {
		if us, err := strconv.ParseInt(v[0], 10, 64); err == nil && us > 0 {
			t.upstream = time.Duration(us) * time.Microsecond
		}
	}
}

// Timing is where the request's time went before its first token: the
// accepted event's append, the first dispatch, and the engine's own time to
// first token (0 until the first token, or when the worker did not say).
// It is known for a request accepted here; a request attached from the log
// reports only the upstream's.
type Timing struct {
	Accepted, Dispatched, Upstream time.Duration
}

// Timing returns the request's Timing so far.
func (t *Request) Timing() Timing {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	return Timing{Accepted: t.f.timing.accepted, Dispatched: t.f.timing.dispatched, Upstream: t.f.timing.upstream}
}

// noteAccepted records how long the accepted append took.
func (t *Request) noteAccepted(d time.Duration) {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	t.f.timing.accepted = d
}

// noteDispatched records how long the first dispatch took, once.
func (t *Request) noteDispatched(d time.Duration) {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	if t.f.timing.dispatched == 0 {
		t.f.timing.dispatched = d
	}
}

package runner

import (
	"slices"
	"strconv"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/streams"
)

// emitTimes is the frontend's end of --bench-emit-time, the only benchmark
// code of the runtime: the emit time (streams.HeaderBenchEmit, Unix ns) of
// each token of one request, parallel to its tokens once any delta carried
// one. The follower notes what each delta added; the edge passes the times
// to its SSE client (Request.Emits). Guarded by the follower's mu.
type emitTimes struct {
	ns []int64
}

// note records the emit time of e, a delta that added the tokens at offsets
// [from, to), if it carried one (or an earlier one did: 0 means unknown).
func (t *emitTimes) note(e events.Envelope, from, to int) {
	var ns int64
	if v := e.Header[streams.HeaderBenchEmit]; len(v) > 0 {
		ns, _ = strconv.ParseInt(v[0], 10, 64)
	}
	if ns == 0 && t.ns == nil {
		return
	}
	if t.ns == nil {
		t.ns = make([]int64, from, to)
	}
	for range to - from {
		t.ns = append(t.ns, ns)
	}
}

// between returns the emit times of the tokens at offsets [from, to), nil
// unless a delta carried one.
func (t *emitTimes) between(from, to int) []int64 {
	if t.ns == nil || from >= len(t.ns) {
		return nil
	}
	return slices.Clone(t.ns[max(from, 0):min(to, len(t.ns))])
}

// Emits returns the emit times (Unix ns, 0: unknown) of the request's
// tokens at offsets [from, to), nil unless a worker run with
// --bench-emit-time stamped them (benchmarks only).
func (t *Request) Emits(from, to int) []int64 {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	return t.f.emits.between(from, to)
}

package runner

import (
	"context"

	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/streams"
)

// What the frontend's accounting of tenants' log shares reads of the
// runtime (services/frontend/logshare.go), with no read of the log but
// Stored's.

// Peek runs fn on request id's projection if this frontend follows it, and
// reports whether it does; it reads nothing from the log.
func (rn *Runner) Peek(id string, fn func(p *projections.Request)) bool {
	t, ok := rn.requests.acquire(id)
	if !ok {
		return false
	}
	defer t.Release()
	t.View(fn)
	return true
}

// Stored reports whether the log still holds request id (the last message
// of its events subject, one get from its partition's leader): false once
// it was evicted or aged out.
func (rn *Runner) Stored(ctx context.Context, id string) (bool, error) {
	m, err := streams.LastOnSubject(ctx, rn.js, rn.parts.StreamOf(id), streams.RequestEvents(id))
	if err != nil {
		return false, err
	}
	return m != nil, nil
}

// LogCapacity is the request log's byte limit (every partition's), and
// the fraction of it above which new requests are refused.
func (rn *Runner) LogCapacity() (maxBytes int64, highWater float64) {
	return rn.room.Capacity(), rn.room.HighWater()
}

// SetOverShare tells eviction which tenants are over their share of the
// log (retention.Monitor.SetOverShare). Call it before Start.
func (rn *Runner) SetOverShare(over func() []string) { rn.room.SetOverShare(over) }

// EvictAt is the fraction of the log above which eviction starts.
func (rn *Runner) EvictAt() float64 { return rn.room.EvictAt() }

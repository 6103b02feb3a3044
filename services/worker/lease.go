package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrIDInUse means another live lease holds this worker's id.
var ErrIDInUse = errors.New("worker: id in use by another lease")

// lease is one registration: an exclusive streams.Session on the worker's key
// in the leases bucket, with Done closed once the lease is lost (key deleted,
// expired, or overwritten) or revoked. A lost lease is never revived; the
// worker grants a new one with a new lease id.
type lease struct {
	s  *streams.Session[events.Lease]
	id string // lease id; immutable, unlike the value
}

// grantLease creates the key with TTL ttl and starts renewing it.
// If the key exists and holds one of this worker's own earlier leases
// (ownedLeaseID, e.g. a renewal whose acknowledgement was lost), it is replaced;
// a key held by another lease returns ErrIDInUse. refresh updates volatile
// fields (the NATS client id after a reconnect) before each write.
func grantLease(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, v events.Lease, ttl time.Duration,
	ownedLeaseID string, refresh func(*events.Lease), log *slog.Logger) (*lease, error) {
	s, err := streams.NewSession(ctx, js, kv, v.WorkerID, v, streams.SessionConfig[events.Lease]{
		TTL: ttl, Exclusive: true, Refresh: refresh, Log: log.With("worker_id", v.WorkerID, "lease_id", v.LeaseID),
		TakeOver: func(held events.Lease) bool { return ownedLeaseID != "" && held.LeaseID == ownedLeaseID },
	})
	if errors.Is(err, streams.ErrKeyHeld) {
		held := ""
		if e, gerr := kv.Get(ctx, v.WorkerID); gerr == nil {
			var h events.Lease
			if json.Unmarshal(e.Value(), &h) == nil {
				held = h.LeaseID
			}
		}
		return nil, fmt.Errorf("%w: %s held by lease %s", ErrIDInUse, v.WorkerID, held)
	}
	if err != nil {
		return nil, err
	}
	return &lease{s: s, id: v.LeaseID}, nil
}

// ID is the lease id.
func (l *lease) ID() string { return l.id }

// Done is closed when the lease is lost or revoked.
func (l *lease) Done() <-chan struct{} { return l.s.Done() }

// Err says why the lease ended; nil while it is live.
func (l *lease) Err() error { return l.s.Err() }

// setDraining marks the lease draining, so discovery stops routing here.
func (l *lease) setDraining() error {
	return l.s.Update(func(v *events.Lease) { v.Draining = true })
}

// setReadiness sets the lease's NotReady flag, its reason and the engine's
// capabilities if they differ, so discovery takes the worker out of routing
// (or puts it back) and routes by what its engine can do.
func (l *lease) setReadiness(notReady bool, reason string, caps *events.Capabilities) error {
	v := l.s.Value()
	if v.NotReady == notReady && v.NotReadyReason == reason && equalCaps(v.Capabilities, caps) {
		return nil
	}
	return l.s.Update(func(v *events.Lease) { v.NotReady, v.NotReadyReason, v.Capabilities = notReady, reason, caps })
}

func equalCaps(a, b *events.Capabilities) bool {
	return (a == nil && b == nil) || (a != nil && b != nil && *a == *b)
}

// revoke stops the renewals and deletes the key if it still holds this lease.
func (l *lease) revoke(ctx context.Context) error { return l.s.Revoke(ctx) }

// close stops the renewals without deleting the key, which then expires after
// the TTL (as if the process had stopped).
func (l *lease) close() { l.s.Close() }

package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/internal/every"
	"github.com/baton-dev/baton/services/engine"
	"github.com/baton-dev/baton/streams"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
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

// setWritesBatched says in the lease that the worker writes batched
// (events.Lease.WritesBatched).
func (l *lease) setWritesBatched() error {
	return l.s.Update(func(v *events.Lease) { v.WritesBatched = true })
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

// registration is the worker's registration in the leases bucket: the
// current lease, granted again whenever it is lost (keep), and its
// readiness kept in line with the engine's health (syncReady). Its methods
// are safe for concurrent use; kv is bound (Worker.open) before first.
type registration struct {
	cfg         Config
	nc          *nats.Conn // the lease's connection: its client id and server go in the lease
	js          jetstream.JetStream
	kv          jetstream.KeyValue
	eng         engine.Engine
	events      *streams.Log
	health      *monitor
	upstream    *upstream     // the engine's capabilities go in the lease
	output      *outputStream // asked again before each re-registration; nil: switch off
	live        prometheus.Gauge
	loadChanged func() // a new lease was granted: report the load again
	log         *slog.Logger

	readyMu sync.Mutex // serialises syncReady

	mu    sync.Mutex
	lease *lease // current lease; nil while re-registering
}

// first grants the first lease, waiting up to two TTLs for a key
// held by an earlier incarnation with the same id to expire.
func (r *registration) first(ctx context.Context) (*lease, error) {
	// A key still held by a previous incarnation expires within a TTL; a
	// cluster electing a leader answers again within seconds.
	deadline := time.Now().Add(max(2*r.cfg.LeaseTTL, streams.AppendBudget))
	for {
		l, err := r.register(ctx, "")
		if err == nil {
			return l, nil
		}
		if !(errors.Is(err, ErrIDInUse) || streams.Transient(err)) || time.Now().After(deadline) {
			return nil, err
		}
		r.log.Info("cannot register yet; retrying", "err", err)
		if !streams.Sleep(ctx, r.cfg.LeaseTTL/10) {
			return nil, fmt.Errorf("worker: register: %w", ctx.Err())
		}
	}
}

// keep grants a new lease whenever the current one is lost, until
// ctx is done.
func (r *registration) keep(ctx context.Context, l *lease) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.Done():
		}
		r.live.Set(0)
		r.log.Warn("lease lost; registering again", "lease_id", l.ID(), "err", l.Err())
		r.mu.Lock()
		r.lease = nil
		r.mu.Unlock()
		prev := l.ID()
		l.close()
		for {
			r.output.ask(ctx)
			var err error
			if l, err = r.register(ctx, prev); err == nil {
				break
			}
			if ctx.Err() != nil {
				return
			}
			r.log.Warn("register again", "err", err)
			if !streams.Sleep(ctx, r.cfg.LeaseTTL/3) {
				return
			}
		}
		r.loadChanged()
	}
}

// askAgain asks for the output stream every lease TTL while the last ask
// went unanswered, and once one is, says writes_batched in the current
// lease (a new lease says it from the start): a worker started before any
// frontend with --batched-output (a rolling upgrade starts the workers
// first) writes batched without registering again. Switch off: returns.
func (r *registration) askAgain(ctx context.Context) {
	if r.output == nil {
		return
	}
	every.Tick(ctx, r.cfg.LeaseTTL, func() {
		if r.output.batched() || !r.output.ask(ctx) {
			return
		}
		l := r.current()
		if l == nil {
			return // re-registering: the new lease says it
		}
		if err := l.setWritesBatched(); err != nil {
			r.log.Warn("say writes_batched in the lease", "lease_id", l.ID(), "err", err)
		}
	})
}

// register grants a new lease with a new lease id and appends worker_registered.
func (r *registration) register(ctx context.Context, ownedLeaseID string) (*lease, error) {
	healthy, reason := r.health.state()
	v := events.Lease{
		WorkerID: r.cfg.ID, LeaseID: uuid.NewString(), Model: r.cfg.Model,
		PID: os.Getpid(), Host: r.cfg.Host, TTLMS: r.cfg.LeaseTTL.Milliseconds(),
		NotReady: !healthy, Capabilities: r.upstream.capabilities(), HoldsUntilRouted: true, Priority: r.cfg.Priority,
		WritesBatched: r.output.batched(),
	}
	if ft, ok := r.eng.(interface{ FirstTokenTimeout() time.Duration }); ok {
		v.FirstTokenTimeoutMS = ft.FirstTokenTimeout().Milliseconds()
	}
	if !healthy {
		v.NotReadyReason = reason
		if up := r.health.upstreamReason(); up != "" {
			v.NotReadyReason = up
		}
	}
	r.connInfo(&v)
	rctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	l, err := grantLease(rctx, r.js, r.kv, v, r.cfg.LeaseTTL, ownedLeaseID, r.connInfo, r.log)
	if err != nil {
		return nil, fmt.Errorf("worker: register %s: %w", r.cfg.ID, err)
	}
	st := r.eng.Stats()
	reg := events.WorkerRegistered{
		WorkerID: r.cfg.ID, LeaseID: v.LeaseID, Model: r.cfg.Model, PID: v.PID, Host: v.Host,
		LeaseTTLMS: v.TTLMS, KVBlocks: st.KVBlocksTotal, MaxConcurrent: r.cfg.MaxConcurrentRequests,
	}
	if _, err := r.events.Append(rctx, streams.WorkerEvents(r.cfg.ID), r.events.Envelope(events.ID(r.cfg.ID, "registered", v.LeaseID), r.cfg.ID, reg), -1); err != nil {
		dctx, cancel := withDefaultTimeout(context.WithoutCancel(ctx))
		defer cancel()
		_ = l.revoke(dctx)
		return nil, fmt.Errorf("worker: register %s: %w", r.cfg.ID, err)
	}
	r.mu.Lock()
	r.lease = l
	r.mu.Unlock()
	r.live.Set(1)
	r.log.Info("registered", "lease_id", v.LeaseID, "model", r.cfg.Model, "lease_ttl", r.cfg.LeaseTTL)
	r.syncReady() // health may have changed since v was built
	return l, nil
}

// syncReady makes the current lease's NotReady flag match the engine's
// health, so that discovery takes a not-ready worker out of routing and puts
// it back once it is healthy again.
func (r *registration) syncReady() {
	r.readyMu.Lock()
	defer r.readyMu.Unlock()
	healthy, reason := r.health.state()
	l := r.current()
	if l == nil {
		return // re-registering: register reads the health itself
	}
	if healthy {
		reason = ""
	} else if up := r.health.upstreamReason(); up != "" {
		reason = up // the upstream's words say more than "upstream_not_ready"
	}
	if err := l.setReadiness(!healthy, reason, r.upstream.capabilities()); err != nil {
		r.log.Warn("mark lease readiness", "lease_id", l.ID(), "not_ready", !healthy, "err", err)
	}
}

// connInfo fills in the connection's current client id and server, which
// change on a reconnect.
func (r *registration) connInfo(v *events.Lease) {
	if id, err := r.nc.GetClientID(); err == nil {
		v.ClientID = id
	}
	v.Server = r.nc.ConnectedServerId()
}

// current is the current lease; nil while re-registering.
func (r *registration) current() *lease {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lease
}

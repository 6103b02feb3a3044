package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go/jetstream"
)

// Errors of the lease.
var (
	// ErrIDInUse means another live lease holds this worker's id.
	ErrIDInUse = errors.New("worker: id in use by another lease")
	// errLeaseLost means the key is gone or was written by someone else.
	errLeaseLost = errors.New("worker: lease lost")
)

// lease is one registration, modelled on etcd's concurrency.Session: a key in
// the leases bucket that lives while it is renewed, with Done closed once the
// lease is lost (key deleted, expired, or overwritten) or revoked. A lost
// lease is never revived; the worker grants a new one with a new lease id.
//
// Renewals publish the same value to the key's subject with a per-message
// TTL and the expected last revision, which is what kv.Update does
// internally but with a TTL (kv.Update takes none).
type lease struct {
	js      jetstream.JetStream
	kv      jetstream.KeyValue
	key     string
	id      string // lease id; immutable, unlike value
	subject string
	ttl     time.Duration
	log     *slog.Logger
	// refresh updates volatile fields (the NATS client id after a
	// reconnect) before each renewal.
	refresh func(*events.Lease)

	mu      sync.Mutex // serialises writes of the key
	value   events.Lease
	rev     uint64
	renewed time.Time
	err     error // why the lease ended

	done     chan struct{}
	doneOnce sync.Once
	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
}

// grantLease creates the key with TTL ttl and starts renewing it every ttl/3.
// If the key exists and holds one of this worker's own earlier leases
// (ownedLeaseID, e.g. a renewal whose acknowledgement was lost), it is replaced;
// a key held by another lease returns ErrIDInUse.
func grantLease(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, v events.Lease, ttl time.Duration,
	ownedLeaseID string, refresh func(*events.Lease), log *slog.Logger) (*lease, error) {
	l := &lease{
		js: js, kv: kv, key: v.WorkerID, id: v.LeaseID, subject: streams.KVSubject(kv.Bucket(), v.WorkerID),
		ttl: ttl, log: log, refresh: refresh, value: v,
		done: make(chan struct{}), stop: make(chan struct{}),
	}
	data, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("worker: encode lease: %w", err)
	}
	rev, err := kv.Create(ctx, l.key, data, jetstream.KeyTTL(ttl))
	if errors.Is(err, jetstream.ErrKeyExists) {
		rev, err = l.takeOver(ctx, data, ownedLeaseID)
	}
	if err != nil {
		return nil, err
	}
	l.rev, l.renewed = rev, time.Now()
	l.wg.Go(l.keepAlive)
	return l, nil
}

// takeOver replaces an existing key if it is this worker's own earlier lease.
func (l *lease) takeOver(ctx context.Context, data []byte, ownedLeaseID string) (uint64, error) {
	e, err := l.kv.Get(ctx, l.key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return l.kv.Create(ctx, l.key, data, jetstream.KeyTTL(l.ttl)) // expired meanwhile
	}
	if err != nil {
		return 0, fmt.Errorf("worker: read lease %s: %w", l.key, err)
	}
	var held events.Lease
	if json.Unmarshal(e.Value(), &held) != nil || ownedLeaseID == "" || held.LeaseID != ownedLeaseID {
		return 0, fmt.Errorf("%w: %s held by lease %s", ErrIDInUse, l.key, held.LeaseID)
	}
	ack, err := l.js.Publish(ctx, l.subject, data,
		jetstream.WithMsgTTL(l.ttl), jetstream.WithExpectLastSequencePerSubject(e.Revision()))
	if err != nil {
		return 0, fmt.Errorf("worker: replace own lease %s: %w", l.key, err)
	}
	return ack.Sequence, nil
}

// ID is the lease id.
func (l *lease) ID() string { return l.id }

// Done is closed when the lease is lost or revoked.
func (l *lease) Done() <-chan struct{} { return l.done }

// Err says why the lease ended; nil while it is live.
func (l *lease) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

func (l *lease) end(err error) {
	l.doneOnce.Do(func() {
		l.err = err
		close(l.done)
	})
}

func (l *lease) keepAlive() {
	t := time.NewTicker(l.ttl / 3)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
		}
		err := l.write(func(*events.Lease) {})
		switch {
		case err == nil:
		case errors.Is(err, errLeaseLost):
			return
		case time.Since(l.renewed) >= l.ttl:
			l.mu.Lock()
			l.end(fmt.Errorf("%w: not renewed for %v: %w", errLeaseLost, l.ttl, err))
			l.mu.Unlock()
			return
		default:
			l.log.Warn("lease renewal failed; retrying", "worker_id", l.key, "lease_id", l.value.LeaseID, "err", err)
		}
	}
}

// write publishes the lease value, changed by edit, as a renewal. A revision
// mismatch ends the lease.
func (l *lease) write(edit func(*events.Lease)) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return l.err
	}
	v := l.value
	edit(&v)
	if l.refresh != nil {
		l.refresh(&v)
	}
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("worker: encode lease: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), l.ttl/3)
	defer cancel()
	ack, err := l.js.Publish(ctx, l.subject, data,
		jetstream.WithMsgTTL(l.ttl), jetstream.WithExpectLastSequencePerSubject(l.rev))
	if err != nil {
		if errors.Is(streams.Translate(err), streams.ErrRevisionMismatch) {
			err = fmt.Errorf("%w: key %s changed under revision %d: %w", errLeaseLost, l.key, l.rev, err)
			l.end(err)
		}
		return err
	}
	l.value, l.rev, l.renewed = v, ack.Sequence, time.Now()
	return nil
}

// setDraining marks the lease draining, so discovery stops routing here.
func (l *lease) setDraining() error {
	return l.write(func(v *events.Lease) { v.Draining = true })
}

// setReadiness sets the lease's NotReady flag, its reason and the engine's
// capabilities if they differ, so discovery takes the worker out of routing
// (or puts it back) and routes by what its engine can do.
func (l *lease) setReadiness(notReady bool, reason string, caps *events.Capabilities) error {
	l.mu.Lock()
	same := l.value.NotReady == notReady && l.value.NotReadyReason == reason && equalCaps(l.value.Capabilities, caps)
	l.mu.Unlock()
	if same {
		return nil
	}
	return l.write(func(v *events.Lease) { v.NotReady, v.NotReadyReason, v.Capabilities = notReady, reason, caps })
}

func equalCaps(a, b *events.Capabilities) bool {
	return (a == nil && b == nil) || (a != nil && b != nil && *a == *b)
}

// revoke stops the renewals and deletes the key if it still holds this lease.
func (l *lease) revoke(ctx context.Context) error {
	l.stopOnce.Do(func() { close(l.stop) })
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return nil // lost already: the key is not ours to delete
	}
	l.end(errors.New("worker: lease revoked"))
	if err := l.kv.Delete(ctx, l.key, jetstream.LastRevision(l.rev)); err != nil {
		return fmt.Errorf("worker: delete lease %s: %w", l.key, err)
	}
	return nil
}

// close stops the renewals without deleting the key, which then expires after
// the TTL (as if the process had stopped).
func (l *lease) close() {
	l.stopOnce.Do(func() { close(l.stop) })
	l.wg.Wait()
}

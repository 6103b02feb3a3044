package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/internal/notify"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"
)

// discovery keeps a projections.Discovery current from the leases and load
// buckets and the workers stream, and tells waiters when it changes.
type discovery struct {
	log     *slog.Logger
	leases  jetstream.KeyValue
	changed *notify.Signal // any change, load reports included
	// members is notified on every change but a load report: a worker came,
	// left, drained or renewed its lease. A runner watching a running
	// attempt needs nothing else, and load reports come often.
	members *notify.Signal

	stop  context.CancelFunc // ends the watches (they also end with Run's context)
	mu    sync.Mutex
	view  *projections.Discovery
	ready bool // the initial state of the leases bucket has been applied
	// served holds every model a worker has registered for since start, so
	// that a model whose workers all died is "no worker" (503), not unknown.
	served map[string]bool
}

func newDiscovery(log *slog.Logger) *discovery {
	return &discovery{log: log, changed: notify.NewSignal(), members: notify.NewSignal(), view: projections.NewDiscovery(), served: map[string]bool{}}
}

// hasServed reports whether any worker has served model since start.
func (d *discovery) hasServed(model string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.served[model]
}

// start watches until ctx is done, in goroutines on g. It returns
// once the initial lease state is loaded, or when startCtx is done.
func (d *discovery) start(ctx, startCtx context.Context, js jetstream.JetStream, g *errgroup.Group) error {
	leases, err := js.KeyValue(ctx, streams.LeasesBucket)
	if err != nil {
		return fmt.Errorf("open bucket %s: %w", streams.LeasesBucket, err)
	}
	d.leases = leases
	load, err := js.KeyValue(ctx, streams.LoadBucket)
	if err != nil {
		return fmt.Errorf("open bucket %s: %w", streams.LoadBucket, err)
	}
	lw, err := leases.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("watch %s: %w", streams.LeasesBucket, err)
	}
	ldw, err := load.WatchAll(ctx)
	if err != nil {
		lw.Stop()
		return fmt.Errorf("watch %s: %w", streams.LoadBucket, err)
	}
	cc, err := d.followWorkers(ctx, js)
	if err != nil {
		lw.Stop()
		ldw.Stop()
		return err
	}

	initial := make(chan struct{})
	// The watches stop with ctx, or at once if the initial state does not
	// arrive in time (so that a retried start does not leave them running).
	wctx, stop := context.WithCancel(ctx)
	g.Go(func() error {
		streams.Watch(wctx, lw, d.applyLease, func() {
			d.mu.Lock()
			d.ready = true
			d.mu.Unlock()
			close(initial)
			d.changed.Notify()
			d.members.Notify()
		})
		return nil
	})
	g.Go(func() error {
		streams.Watch(wctx, ldw, d.applyLoad, nil)
		return nil
	})
	g.Go(func() error {
		<-wctx.Done()
		cc.Stop()
		return nil
	})
	select {
	case <-initial:
		d.stop = stop
		return nil
	case <-startCtx.Done():
		stop()
		return fmt.Errorf("load discovery: %w", startCtx.Err())
	}
}

// followWorkers folds the last event of each worker's subject of
// BATON_WORKERS, then each new one, into the view.
func (d *discovery) followWorkers(ctx context.Context, js jetstream.JetStream) (jetstream.ConsumeContext, error) {
	cons, err := js.OrderedConsumer(ctx, streams.WorkersStream, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy,
	})
	if err != nil {
		return nil, fmt.Errorf("follow %s: %w", streams.WorkersStream, err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		e, err := events.Unmarshal(events.Header(m.Headers()), m.Data())
		if err != nil {
			return
		}
		if md, err := m.Metadata(); err == nil {
			e.Seq = md.Sequence.Stream
		}
		e.Stored = m.Subject() // a worker speaks only for itself: projections.MisplacedWorkerEvent
		d.update(func(v *projections.Discovery) bool {
			changed, why := v.Fold(e)
			if why == projections.IgnoredNotWorkersSubject || why == projections.IgnoredNotCurrentLease {
				d.log.Warn("worker event ignored", "subject", e.Stored, "type", e.Type(), "why", why)
			}
			return changed
		})
	})
	if err != nil {
		return nil, fmt.Errorf("follow %s: %w", streams.WorkersStream, err)
	}
	return cc, nil
}

// applyLease applies an entry of the leases bucket.
func (d *discovery) applyLease(entry jetstream.KeyValueEntry) {
	u := projections.LeaseUpdate{Key: entry.Key(), Revision: entry.Revision(), Time: entry.Created(),
		Expired: entry.Operation() == jetstream.KeyValuePurge} // the client's name for the server's expiry marker
	if entry.Operation() == jetstream.KeyValuePut {
		var l events.Lease
		if err := json.Unmarshal(entry.Value(), &l); err != nil {
			d.log.Warn("skip malformed lease", "worker_id", entry.Key(), "err", err)
			return
		}
		u.Lease = &l
	}
	d.update(func(v *projections.Discovery) bool {
		if u.Lease != nil {
			d.served[u.Lease.Model] = true
		}
		return v.ApplyLease(u)
	})
}

// applyLoad applies an entry of the load bucket.
func (d *discovery) applyLoad(entry jetstream.KeyValueEntry) {
	u := projections.LoadUpdate{Key: entry.Key(), Revision: entry.Revision()}
	if entry.Operation() == jetstream.KeyValuePut {
		var l events.Load
		if err := json.Unmarshal(entry.Value(), &l); err != nil {
			return
		}
		u.Load = &l
	}
	d.updateLoad(func(v *projections.Discovery) bool { return v.ApplyLoad(u) })
}

func (d *discovery) update(f func(*projections.Discovery) bool) {
	if d.updateLoad(f) {
		d.members.Notify()
	}
}

// updateLoad applies a load report: it notifies changed only.
func (d *discovery) updateLoad(f func(*projections.Discovery) bool) bool {
	d.mu.Lock()
	changed := f(d.view)
	d.mu.Unlock()
	if changed {
		d.changed.Notify()
	}
	return changed
}

// read runs f on the view under the lock; f must not keep references.
func (d *discovery) read(f func(*projections.Discovery)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	f(d.view)
}

// get returns a copy of worker id.
func (d *discovery) get(id string) (projections.Worker, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.view.Get(id)
}

// revoke deletes worker w's lease, the one its projection holds. revoked is
// false when nothing of that lease was left to revoke: the worker deleted it
// itself (it deregistered), another frontend revoked it first, or the worker
// registered again under a new lease id. A lease renewed since the projection
// saw it (by the same registration, just before its connection dropped) is
// still revoked.
func (d *discovery) revoke(ctx context.Context, w projections.Worker) (revoked bool, err error) {
	rev := w.LeaseRevision
	for range 5 {
		err := d.leases.Delete(ctx, w.ID, jetstream.LastRevision(rev))
		switch {
		case err == nil:
			return true, nil
		case errors.Is(err, jetstream.ErrKeyNotFound):
			return false, nil
		case !errors.Is(streams.Translate(err), streams.ErrRevisionMismatch):
			return false, fmt.Errorf("revoke lease of %s: %w", w.ID, err)
		}
		e, err := d.leases.Get(ctx, w.ID)
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
			return false, nil // deleted since: deregistered, or revoked by another frontend
		}
		if err != nil {
			return false, fmt.Errorf("revoke lease of %s: read it: %w", w.ID, err)
		}
		var now events.Lease
		if err := json.Unmarshal(e.Value(), &now); err != nil || now.LeaseID != w.LeaseID {
			return false, nil // registered again: a new lease, not the lost one
		}
		rev = e.Revision() // the same lease, renewed since: revoke that revision
	}
	return false, fmt.Errorf("revoke lease of %s: it kept changing", w.ID)
}

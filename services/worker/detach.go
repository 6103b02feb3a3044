package worker

import (
	"context"
	"sync"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go/jetstream"
)

// frontends is the worker's view of which frontend replicas are alive (their
// keys in the frontends bucket), so that a request whose owning frontend
// crashed, and that no client re-attached to through another frontend, is
// cancelled after the detach timeout instead of generating for nobody.
type frontends struct {
	mu      sync.Mutex
	view    *projections.Frontends
	changed chan struct{} // closed and replaced on every change
}

func newFrontends() *frontends {
	return &frontends{view: projections.NewFrontends(), changed: make(chan struct{})}
}

func (f *frontends) isAlive(id string) (bool, <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.view.Alive(id), f.changed
}

func (f *frontends) apply(u projections.FrontendUpdate) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.view.Apply(u) {
		close(f.changed)
		f.changed = make(chan struct{})
	}
}

// watchFrontends follows the frontends bucket until ctx is done.
func (w *Worker) watchFrontends(ctx context.Context) {
	kv, err := w.js.KeyValue(ctx, streams.FrontendsBucket)
	if err != nil {
		w.log.Warn("watch frontends: detached requests will run to the end", "err", err)
		return
	}
	watcher, err := kv.WatchAll(ctx)
	if err != nil {
		w.log.Warn("watch frontends: detached requests will run to the end", "err", err)
		return
	}
	defer watcher.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case e, ok := <-watcher.Updates():
			if !ok {
				return
			}
			if e != nil {
				w.frontends.apply(projections.FrontendUpdate{Key: e.Key(), Revision: e.Revision(),
					Deleted: e.Operation() != jetstream.KeyValuePut, Value: e.Value()})
			}
		}
	}
}

// guardDetach cancels job j (kill) once its owning frontend has been gone for
// the dispatch's detach timeout without another frontend attaching. It
// returns when the job ends.
func (w *Worker) guardDetach(j *job) {
	timeout := time.Duration(j.d.DetachTimeoutMS) * time.Millisecond
	if timeout <= 0 {
		return
	}
	timer := time.NewTimer(timeout)
	timer.Stop()
	defer timer.Stop()
	var goneSince time.Time
	for {
		owner, ownerCh := j.owner()
		alive, aliveCh := w.frontends.isAlive(owner)
		var fire <-chan time.Time
		switch {
		case alive:
			goneSince = time.Time{}
		case goneSince.IsZero():
			goneSince = time.Now()
			fallthrough
		default:
			left := timeout - time.Since(goneSince)
			if left <= 0 {
				w.cancelDetached(j, owner)
				return
			}
			timer.Reset(left)
			fire = timer.C
		}
		select {
		case <-j.ctx.Done():
			return
		case <-ownerCh:
		case <-aliveCh:
		case <-fire:
		}
		timer.Stop()
	}
}

// cancelDetached appends the kill that ends a detached request; the job's
// command subscription sees it and stops generating. The event id is the one
// a frontend's kill uses, so the two deduplicate.
func (w *Worker) cancelDetached(j *job, owner string) {
	ctx, cancel := context.WithTimeout(context.Background(), streams.DefaultTimeout)
	defer cancel()
	id := j.d.RequestID
	ev := events.RequestCancelled{RequestID: id, Mode: events.CancelKill,
		Reason: "detached: frontend " + owner + " is gone and no client re-attached"}
	env := w.events.Envelope(events.ID(id, "cancelled", events.CancelKill), id, ev)
	if _, err := w.events.Append(ctx, streams.RequestEvents(id), env, -1); err != nil {
		w.log.Warn("cancel detached request", "request_id", id, "err", err)
		return
	}
	w.log.Info("cancelled detached request", "request_id", id, "owner", owner)
}

package worker

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go"
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

// detacher stops the requests whose owning frontend is gone (guard): it
// follows the frontends bucket (watch) and asks a live frontend before it
// stops one (detach).
type detacher struct {
	frontends *frontends
	checks    *checks
	js        jetstream.JetStream
	log       *slog.Logger
}

// watch follows the frontends bucket until ctx is done.
func (dt *detacher) watch(ctx context.Context) {
	kv, err := dt.js.KeyValue(ctx, streams.FrontendsBucket)
	if err != nil {
		dt.log.Warn("watch frontends: detached requests will run to the end", "err", err)
		return
	}
	watcher, err := kv.WatchAll(ctx)
	if err != nil {
		dt.log.Warn("watch frontends: detached requests will run to the end", "err", err)
		return
	}
	streams.Watch(ctx, watcher, func(e jetstream.KeyValueEntry) {
		dt.frontends.apply(projections.FrontendUpdate{Key: e.Key(), Revision: e.Revision(),
			Deleted: e.Operation() != jetstream.KeyValuePut, Value: e.Value()})
	}, nil)
}

// guard has job j's request cancelled (detach) once its owning
// frontend has been gone for the dispatch's detach timeout without another
// frontend attaching. It returns when the job ends.
func (dt *detacher) guard(j *job) {
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
		alive, aliveCh := dt.frontends.isAlive(owner)
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
				if dt.detach(j, owner) {
					return
				}
				goneSince = time.Time{} // a live owner after all: start over
				continue
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

// detach reports that job j's owner has been gone for the detach timeout
// to a live frontend, which cancels the request (kill) unless the log names
// a live owner; the kill reaches the job as a command. If no frontend
// is there to answer, the worker stops the job itself and closes its attempt
// ("detached"): a frontend that comes back later migrates it on a resume;
// a frontend that could not answer is asked again after the timeout. It
// reports whether the job is done with.
func (dt *detacher) detach(j *job, owner string) bool {
	ctx, cancel := context.WithTimeout(j.ctx, streams.DefaultTimeout)
	defer cancel()
	r, err := dt.checks.check(ctx, j, true)
	switch {
	case j.ctx.Err() != nil:
		dt.log.Info("cancelled detached request", "request_id", j.d.RequestID, "owner", owner)
		return true
	case errors.Is(err, nats.ErrNoResponders):
		dt.log.Warn("no frontend to ask about a detached request: stopping it", "request_id", j.d.RequestID, "owner", owner)
		j.cancel(errNoFrontend)
		return true
	case err != nil:
		dt.log.Warn("ask about a detached request; asking again after the detach timeout", "request_id", j.d.RequestID, "owner", owner, "err", err)
		return false
	}
	dt.log.Info("detached request has a live owner", "request_id", j.d.RequestID, "owner", r.Owner)
	return false
}

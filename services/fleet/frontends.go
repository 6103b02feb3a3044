package fleet

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/baton-dev/baton/internal/notify"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"
)

// frontends keeps a projections.Frontends current from the frontends
// bucket: every frontend's presence key, this one's included (which its
// runtime keeps alive). A request whose owner's key is gone may be taken
// over.
type frontends struct {
	kv      jetstream.KeyValue
	changed *notify.Signal // membership changed; renewals wake nobody

	mu   sync.Mutex
	view *projections.Frontends
}

func newFrontends() *frontends {
	return &frontends{changed: notify.NewSignal(), view: projections.NewFrontends()}
}

// start watches the bucket until ctx is done, in a goroutine on g; startCtx
// bounds opening it.
func (p *frontends) start(ctx, startCtx context.Context, js jetstream.JetStream, g *errgroup.Group) error {
	kv, err := js.KeyValue(startCtx, streams.FrontendsBucket)
	if err != nil {
		return fmt.Errorf("open bucket %s: %w", streams.FrontendsBucket, err)
	}
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("watch %s: %w", streams.FrontendsBucket, err)
	}
	p.kv = kv
	g.Go(func() error {
		streams.Watch(ctx, w, func(e jetstream.KeyValueEntry) {
			p.mu.Lock()
			changed := p.view.Apply(projections.FrontendUpdate{Key: e.Key(), Revision: e.Revision(),
				Deleted: e.Operation() != jetstream.KeyValuePut, Value: e.Value()})
			p.mu.Unlock()
			if changed {
				p.changed.Notify()
			}
		}, nil)
		return nil
	})
	return nil
}

// isAlive reports whether frontend id holds a live key.
func (p *frontends) isAlive(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.view.Alive(id)
}

// connectedAs returns the frontends whose NATS connection is client id on
// server.
func (p *frontends) connectedAs(client uint64, server string) []projections.Frontend {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.view.ConnectedAs(client, server)
}

// expire deletes the key of a frontend whose connection closed, if it still
// holds the given revision, so its requests can be taken over at once.
func (p *frontends) expire(ctx context.Context, e projections.Frontend) error {
	err := p.kv.Delete(ctx, e.FrontendID, jetstream.LastRevision(e.Revision))
	if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		if errors.Is(streams.Translate(err), streams.ErrRevisionMismatch) {
			return nil // renewed meanwhile: alive after all
		}
		return fmt.Errorf("expire frontend %s: %w", e.FrontendID, err)
	}
	return nil
}

// members returns the live frontends.
func (p *frontends) members() []projections.Frontend {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.view.Members()
}

// known returns the live frontends and those that departed.
func (p *frontends) known() []projections.Frontend {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append(p.view.Members(), p.view.Departed()...)
}

package runner

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/internal/notify"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"
)

// presenceTTL is how long a frontend's key outlives its last renewal; its
// streams.Session renews it at a third of that.
const presenceTTL = 6 * time.Second

// presence keeps this frontend's key alive in the frontends bucket and
// watches everyone's: a request whose owner's key is gone may be taken over.
type presence struct {
	kv      jetstream.KeyValue
	changed *notify.Signal

	mu      sync.Mutex
	view    *projections.Frontends
	session *streams.Session[events.FrontendPresence] // this frontend's key
}

func newPresence() *presence {
	return &presence{changed: notify.NewSignal(), view: projections.NewFrontends()}
}

// start registers id and starts renewing and watching, in goroutines on g.
func (p *presence) start(ctx, startCtx context.Context, js jetstream.JetStream, v events.FrontendPresence, g *errgroup.Group) error {
	kv, err := js.KeyValue(startCtx, streams.FrontendsBucket)
	if err != nil {
		return fmt.Errorf("open bucket %s: %w", streams.FrontendsBucket, err)
	}
	p.kv = kv
	v.PID = os.Getpid()
	v.Host, _ = os.Hostname()
	// By fiat, not exclusive: the frontend's id is its own, and a key
	// deleted under it (expired by a peer that saw its connection close) is
	// put back at the next renewal.
	s, err := streams.NewSession(startCtx, js, kv, v.FrontendID, v, streams.SessionConfig[events.FrontendPresence]{TTL: presenceTTL})
	if err != nil {
		return fmt.Errorf("register frontend %s: %w", v.FrontendID, err)
	}
	w, err := kv.WatchAll(ctx)
	if err != nil {
		s.Close()
		return fmt.Errorf("watch %s: %w", streams.FrontendsBucket, err)
	}
	p.mu.Lock()
	p.session = s
	p.mu.Unlock()
	g.Go(func() error {
		<-ctx.Done()
		s.Close() // after revoke, or without deleting the key if Run ends otherwise
		return nil
	})
	g.Go(func() error {
		streams.Watch(ctx, w, func(e jetstream.KeyValueEntry) {
			p.mu.Lock()
			changed := p.view.Apply(projections.FrontendUpdate{Key: e.Key(), Revision: e.Revision(),
				Deleted: e.Operation() != jetstream.KeyValuePut, Value: e.Value()})
			p.mu.Unlock()
			if changed {
				p.changed.Notify() // membership changed; renewals wake nobody
			}
		}, nil)
		return nil
	})
	return nil
}

// isAlive reports whether frontend id holds a live key.
func (p *presence) isAlive(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.view.Alive(id)
}

// connectedAs returns the frontends whose NATS connection is client id on
// server.
func (p *presence) connectedAs(client uint64, server string) []projections.Frontend {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.view.ConnectedAs(client, server)
}

// expire deletes the key of a frontend whose connection closed, if it still
// holds the given revision, so its requests can be taken over at once.
func (p *presence) expire(ctx context.Context, e projections.Frontend) error {
	err := p.kv.Delete(ctx, e.FrontendID, jetstream.LastRevision(e.Revision))
	if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		if errors.Is(streams.Translate(err), streams.ErrRevisionMismatch) {
			return nil // renewed meanwhile: alive after all
		}
		return fmt.Errorf("expire frontend %s: %w", e.FrontendID, err)
	}
	return nil
}

// revoke deletes this frontend's key, so others may take its requests at once.
func (p *presence) revoke(ctx context.Context) error {
	p.mu.Lock()
	s := p.session
	p.mu.Unlock()
	if s == nil {
		return nil
	}
	if err := s.Revoke(ctx); err != nil {
		return fmt.Errorf("deregister frontend: %w", err)
	}
	return nil
}

// members returns the live frontends.
func (p *presence) members() []projections.Frontend {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.view.Members()
}

// known returns the live frontends and those that departed.
func (p *presence) known() []projections.Frontend {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append(p.view.Members(), p.view.Departed()...)
}

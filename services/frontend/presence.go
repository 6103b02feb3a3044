package frontend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"
)

// presenceTTL is how long a frontend's key outlives its last renewal.
const presenceTTL = 6 * time.Second

// presence keeps this frontend's key alive in the frontends bucket and
// watches everyone's: a request whose owner's key is gone may be taken over.
type presence struct {
	kv      jetstream.KeyValue
	js      jetstream.JetStream
	changed *signal

	mu   sync.Mutex
	view *projections.Frontends
}

func newPresence() *presence {
	return &presence{changed: newSignal(), view: projections.NewFrontends()}
}

// start registers id and starts renewing and watching, in goroutines on g.
func (p *presence) start(ctx, startCtx context.Context, js jetstream.JetStream, v events.FrontendPresence, g *errgroup.Group) error {
	kv, err := js.KeyValue(startCtx, streams.FrontendsBucket)
	if err != nil {
		return fmt.Errorf("open bucket %s: %w", streams.FrontendsBucket, err)
	}
	p.kv, p.js = kv, js
	v.PID = os.Getpid()
	v.Host, _ = os.Hostname()
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	subject := streams.KVSubject(streams.FrontendsBucket, v.FrontendID)
	put := func(ctx context.Context) error {
		_, err := js.Publish(ctx, subject, data, jetstream.WithMsgTTL(presenceTTL))
		return err
	}
	if err := put(startCtx); err != nil {
		return fmt.Errorf("register frontend %s: %w", v.FrontendID, err)
	}
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("watch %s: %w", streams.FrontendsBucket, err)
	}
	g.Go(func() error {
		t := time.NewTicker(presenceTTL / 3)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
				rctx, cancel := context.WithTimeout(ctx, presenceTTL/3)
				_ = put(rctx) // a missed renewal is retried at the next tick
				cancel()
			}
		}
	})
	g.Go(func() error {
		defer w.Stop()
		for {
			select {
			case <-ctx.Done():
				return nil
			case e, ok := <-w.Updates():
				if !ok {
					return nil
				}
				if e == nil {
					continue
				}
				u := projections.FrontendUpdate{Key: e.Key(), Revision: e.Revision(),
					Deleted: e.Operation() != jetstream.KeyValuePut, Value: e.Value()}
				p.mu.Lock()
				changed := p.view.Apply(u)
				p.mu.Unlock()
				if changed {
					p.changed.Notify() // membership changed; renewals wake nobody
				}
			}
		}
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
func (p *presence) revoke(ctx context.Context, id string) error {
	if p.kv == nil {
		return nil
	}
	if err := p.kv.Delete(ctx, id); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("deregister frontend %s: %w", id, err)
	}
	return nil
}

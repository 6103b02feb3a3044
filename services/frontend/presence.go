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
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go/jetstream"
)

// presenceTTL is how long a frontend's key outlives its last renewal.
const presenceTTL = 6 * time.Second

// presence keeps this frontend's key alive in the frontends bucket and
// watches everyone's: a request whose owner's key is gone may be taken over.
type presence struct {
	kv      jetstream.KeyValue
	js      jetstream.JetStream
	changed *signal

	mu    sync.Mutex
	alive map[string]presenceEntry
	gone  map[string]presenceEntry // frontends whose key went, for the console (bounded)
}

type presenceEntry struct {
	events.FrontendPresence
	revision uint64
}

func newPresence() *presence {
	return &presence{changed: newSignal(), alive: map[string]presenceEntry{}}
}

// start registers id and starts renewing and watching, in goroutines on wg.
func (p *presence) start(ctx, startCtx context.Context, js jetstream.JetStream, v events.FrontendPresence, wg *sync.WaitGroup) error {
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
	subject := "$KV." + streams.FrontendsBucket + "." + v.FrontendID
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
	wg.Add(2)
	go func() {
		defer wg.Done()
		t := time.NewTicker(presenceTTL / 3)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				rctx, cancel := context.WithTimeout(ctx, presenceTTL/3)
				_ = put(rctx) // a missed renewal is retried at the next tick
				cancel()
			}
		}
	}()
	go func() {
		defer wg.Done()
		defer w.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-w.Updates():
				if !ok {
					return
				}
				if e == nil {
					continue
				}
				p.mu.Lock()
				_, was := p.alive[e.Key()]
				var v events.FrontendPresence
				is := e.Operation() == jetstream.KeyValuePut && json.Unmarshal(e.Value(), &v) == nil
				if is {
					p.alive[e.Key()] = presenceEntry{FrontendPresence: v, revision: e.Revision()}
				} else {
					p.forget(e.Key())
					delete(p.alive, e.Key())
				}
				p.mu.Unlock()
				if was != is {
					p.changed.Notify() // membership changed; renewals wake nobody
				}
			}
		}
	}()
	return nil
}

// isAlive reports whether frontend id holds a live key.
func (p *presence) isAlive(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.alive[id]
	return ok
}

// connectedAs returns the frontends whose NATS connection is client id on
// server.
func (p *presence) connectedAs(client uint64, server string) []presenceEntry {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []presenceEntry
	for _, e := range p.alive {
		if e.ClientID == client && e.Server == server {
			out = append(out, e)
		}
	}
	return out
}

// expire deletes the key of a frontend whose connection closed, if it still
// holds the given revision, so its requests can be taken over at once.
func (p *presence) expire(ctx context.Context, e presenceEntry) error {
	err := p.kv.Delete(ctx, e.FrontendID, jetstream.LastRevision(e.revision))
	if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence {
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

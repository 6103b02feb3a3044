package runner

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"
)

// presenceTTL is how long a frontend's key outlives its last renewal; its
// streams.Session renews it at a third of that.
const presenceTTL = 6 * time.Second

// presence keeps this frontend's key alive in the frontends bucket: while
// it lives, no other frontend takes this one's requests over. The fleet view
// (Fleet.FrontendAlive) watches everyone's keys.
type presence struct {
	mu      sync.Mutex
	session *streams.Session[events.FrontendPresence]
}

// start registers v and renews it until ctx is done, in a goroutine on g;
// startCtx bounds the registration.
func (p *presence) start(ctx, startCtx context.Context, js jetstream.JetStream, v events.FrontendPresence, g *errgroup.Group) error {
	kv, err := js.KeyValue(startCtx, streams.FrontendsBucket)
	if err != nil {
		return fmt.Errorf("open bucket %s: %w", streams.FrontendsBucket, err)
	}
	v.PID = os.Getpid()
	v.Host, _ = os.Hostname()
	// By fiat, not exclusive: the frontend's id is its own, and a key
	// deleted under it (expired by a peer that saw its connection close) is
	// put back at the next renewal.
	s, err := streams.NewSession(startCtx, js, kv, v.FrontendID, v, streams.SessionConfig[events.FrontendPresence]{TTL: presenceTTL})
	if err != nil {
		return fmt.Errorf("register frontend %s: %w", v.FrontendID, err)
	}
	p.mu.Lock()
	p.session = s
	p.mu.Unlock()
	g.Go(func() error {
		<-ctx.Done()
		s.Close() // after revoke, or without deleting the key if Run ends otherwise
		return nil
	})
	return nil
}

// update changes the value of this frontend's key and writes it at once.
func (p *presence) update(edit func(*events.FrontendPresence)) error {
	p.mu.Lock()
	s := p.session
	p.mu.Unlock()
	if s == nil {
		return nil
	}
	return s.Update(edit)
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

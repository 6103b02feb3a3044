package frontend

import (
	"context"

	"github.com/nats-io/nats.go"
	"golang.org/x/sync/errgroup"
)

// catchUpOnReconnect re-reads the log for every followed request each time
// the NATS connection comes back: messages republished while it was down
// were never delivered, and without this a follower would only notice the
// gap with the next message, which may never come (a completion published
// during the outage).
func (fe *Frontend) catchUpOnReconnect(ctx context.Context, g *errgroup.Group) {
	ch := fe.nc.StatusChanged(nats.CONNECTED)
	g.Go(func() error {
		defer fe.nc.RemoveStatusListener(ch)
		for {
			select {
			case <-ctx.Done():
				return nil
			case _, ok := <-ch:
				if !ok {
					return nil
				}
				fe.mu.Lock()
				followed := make([]*tracked, 0, len(fe.requests))
				for _, t := range fe.requests {
					t.refs++
					followed = append(followed, t)
				}
				fe.mu.Unlock()
				fe.log.Info("reconnected to NATS; catching up followed requests", "requests", len(followed))
				for _, t := range followed {
					fe.catchUp(ctx, t)
					fe.release(t)
				}
			}
		}
	})
}

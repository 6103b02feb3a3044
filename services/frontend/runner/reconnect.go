package runner

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
func (rn *Runner) catchUpOnReconnect(ctx context.Context, g *errgroup.Group) {
	ch := rn.nc.StatusChanged(nats.CONNECTED)
	g.Go(func() error {
		defer rn.nc.RemoveStatusListener(ch)
		for {
			select {
			case <-ctx.Done():
				return nil
			case _, ok := <-ch:
				if !ok {
					return nil
				}
				followed := rn.requests.followed()
				rn.log.Info("reconnected to NATS; catching up followed requests", "requests", len(followed))
				for _, t := range followed {
					catchUp(ctx, t)
					rn.requests.release(t)
				}
			}
		}
	})
}

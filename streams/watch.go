package streams

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Watch hands the updates of w to apply, in order, until ctx is done or w
// ends, then stops w: the one loop of every KV watcher (leases, load,
// frontends). A nil entry marks the end of the initial values; Watch calls
// initial then, if it is not nil. A delete or purge is an entry whose
// Operation is not jetstream.KeyValuePut.
func Watch(ctx context.Context, w jetstream.KeyWatcher, apply func(jetstream.KeyValueEntry), initial func()) {
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case e, ok := <-w.Updates():
			switch {
			case !ok:
				return
			case e == nil:
				if initial != nil {
					initial()
				}
			default:
				apply(e)
			}
		}
	}
}

// Sleep waits for d, or until ctx is done; it reports whether ctx is still
// live (a d <= 0 does not wait).
func Sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

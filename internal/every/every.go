// Package every runs a function at a fixed interval until its context
// ends: the loop of a periodic chore (retrying what failed, publishing a
// share), written once.
package every

import (
	"context"
	"time"
)

// Tick calls f every d, the first time d after the call, until ctx is
// done; it returns then. A call of f that outlasts d delays the next one
// rather than stacking calls up.
func Tick(ctx context.Context, d time.Duration, f func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f()
		}
	}
}

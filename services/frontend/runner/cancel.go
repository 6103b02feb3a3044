package runner

import (
	"context"
	"errors"
	"fmt"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/streams"
)

// maxTreeSize bounds how many requests one cancellation walks.
const maxTreeSize = 10_000

// Cancel cancels request id and, breadth first, every request below it, on
// behalf of tenant ("" for the frontend itself), which each cancel event
// records. A cancel is an event on each request's events subject, so every
// frontend following the request ends its streams, and a command to the
// worker of its current attempt, which stops. Requests that already ended
// are skipped. It is idempotent.
func (rn *Runner) Cancel(ctx context.Context, id, mode, reason, tenant string) error {
	queue, seen := []string{id}, map[string]bool{id: true}
	var errs []error
	for len(queue) > 0 && len(seen) <= maxTreeSize {
		cur := queue[0]
		queue = queue[1:]
		p, err := rn.Load(ctx, cur)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !p.Status.Terminal() {
			err := rn.decisions.cancel(ctx, cur, mode, reason, tenant)
			if errors.Is(err, streams.ErrStreamFull) && mode == events.CancelKill {
				err = rn.lifecycle.storeKill(ctx, p, reason, tenant) // a kill is an end: it always fits
			}
			if err != nil {
				errs = append(errs, err)
			} else {
				rn.commands.cancel(p, mode, reason)
				rn.metrics.cancellations.WithLabelValues(p.Accepted.Model, p.Accepted.Endpoint, requestType(p.Accepted.Stream)).Inc()
			}
		}
		for _, c := range p.Children {
			if !seen[c] {
				seen[c] = true
				queue = append(queue, c)
			}
		}
	}
	return errors.Join(errs...)
}

// requestType is the request_type label of a request: "stream" or "unary".
func requestType(stream bool) string {
	if stream {
		return "stream"
	}
	return "unary"
}

// Load returns the current state of request id: a copy of this frontend's
// projection if it follows it, else folded from the log. It returns
// streams.ErrNotFound for an unknown id.
func (rn *Runner) Load(ctx context.Context, id string) (*projections.Request, error) {
	if t, ok := rn.requests.acquire(id); ok {
		defer rn.requests.release(t)
		p := projections.NewRequest()
		t.f.view(func(cur *projections.Request) { *p = *cur })
		return p, nil
	}
	p := projections.NewRequest()
	for e, err := range streams.ReadRequest(ctx, rn.js, rn.parts, id, 1) {
		if err != nil {
			return nil, err
		}
		p.Apply(e)
	}
	if !p.Known() {
		return nil, fmt.Errorf("%w: %s", streams.ErrNotFound, id)
	}
	return p, nil
}

package runner

import (
	"context"
	"errors"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/streams"
)

func (rn *Runner) appendFence(ctx context.Context, ev events.AttemptFailed) {
	id := ev.RequestID
	env := rn.events.Envelope(events.ID(id, ev.Attempt, "fenced"), id, ev)
	if _, err := rn.events.Append(ctx, streams.RequestTokens(id, ev.Attempt, ev.WorkerID), env, -1); err != nil {
		rn.log.Warn("fence attempt", "request_id", id, "attempt", ev.Attempt, "err", err)
	}
}

// appendDecision appends a decision to the request's events subject, expecting the
// last sequence this frontend has seen there, and waits until the follower
// has folded it. It reports false with a nil error when someone else wrote
// first (the follower has caught up by then: look again).
func (rn *Runner) appendDecision(ctx context.Context, t *Request, id string, ev events.Event) (bool, error) {
	seq, ok, err := rn.storeDecision(ctx, t, id, ev)
	if ok {
		rn.awaitFolded(ctx, t, seq)
	}
	return ok, err
}

// storeDecision is appendDecision's append, without the wait for the fold:
// it returns the decision's sequence when stored.
func (rn *Runner) storeDecision(ctx context.Context, t *Request, id string, ev events.Event) (uint64, bool, error) {
	expect := int64(t.f.eventsSeq())
	seq, err := rn.events.Append(ctx, streams.RequestEvents(t.id), rn.events.Envelope(id, t.id, ev), expect)
	if errors.Is(err, streams.ErrConflict) {
		rn.catchUp(ctx, t)
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	return seq, true, nil
}

// awaitFolded waits until this frontend has folded the event at seq (a
// bounded wait; a catch-up when it times out).
func (rn *Runner) awaitFolded(ctx context.Context, t *Request, seq uint64) {
	wctx, cancel := context.WithTimeout(ctx, streams.DefaultTimeout)
	defer cancel()
	if err := t.f.waitFor(wctx, func(p *projections.Request) bool { return p.LastSeq() >= seq }); err != nil {
		rn.catchUp(ctx, t)
	}
}

// catchUp reads whatever the follower missed.
func (rn *Runner) catchUp(ctx context.Context, t *Request) {
	_ = t.f.catchUp(ctx)
}

// appendCancel appends a cancel command for request id. It is idempotent.
func (rn *Runner) appendCancel(ctx context.Context, id, mode, reason, tenant string) error {
	ev := events.RequestCancelled{RequestID: id, Mode: mode, Reason: reason, Tenant: tenant}
	env := rn.events.Envelope(events.ID(id, "cancelled", mode), id, ev)
	_, err := rn.events.Append(ctx, streams.RequestEvents(id), env, -1)
	return err
}

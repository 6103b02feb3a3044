package runner

import (
	"context"
	"errors"
	"log/slog"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/streams"
)

// decisions appends to the request log what this frontend decides about a
// request: its decisions on the events subject (with the expected
// sequence, so two frontends never both decide), its fences and its
// cancels. It is safe for concurrent use.
type decisions struct {
	events *streams.Log
	log    *slog.Logger
}

// fence closes an attempt in the log: ev on the attempt's own subject.
func (ds decisions) fence(ctx context.Context, ev events.AttemptFailed) {
	id := ev.RequestID
	env := ds.events.Envelope(events.ID(id, ev.Attempt, "fenced"), id, ev)
	if _, err := ds.events.Append(ctx, streams.RequestTokens(id, ev.Attempt, ev.WorkerID), env, -1); err != nil {
		ds.log.Warn("fence attempt", "request_id", id, "attempt", ev.Attempt, "err", err)
	}
}

// append appends a decision to the request's events subject, expecting the
// last sequence this frontend has seen there, and waits until the follower
// has folded it. It reports false with a nil error when someone else wrote
// first (the follower has caught up by then: look again).
func (ds decisions) append(ctx context.Context, t *Request, id string, ev events.Event) (bool, error) {
	seq, ok, err := ds.store(ctx, t, id, ev)
	if ok {
		ds.awaitFolded(ctx, t, seq)
	}
	return ok, err
}

// store is append's append, without the wait for the fold: it returns the
// decision's sequence when stored.
func (ds decisions) store(ctx context.Context, t *Request, id string, ev events.Event) (uint64, bool, error) {
	expect := int64(t.f.eventsSeq())
	seq, err := ds.events.Append(ctx, streams.RequestEvents(t.id), ds.events.Envelope(id, t.id, ev), expect)
	if errors.Is(err, streams.ErrConflict) {
		catchUp(ctx, t)
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	return seq, true, nil
}

// awaitFolded waits until this frontend has folded the event at seq (a
// bounded wait; a catch-up when it times out).
func (ds decisions) awaitFolded(ctx context.Context, t *Request, seq uint64) {
	wctx, cancel := context.WithTimeout(ctx, streams.DefaultTimeout)
	defer cancel()
	if err := t.f.waitFor(wctx, func(p *projections.Request) bool { return p.LastSeq() >= seq }); err != nil {
		catchUp(ctx, t)
	}
}

// cancel appends a cancel command for request id. It is idempotent.
func (ds decisions) cancel(ctx context.Context, id, mode, reason, tenant string) error {
	ev := events.RequestCancelled{RequestID: id, Mode: mode, Reason: reason, Tenant: tenant}
	env := ds.events.Envelope(events.ID(id, "cancelled", mode), id, ev)
	_, err := ds.events.Append(ctx, streams.RequestEvents(id), env, -1)
	return err
}

// catchUp reads whatever t's follower missed.
func catchUp(ctx context.Context, t *Request) {
	_ = t.f.catchUp(ctx)
}

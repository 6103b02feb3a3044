package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go"
)

// outputStream is the worker's output stream of its own (Config.BatchedOutput,
// docs/internals.md "Where a worker's output lives"): the worker asks a
// frontend for it before it listens for dispatches and again before each
// re-registration, and says WritesBatched in the lease it then registers
// only if a frontend answered that it exists. With no answer (no frontend
// with --batched-output, a previous release's) the worker runs as without
// the switch, says so in its log once, and asks again every lease TTL
// (registration.askAgain), saying WritesBatched in its lease once answered. A nil *outputStream is the
// switch off: never asks, never batched. Its methods are safe for
// concurrent use.
type outputStream struct {
	id  string
	log *slog.Logger
	nc  *nats.Conn // the control connection, set by Run before the first ask
	// answered, when set, is called after each ask a frontend answered
	// with the stream (the batched writer's room check).
	answered func(context.Context)

	mu     sync.Mutex
	ready  bool // the last ask was answered with the stream
	warned bool // the first unanswered ask was logged
}

// ask asks a frontend for the worker's output stream and reports whether
// it exists now.
func (o *outputStream) ask(ctx context.Context) bool {
	if o == nil {
		return false
	}
	err := o.request(ctx)
	if err == nil && o.answered != nil {
		o.answered(ctx)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.ready = err == nil
	switch {
	case err == nil:
		o.log.Info("output stream ready: writes batched", "stream", streams.WorkerOutputStream(o.id))
	case !o.warned:
		o.warned = true
		o.log.Warn("no frontend gave this worker an output stream (none runs with --batched-output, or one of a previous release): "+
			"writing per-token messages as without the switch; asking again every lease TTL", "err", err)
	default:
		o.log.Debug("no output stream yet", "err", err)
	}
	return o.ready
}

func (o *outputStream) request(ctx context.Context) error {
	rctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	m, err := o.nc.RequestWithContext(rctx, streams.OutputsSubject(o.id), nil)
	if errors.Is(err, nats.ErrNoResponders) {
		return errors.New("no frontend answers " + streams.OutputsSubject(o.id))
	}
	if err != nil {
		return fmt.Errorf("ask %s: %w", streams.OutputsSubject(o.id), err)
	}
	var r streams.OutputsReply
	if err := json.Unmarshal(m.Data, &r); err != nil {
		return fmt.Errorf("ask %s: the answer does not decode: %w", streams.OutputsSubject(o.id), err)
	}
	if r.Error != "" {
		return fmt.Errorf("ask %s: %s", streams.OutputsSubject(o.id), r.Error)
	}
	if want := streams.WorkerOutputStream(o.id); r.Stream != want {
		return fmt.Errorf("ask %s: answered stream %q, want %q", streams.OutputsSubject(o.id), r.Stream, want)
	}
	return nil
}

// batched reports whether the last ask was answered with the stream.
func (o *outputStream) batched() bool {
	if o == nil {
		return false
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.ready
}

package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
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
	// answered, when set, is called with each answer that gave the
	// stream (the batched writer's room check, batchedOutput.noteRoom).
	answered func(streams.OutputsReply)

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
	r, err := o.request(ctx)
	if err == nil && o.answered != nil {
		o.answered(r)
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

func (o *outputStream) request(ctx context.Context) (streams.OutputsReply, error) {
	rctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	var r streams.OutputsReply
	m, err := o.nc.RequestWithContext(rctx, streams.OutputsSubject(o.id), nil)
	if errors.Is(err, nats.ErrNoResponders) {
		return r, errors.New("no frontend answers " + streams.OutputsSubject(o.id))
	}
	if err != nil {
		return r, fmt.Errorf("ask %s: %w", streams.OutputsSubject(o.id), err)
	}
	if err := json.Unmarshal(m.Data, &r); err != nil {
		return r, fmt.Errorf("ask %s: the answer does not decode: %w", streams.OutputsSubject(o.id), err)
	}
	if r.Error != "" {
		return r, fmt.Errorf("ask %s: %s", streams.OutputsSubject(o.id), r.Error)
	}
	if want := streams.WorkerOutputStream(o.id); r.Stream != want {
		return r, fmt.Errorf("ask %s: answered stream %q, want %q", streams.OutputsSubject(o.id), r.Stream, want)
	}
	return r, nil
}

// room asks again, and returns the room the answer shows in the stream
// and the stream's limit. Asking is what a worker may do under every
// documented permission set: the shared one grants no stream's info.
func (o *outputStream) room(ctx context.Context) (room, limit int64, err error) {
	r, err := o.request(ctx)
	if err != nil {
		return 0, 0, err
	}
	room, limit = replyRoom(r)
	return room, limit, nil
}

// replyRoom is the room and the limit an answer shows (an answer without
// a limit: no limit).
func replyRoom(r streams.OutputsReply) (room, limit int64) {
	if r.MaxBytes <= 0 {
		return math.MaxInt64, math.MaxInt64
	}
	return r.MaxBytes - int64(r.Used), r.MaxBytes
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

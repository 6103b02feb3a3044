package frontend

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/migrations"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/services/retention"
	"github.com/baton-dev/baton/streams"
)

// The request log's lifecycle, as this frontend takes part in it
// (services/retention): it refuses new requests above the high-water
// mark, ends a request whose events can no longer be stored, and
// compacts the finished requests it owns.

// admitLog refuses a new request id while its partition is above the
// high-water mark, or when the log refused the append of its accepted
// event at a limit (err, from that append): a *retention.FullError.
func (fe *Frontend) admitLog(id string, err error) error {
	if err == nil {
		return fe.room.Admit(id)
	}
	if errors.Is(err, streams.ErrStreamFull) {
		fe.room.Refused(id)
		return &retention.FullError{Stream: fe.parts.StreamOf(id), Used: 1, HighWater: fe.room.HighWater()}
	}
	return err
}

// writeRecordError answers a request whose accepted event could not be
// stored: 503 log_full (with Retry-After) when the log is full, 500
// log_unavailable otherwise.
func writeRecordError(w http.ResponseWriter, what string, err error) {
	var full *retention.FullError
	if errors.As(err, &full) {
		w.Header().Set("Retry-After", retryAfter(retention.RetryAfter))
		writeError(w, http.StatusServiceUnavailable, "service_unavailable", codeLogFull, full.Error())
		return
	}
	writeError(w, http.StatusInternalServerError, "server_error", "log_unavailable", fmt.Sprintf("could not record %s: %v", what, err))
}

// codeLogFull is the error code of a request refused or ended because the
// request log is full.
const codeLogFull = migrations.CodeLogFull

// logFullRetry spaces the tries to store the failure of a request the log
// had no room for; logFullPatience bounds them.
const (
	logFullRetry    = time.Second
	logFullPatience = 5 * time.Minute
)

// failUnstored ends request t here when the log refused its failure ev at
// a limit: its clients get the error at once (the failure is folded
// locally), and the failure is stored once there is room again, quietly,
// for at most logFullPatience. It reports whether it was stored.
func (fe *Frontend) failUnstored(ctx context.Context, t *tracked, ev events.RequestFailed) bool {
	fe.room.Refused(t.id)
	t.f.apply(fe.events.Envelope(events.ID(t.id, "failed"), t.id, ev))
	t.f.changed.Notify()
	fe.log.Error("request log full: request ended", "request_id", t.id, "code", ev.Code)
	deadline := time.Now().Add(logFullPatience)
	for ctx.Err() == nil && time.Now().Before(deadline) {
		fe.wait(ctx, time.Now().Add(logFullRetry), nil, nil)
		ok, err := fe.decide(ctx, t, events.ID(t.id, "failed"), ev)
		if ok || (err == nil && !fe.room.Full(t.id)) {
			return true
		}
	}
	return false
}

// compact stores the compact record of t, a finished request this frontend
// owns, and purges its deltas (retention.Compact). A decision stored
// meanwhile makes it read the log and try again; it gives up after three
// tries, leaving the deltas for eviction.
func (fe *Frontend) compact(ctx context.Context, t *tracked) {
	if fe.cfg.NoCompaction {
		return
	}
	for range 3 {
		var rec *events.RequestCompacted
		var err error
		owned := false
		seq := t.f.eventsSeq()
		t.f.view(func(p *projections.Request) {
			owned = p.Owner == fe.id && p.Accepted.Choices <= 1
			if owned {
				rec, err = retention.Record(p)
			}
		})
		if !owned || errors.Is(err, retention.ErrNotFinished) {
			return
		}
		if err == nil {
			err = retention.Compact(ctx, fe.events, fe.parts, t.id, rec, seq)
		}
		if err == nil {
			return
		}
		if !errors.Is(err, streams.ErrConflict) {
			if ctx.Err() == nil {
				fe.log.Warn("compact finished request", "request_id", t.id, "err", err)
			}
			return
		}
		fe.catchUp(ctx, t)
	}
}

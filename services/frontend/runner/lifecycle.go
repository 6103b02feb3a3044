package runner

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/services/retention"
	"github.com/baton-dev/baton/streams"
)

// The request log's lifecycle, as this frontend takes part in it
// (services/retention): it refuses new requests above the high-water
// mark, ends a request whose events can no longer be stored, and
// compacts the finished requests it owns.

// lifecycle is this frontend's part in the request log's lifecycle:
// admission at the high-water mark, the ends of the requests it owns
// (ends.go) and their compaction. It is safe for concurrent use.
type lifecycle struct {
	id           string // this frontend's
	log          *slog.Logger
	events       *streams.Log
	parts        streams.Partitions // set by Start (Runner.provision) before anything reads it
	room         *retention.Monitor
	fleet        Fleet // who is live: whether they all read compact records
	decisions    decisions
	noCompaction bool        // Config.NoCompaction
	holdBack     atomic.Bool // compaction was held back for an earlier release's frontend (said once)
	ended        pendingEnds // ends the ends place did not take yet (ends.go)
}

// LogHealth says why the request log cannot take new requests ("" when it
// can): the partitions above the high-water mark.
func (rn *Runner) LogHealth() string { return rn.room.Health() }

// admit refuses a new request id while its partition is above the
// high-water mark, or when the log refused the append of its accepted
// event at a limit (err, from that append): a *retention.FullError.
func (lc *lifecycle) admit(id string, err error) error {
	if err == nil {
		return lc.room.Admit(id)
	}
	if errors.Is(err, streams.ErrStreamFull) {
		lc.room.Refused(id)
		return &retention.FullError{Stream: lc.parts.StreamOf(id), Used: 1, HighWater: lc.room.HighWater()}
	}
	return err
}

// logFullRetry spaces the tries to store the failure of a request the log
// had no room for; logFullPatience bounds them.
const (
	logFullRetry    = time.Second
	logFullPatience = 5 * time.Minute
)

// endHere ends request t, which this frontend owns, with ev without the
// request log: the failure is folded locally, so its clients here get the
// error at once, and stored in the ends place (storeEnd), which every
// reader of this release folds and which needs no expected sequence.
func (lc *lifecycle) endHere(ctx context.Context, t *Request, ev events.RequestFailed, why string) {
	t.f.apply(lc.events.Envelope(events.ID(t.id, "failed"), t.id, ev))
	t.f.changed.Notify()
	lc.log.Error(why, "request_id", t.id, "code", ev.Code)
	lc.storeEnd(ctx, t)
}

// failUnstored ends request t here when the log refused its failure ev at
// a limit: its clients get the error at once (the failure is folded
// locally), and the failure is stored once there is room again, quietly,
// for at most logFullPatience. It reports whether it was stored.
func (lc *lifecycle) failUnstored(ctx context.Context, t *Request, ev events.RequestFailed) bool {
	lc.room.Refused(t.id)
	lc.endHere(ctx, t, ev, "request log full: request ended") // where deltas cannot crowd it out; the log gets it too once there is room
	deadline := time.Now().Add(logFullPatience)
	for ctx.Err() == nil && time.Now().Before(deadline) {
		waitStep(ctx, time.Now().Add(logFullRetry), nil, nil, nil)
		ok, err := lc.decisions.append(ctx, t, events.ID(t.id, "failed"), ev)
		if ok || (err == nil && !lc.room.Full(t.id)) {
			return true
		}
	}
	return false
}

// everyoneReadsCompacted reports whether every live frontend folds compact
// records. During a rolling upgrade from a release that does not, finished
// requests keep their deltas (eviction still bounds the log), and the first
// time this frontend holds back it says why.
func (lc *lifecycle) everyoneReadsCompacted() bool {
	for _, f := range lc.fleet.Frontends() {
		if !f.ReadsCompacted {
			if lc.holdBack.CompareAndSwap(false, true) {
				lc.log.Info("not compacting finished requests: a live frontend of an earlier release does not read compact records",
					"frontend", f.FrontendID)
			}
			return false
		}
	}
	return true
}

// compact stores the compact record of t, a finished request this frontend
// owns, and purges its deltas (retention.Compact). A decision stored
// meanwhile makes it read the log and try again; it gives up after three
// tries, leaving the deltas for eviction. It reports whether the log holds
// the record (stored now or before).
func (lc *lifecycle) compact(ctx context.Context, t *Request) bool {
	if lc.noCompaction || !lc.everyoneReadsCompacted() {
		return false
	}
	for range 3 {
		var plan *retention.Plan
		var err error
		var through uint64
		var subjects []string
		owned := false
		seq := t.f.eventsSeq()
		t.f.view(func(p *projections.Request) {
			owned = p.Owner == lc.id && p.Accepted.Choices <= 1
			if owned {
				plan, err = retention.Record(p)
				subjects, through = retention.Subjects(p), p.CompactedThrough()
			}
		})
		if !owned || errors.Is(err, retention.ErrNotFinished) {
			return false
		}
		if err == nil {
			err = retention.Compact(ctx, lc.events, lc.parts, t.id, plan, subjects, seq, through, lc.room.Purges())
		}
		if err == nil || errors.Is(err, retention.ErrPurgeSkipped) { // counted by the Pacer
			return true
		}
		if !errors.Is(err, streams.ErrConflict) {
			if errors.Is(err, streams.ErrStreamFull) {
				lc.room.Refused(t.id)
			} else if ctx.Err() == nil {
				lc.log.Warn("compact finished request", "request_id", t.id, "err", err)
			}
			return false
		}
		catchUp(ctx, t)
	}
	return false
}

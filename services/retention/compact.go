package retention

import (
	"context"
	"errors"
	"fmt"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/streams"
)

// ErrNotFinished means a request cannot be compacted yet: it still runs.
var ErrNotFinished = errors.New("retention: request not finished")

// Compact stores rec, the compact record of request id, and then purges the
// request's tokens subjects. eventsSeq is the last sequence the record's
// fold saw on the events subject: the record is appended expecting it, so a
// decision stored meanwhile (or another frontend's record) makes this a
// streams.ErrConflict, and the caller reads again. A nil rec (the record is
// stored already) only purges: that finishes a compaction that stopped
// between its two steps (a crash). Purging is idempotent, so repeating
// Compact is harmless.
func Compact(ctx context.Context, log *streams.Log, p streams.Partitions, id string, rec *events.RequestCompacted, eventsSeq uint64) error {
	if rec != nil {
		env := log.Envelope(events.ID(id, "compacted"), id, *rec)
		if _, err := log.Append(ctx, streams.RequestEvents(id), env, int64(eventsSeq)); err != nil {
			return fmt.Errorf("compact %s: %w", id, err)
		}
	}
	if _, err := streams.PurgeTokens(ctx, log.JetStream(), p, id); err != nil {
		return fmt.Errorf("compact %s: %w", id, err)
	}
	return nil
}

// Record returns r's compact record, nil when r is compacted already, and
// ErrNotFinished while r runs.
func Record(r *projections.Request) (*events.RequestCompacted, error) {
	if r.Compacted() {
		return nil, nil
	}
	if !r.Status.Terminal() {
		return nil, fmt.Errorf("%w: %s", ErrNotFinished, r.Accepted.RequestID)
	}
	rec, err := r.Compact()
	if err != nil {
		return nil, err
	}
	return &rec, nil
}

// Read folds request id from the log, and returns the last sequence of its
// events subject (what Compact expects). streams.ErrNotFound when the log
// holds nothing of it.
func Read(ctx context.Context, log *streams.Log, p streams.Partitions, id string) (*projections.Request, uint64, error) {
	r := projections.NewRequest()
	var eventsSeq uint64
	subj := streams.RequestEvents(id)
	for e, err := range streams.ReadRequest(ctx, log.JetStream(), p, id, 1) {
		if err != nil {
			return nil, 0, err
		}
		if e.Stored == subj {
			eventsSeq = max(eventsSeq, e.Seq)
		}
		r.Apply(e)
	}
	return r, eventsSeq, nil
}

// CompactFromLog reads request id and compacts it, reading again when
// another writer came first. It is what `baton compact` does, and what a
// frontend does for a finished request it does not follow.
func CompactFromLog(ctx context.Context, log *streams.Log, p streams.Partitions, id string) error {
	for try := 0; ; try++ {
		var r *projections.Request
		var seq uint64
		err := streams.Retry(ctx, func(ctx context.Context) error { // through a leader election
			var err error
			r, seq, err = Read(ctx, log, p, id)
			return err
		})
		if err != nil {
			return err
		}
		if !r.Known() {
			return fmt.Errorf("%w: %s", streams.ErrNotFound, id)
		}
		rec, err := Record(r)
		if err != nil {
			return err
		}
		err = Compact(ctx, log, p, id, rec, seq)
		if !errors.Is(err, streams.ErrConflict) || try == 2 {
			return err
		}
	}
}

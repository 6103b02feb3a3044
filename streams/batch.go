package streams

import (
	"errors"
	"io"
	"strings"

	"github.com/baton-dev/baton/events"
	"github.com/nats-io/nats.go"
)

// The subjects of issue 33's write path (docs/internals.md, "The write path
// of many tokens per message"): a worker stores its batches
// (events.BatchEncoder) for the requests that one frontend follows on
// WorkerOutput(worker, owner), and a stream's RePublish copies them to the
// same subject under baton.live. Only a worker's batched writer writes them,
// for a dispatch that asks, which no frontend sends yet.
const (
	outPrefix     = "baton.out."
	liveOutPrefix = "baton.live.out."
	outDest       = ".d."
)

// WorkerOutput is the subject of worker's batches for the requests owner
// follows.
func WorkerOutput(worker, owner string) string { return outPrefix + worker + outDest + owner }

// ParseWorkerOutput returns the worker and the owner that a WorkerOutput
// subject, stored or republished, names; ok is false for any other subject.
func ParseWorkerOutput(subj string) (worker, owner string, ok bool) {
	rest, ok := strings.CutPrefix(StoredSubject(subj), outPrefix)
	if !ok {
		return "", "", false
	}
	worker, owner, ok = strings.Cut(rest, outDest)
	if !ok || !ValidID(worker) || !ValidID(owner) {
		return "", "", false
	}
	return worker, owner, true
}

// BatchEntries reads m, a batch stored on (or republished from) a
// WorkerOutput subject, into the envelopes of its entries in order, each as
// the fold takes it from the subjects of the per-token write path:
//   - an attempt's output (a delta, its completion, its failure) as stored
//     on that attempt's tokens subject of the batch's worker, so that the
//     fold takes it only for an attempt routed to that worker
//     (projections' confinement rule, unchanged: IgnoredNotRouted else);
//   - any other entry on the batch's own subject, which no reader folds
//     (IgnoredWrongSubject): a worker's batch holds no decision.
//
// An entry carries no stream sequence (Seq 0): the batch's is a position in
// the worker's output, not in the request's partition. An entry that
// cannot be read comes back as events.Unreadable, as Decode gives such a
// message, and the rest are read on; a batch whose body cannot be framed
// returns the entries before the fault and an error wrapping
// events.ErrBadBatch, as does a message on another subject.
func BatchEntries(m *nats.Msg) (worker string, entries []events.Envelope, err error) {
	worker, _, ok := ParseWorkerOutput(m.Subject)
	if !ok {
		return "", nil, errors.Join(events.ErrBadBatch, errors.New("streams: a batch on "+m.Subject+", not a worker's output subject"))
	}
	d, err := events.DecodeBatch(events.Header(m.Header), m.Data)
	if err != nil {
		return worker, nil, err
	}
	stored := StoredSubject(m.Subject)
	for {
		e, err := d.Next()
		switch {
		case errors.Is(err, io.EOF):
			return worker, entries, nil
		case errors.Is(err, events.ErrBadBatch):
			return worker, entries, err
		}
		e.Stored = stored
		if k, ok := events.AttemptOutput(e.Event); ok && e.Subject != "" {
			e.Stored = RequestTokens(e.Subject, k, worker)
		}
		entries = append(entries, e)
	}
}

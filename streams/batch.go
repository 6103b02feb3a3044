package streams

import (
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"strings"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"
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

// LiveWorkerOutput is the subject on which WorkerOutput(worker, owner)'s
// batches are republished.
func LiveWorkerOutput(worker, owner string) string { return liveOutPrefix + worker + outDest + owner }

// LiveWorkerOutputs matches the republished batches of every worker for
// the requests owner follows: a frontend's one subscription to them.
func LiveWorkerOutputs(owner string) string { return liveOutPrefix + "*" + outDest + owner }

// OutputBatch is one batch of a worker's output as read back: its stream
// sequence and its entries (BatchEntries).
type OutputBatch struct {
	Seq     uint64
	Entries []events.Envelope
}

// ReadWorkerOutput reads the batches worker stored for owner's requests
// (WorkerOutput(worker, owner)) in their order: from sequence from, or,
// with from 0, from the first stored at since or later (the server's
// clock), up to sequence to included (0: to the last). A batch that
// cannot be read whole yields what it framed, and the read goes on: a
// worker's junk is its own. ErrNotFound when the stream is gone.
func ReadWorkerOutput(ctx context.Context, js jetstream.JetStream, worker, owner string, from uint64, since time.Time, to uint64) iter.Seq2[OutputBatch, error] {
	subject, stream := WorkerOutput(worker, owner), WorkerOutputStream(worker)
	return func(yield func(OutputBatch, error) bool) {
		for {
			opts := []jetstreamext.GetBatchOpt{jetstreamext.GetBatchSubject(subject), jetstreamext.GetBatchMaxBytes(batchBytes)}
			if from == 0 && !since.IsZero() {
				opts = append(opts, jetstreamext.GetBatchStartTime(since))
			} else {
				opts = append(opts, jetstreamext.GetBatchSeq(max(from, 1)))
			}
			msgs, err := jetstreamext.GetBatch(ctx, js, stream, batchSize, opts...)
			if err != nil {
				yield(OutputBatch{}, outputReadErr(subject, err))
				return
			}
			n, pending := 0, ""
			for m, err := range msgs {
				if errors.Is(err, jetstreamext.ErrNoMessages) {
					break
				}
				if err != nil {
					yield(OutputBatch{}, outputReadErr(subject, err))
					return
				}
				if to != 0 && m.Sequence > to {
					return
				}
				n++
				from, pending = m.Sequence+1, m.Header.Get("Nats-Num-Pending")
				if !yield(outputBatch(m), nil) {
					return
				}
			}
			if to != 0 && from > to {
				return
			}
			if n == 0 || pending == "0" {
				outputBehind(ctx, js, stream, subject, from, to, yield)
				return
			}
		}
	}
}

func outputBatch(m *jetstream.RawStreamMsg) OutputBatch {
	_, entries, _ := BatchEntries(&nats.Msg{Subject: m.Subject, Header: m.Header, Data: m.Data})
	return OutputBatch{Seq: m.Sequence, Entries: entries}
}

// outputBehind reads from the stream's leader what is stored on subject
// from sequence from (up to to, 0: the end) that the replica which
// answered the direct gets had not returned, as readBehind does for the
// request log: a worker stream's replica may lag its leader, and an
// attempt's last batch, its end, has nothing after it to show the gap.
// No leader to ask (an election): what the replica said stands.
func outputBehind(ctx context.Context, js jetstream.JetStream, stream, subject string, from, to uint64, yield func(OutputBatch, error) bool) {
	last, err := leaderGet(ctx, js, stream, subject, 0, true)
	if err != nil || last == nil {
		return
	}
	end := last.Sequence
	if to != 0 {
		end = min(end, to)
	}
	for from <= end {
		m, err := leaderGet(ctx, js, stream, subject, from, false)
		if err != nil || m == nil || m.Sequence > end {
			return
		}
		from = m.Sequence + 1
		if !yield(outputBatch(m), nil) {
			return
		}
	}
}

func outputReadErr(subject string, err error) error {
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("read %s: %w", subject, ErrNotFound)
	}
	return fmt.Errorf("read %s: %w", subject, err)
}

// AppendOutputFence stores ev, a frontend's fence of an attempt (an
// AttemptFailed), as a batch of one entry on WorkerOutput(worker, owner):
// ordered with the worker's batches, so that every reader of the attempt
// accepts what was stored before it and nothing after. It returns the
// fence's stream sequence. source is the frontend's, id the fence's event
// id (also the message id: a retried fence is stored once).
func AppendOutputFence(ctx context.Context, js jetstream.JetStream, worker, owner, source, id string, ev events.AttemptFailed) (uint64, error) {
	enc, err := events.NewBatchEncoder(source)
	if err != nil {
		return 0, err
	}
	if err := enc.AppendEvent(events.Envelope{ID: id, Subject: ev.RequestID, Time: time.Now(), Event: ev}); err != nil {
		return 0, err
	}
	h, data, err := enc.Message(nil, id+".batch")
	if err != nil {
		return 0, err
	}
	m := &nats.Msg{Subject: WorkerOutput(worker, owner), Header: nats.Header(h), Data: data}
	ack, err := js.PublishMsg(ctx, m, jetstream.WithMsgID(id), jetstream.WithExpectStream(WorkerOutputStream(worker)))
	if err != nil {
		return 0, fmt.Errorf("fence %s: %w", m.Subject, err)
	}
	return ack.Sequence, nil
}

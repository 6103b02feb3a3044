package retention

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go"
)

// ErrNotFinished means a request cannot be compacted yet: it still runs.
var ErrNotFinished = errors.New("retention: request not finished")

// Plan is what compacting one finished request writes (Record builds it):
// its compact record, and the carry for readers that predate compact
// records (projections.Request.Carry) on the tokens subject of its last
// attempt.
type Plan struct {
	ID      string
	Record  events.RequestCompacted
	Subject string         // the carry's subject ("" when nothing is carried)
	Carry   []events.Event // the answer as one delta, and its completion
}

// Compact carries out plan: (1) the carry is appended on the last
// attempt's tokens subject, (2) the record on the events subject,
// expecting eventsSeq (the last sequence the record's fold saw there), so
// a decision stored meanwhile (or another frontend's record) makes it a
// streams.ErrConflict and the caller reads again, (3) the tokens subjects
// are purged of everything the record covers (stream sequences up to
// Record.Through), which leaves the carry; subjects are the request's
// tokens subjects (Subjects), and pace takes its turn for the purge (nil:
// at once). Every reader folds the same request after each step, so a
// frontend that dies between two leaves a request that reads the same; a
// nil plan (the record is stored already) only purges, up to through, which
// finishes such a compaction. Repeating Compact is harmless: a second carry
// is a duplicate to every reader, a second record a conflict, a purge
// idempotent.
func Compact(ctx context.Context, log *streams.Log, p streams.Partitions, id string, plan *Plan, subjects []string, eventsSeq, through uint64, pace *Pacer) error {
	if plan != nil {
		for i, ev := range plan.Carry {
			if err := carry(ctx, log, plan.Subject, projections.CarryID(id, i), id, ev); err != nil {
				return fmt.Errorf("compact %s: carry: %w", id, err)
			}
		}
		env := log.Envelope(events.ID(id, "compacted"), id, plan.Record)
		if _, err := log.Append(ctx, streams.RequestEvents(id), env, int64(eventsSeq)); err != nil {
			return fmt.Errorf("compact %s: %w", id, err)
		}
		through = plan.Record.Through
	}
	err := pace.Do(ctx, p.StreamOf(id), func(ctx context.Context) error {
		_, err := streams.PurgeSubjectsThrough(ctx, log.JetStream(), p, id, subjects, through)
		return err
	})
	if err != nil {
		return fmt.Errorf("compact %s: %w", id, err)
	}
	return nil
}

// Subjects are r's tokens subjects: one for each of its attempts, named by
// the attempt's routed decision. Nothing else of the request's stores
// tokens: a worker writes only an attempt routed to it (a held dispatch
// stores nothing until its decision is stored), a frontend fences only
// such an attempt, and a compaction carries on the last one. What a worker
// writes beside them is junk, which the Guard purges (guard.go) and
// eviction removes with the request.
func Subjects(r *projections.Request) []string {
	var subjects []string
	for _, a := range r.Attempts {
		s := streams.RequestTokens(r.Accepted.RequestID, a.Attempt, a.WorkerID)
		if !slices.Contains(subjects, s) {
			subjects = append(subjects, s)
		}
	}
	return subjects
}

// carry appends one event of a plan's carry under event id evid: a delta in
// a delta's own encoding (its text as the data, when it carries no more),
// anything else as every event is.
func carry(ctx context.Context, log *streams.Log, subject, evid, id string, ev events.Event) error {
	d, ok := ev.(events.TokensGenerated)
	if !ok {
		_, err := log.Append(ctx, subject, log.Envelope(evid, id, ev), -1)
		return err
	}
	enc, err := events.NewDeltaEncoder(log.Source(), id, d.Attempt)
	if err != nil {
		return err
	}
	h, data, err := enc.Encode(evid, time.Now(), d)
	if err != nil {
		return err
	}
	_, err = log.AppendMsg(ctx, &nats.Msg{Subject: subject, Header: nats.Header(h), Data: data}, -1)
	return err
}

// Record returns r's compaction plan: nil when r is compacted already (then
// r.CompactedThrough is what Compact still purges up to), ErrNotFinished
// while r runs.
func Record(r *projections.Request) (*Plan, error) {
	if r.Compacted() {
		return nil, nil
	}
	if !r.Status.Terminal() {
		return nil, fmt.Errorf("%w: %s", ErrNotFinished, r.Accepted.RequestID)
	}
	plan := &Plan{ID: r.Accepted.RequestID}
	k, worker, evs := r.Carry()
	if k >= 0 && len(evs) > 0 {
		plan.Subject, plan.Carry = streams.RequestTokens(plan.ID, k, worker), evs
	}
	rec, err := r.Compact()
	if err != nil {
		return nil, err
	}
	plan.Record = rec
	return plan, nil
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
		plan, err := Record(r)
		if err != nil {
			return err
		}
		err = Compact(ctx, log, p, id, plan, Subjects(r), seq, r.CompactedThrough(), nil)
		if !errors.Is(err, streams.ErrConflict) || try == 2 {
			return err
		}
	}
}

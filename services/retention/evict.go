package retention

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/streams"
)

// The operator's lever (`baton evict`): a request removed from the log by
// hand, running or not, without leaving a worker writing to purged
// subjects or a frontend waiting on a request that is gone.

// Evicted says what EvictByHand did to one request.
type Evicted struct {
	ID string
	// Cancelled: it was running, and was cancelled (kill) first: its end
	// stored (in the log when it fitted, in the ends place in any case),
	// its worker told to stop.
	Cancelled bool
	Purged    uint64 // messages purged from the log
}

// EvictReason is the reason the cancel of a request evicted by hand records.
const EvictReason = "evicted by an operator (baton evict)"

// EvictByHand removes request id from the log. A request still running is
// first cancelled as a kill: the cancel appended to its events subject when
// the log has room (every follower ends its streams), its end stored in the
// ends place in any case (streams.StoreEnd: readers that still follow it,
// its owner included, fold the end from there once its subjects are gone),
// and a kill sent to the worker of its current attempt, so that nothing
// keeps writing to its subjects; grace later its subjects are purged. The
// end of a request that was running stays in the ends place (it ages out
// with the log, and no reader takes it for a later request of the same id);
// that of a finished one is purged with it. streams.ErrNotFound when the
// log holds nothing of id.
func EvictByHand(ctx context.Context, log *streams.Log, p streams.Partitions, id string, grace time.Duration) (Evicted, error) {
	out := Evicted{ID: id}
	var r *projections.Request
	var eventsSeq uint64
	for try := 0; ; try++ {
		var err error
		if r, eventsSeq, err = Read(ctx, log, p, id); err != nil {
			return out, err
		}
		if !r.Known() || r.Status.Terminal() {
			break
		}
		cancel := events.RequestCancelled{RequestID: id, Mode: events.CancelKill, Reason: EvictReason}
		env := log.Envelope(events.ID(id, "cancelled", events.CancelKill, "evict"), id, cancel)
		_, err = log.Append(ctx, streams.RequestEvents(id), env, int64(eventsSeq))
		if errors.Is(err, streams.ErrConflict) && try < 2 {
			continue // a decision came first: read again
		}
		if err != nil && !errors.Is(err, streams.ErrStreamFull) && !errors.Is(err, streams.ErrConflict) {
			return out, fmt.Errorf("evict %s: cancel: %w", id, err)
		}
		r.Apply(env)
		end, _ := r.End(strings.TrimPrefix(log.Source(), "baton/frontend/"))
		if _, err := streams.StoreEnd(ctx, log, events.ID(id, "ended"), end, r.AcceptedSeq()); err != nil {
			return out, fmt.Errorf("evict %s: store its end: %w", id, err)
		}
		if cur, ok := r.Current(); ok && !cur.Closed {
			cmd, _ := json.Marshal(streams.Command{RequestID: id, Attempt: cur.Attempt, Kind: streams.CommandCancel,
				Mode: events.CancelKill, Reason: EvictReason})
			_ = log.JetStream().Conn().Publish(streams.CommandSubject(cur.WorkerID), cmd)
		}
		out.Cancelled = true
		t := time.NewTimer(grace)
		select {
		case <-ctx.Done():
			t.Stop()
			return out, ctx.Err()
		case <-t.C:
		}
		break
	}
	n, err := streams.Evict(ctx, log.JetStream(), p, id)
	out.Purged = n
	if err != nil {
		return out, fmt.Errorf("evict %s: %w", id, err)
	}
	if !out.Cancelled {
		if err := streams.PurgeEnd(ctx, log.JetStream(), id); err != nil {
			return out, fmt.Errorf("evict %s: purge its end: %w", id, err)
		}
	}
	return out, nil
}

// TenantRequests lists the requests of tenant whose first event the log
// stored before before, oldest first in each partition: the ids of the form
// <tenant>:<id> (streams.TenantRequestID) whose events subjects the log
// holds.
func TenantRequests(ctx context.Context, log *streams.Log, p streams.Partitions, tenant string, before time.Time) ([]string, error) {
	js := log.JetStream()
	var ids []string
	for _, stream := range p.Streams() {
		u, err := streams.ReadUsage(ctx, js, stream)
		if err != nil {
			return ids, err
		}
		seen := map[string]bool{}
		for seq := max(u.FirstSeq, 1); seq <= u.LastSeq; {
			batch, err := streams.NextStoredEventsBatch(ctx, js, stream, seq, evictBatch, 1<<20)
			if err != nil {
				return ids, fmt.Errorf("list the requests of %s in %s: %w", tenant, stream, err)
			}
			if len(batch) == 0 {
				break
			}
			seq = batch[len(batch)-1].Seq + 1
			for _, st := range batch {
				if st.RequestID == "" || seen[st.RequestID] {
					continue
				}
				seen[st.RequestID] = true
				if t, _ := streams.SplitRequestID(st.RequestID); t != tenant {
					continue
				}
				m, err := streams.MsgAt(ctx, js, stream, st.Seq) // its first event there: when it began
				if err != nil {
					return ids, err
				}
				if m != nil && m.Time.Before(before) {
					ids = append(ids, st.RequestID)
				}
			}
		}
	}
	return ids, nil
}

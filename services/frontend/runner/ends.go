package runner

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/internal/every"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/streams"
)

// A request's end always fits (docs/internals.md, "Terminal facts always
// fit"): when the request log cannot store the end of a request this
// frontend owns (it is full), or the end is not the last word of its events
// subject (the compact record that would carry it was not stored), the
// owner stores it in the ends place (streams.StoreEnd), which deltas cannot
// fill. Every reader of this release folds it from there
// (streams.ReadRequest), and eviction takes the request as ended. An end the
// ends place did not take either (it did not answer) is kept here and
// stored again, and until then the retention monitor asks this frontend
// (Ended).

// Bounds of the ends kept to store again.
const (
	endsKept       = 4096
	endsRetryEvery = time.Second
)

// pendingEnds are the ends this frontend knows and has not stored yet.
type pendingEnds struct {
	mu   sync.Mutex
	ends map[string]pendingEnd // by request id
	gen  uint64                // counts the ends kept
}

type pendingEnd struct {
	ev          events.RequestEnded
	acceptedSeq uint64
}

func (p *pendingEnds) keep(ev events.RequestEnded, acceptedSeq uint64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ends == nil {
		p.ends = map[string]pendingEnd{}
	}
	if _, ok := p.ends[ev.RequestID]; !ok && len(p.ends) >= endsKept {
		return false
	}
	p.ends[ev.RequestID] = pendingEnd{ev, acceptedSeq}
	p.gen++
	return true
}

func (p *pendingEnds) generation() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.gen
}

func (p *pendingEnds) has(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.ends[id]
	return ok
}

func (p *pendingEnds) all() []pendingEnd {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]pendingEnd, 0, len(p.ends))
	for _, e := range p.ends {
		out = append(out, e)
	}
	return out
}

func (p *pendingEnds) done(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.ends, id)
}

// endID is the event id of request id's end in the ends place: one per
// request, so every try of it is deduplicated.
func endID(id string) string { return events.ID(id, "ended") }

// storeEnd stores the end of t, a request this frontend owns and has ended
// (its fold is terminal), in the ends place; when the ends place does not
// take it, it is kept and stored again (retryEnds).
func (lc *lifecycle) storeEnd(ctx context.Context, t *Request) {
	var ev events.RequestEnded
	var ok bool
	var accepted uint64
	t.f.view(func(p *projections.Request) {
		if p.Owner == lc.id {
			ev, ok = p.End(lc.id)
			accepted = p.AcceptedSeq()
		}
	})
	if !ok {
		return
	}
	if _, err := streams.StoreEnd(ctx, lc.events, endID(t.id), ev, accepted); err != nil {
		if lc.ended.keep(ev, accepted) {
			lc.log.Warn("store a request's end in the ends place: kept to store again", "request_id", t.id, "err", err)
		} else {
			lc.log.Error("store a request's end in the ends place: too many kept, dropped", "request_id", t.id, "err", err)
		}
	}
}

// retryEnds stores the ends kept by storeEnd again, every endsRetryEvery,
// until ctx is done.
func (lc *lifecycle) retryEnds(ctx context.Context) {
	every.Tick(ctx, endsRetryEvery, func() {
		for _, e := range lc.ended.all() {
			if _, err := streams.StoreEnd(ctx, lc.events, endID(e.ev.RequestID), e.ev, e.acceptedSeq); err == nil {
				lc.ended.done(e.ev.RequestID)
			}
		}
	})
}

// Ended reports whether this frontend ended request id, which it owns, and
// could store its end neither in the log nor in the ends place yet (the
// retention monitor's question: such a request may be evicted all the
// same). A request whose end is stored somewhere is not reported: eviction
// finds it there, and evicting one that just ended here could purge it
// under its compaction.
func (lc *lifecycle) Ended(id string) bool { return lc.ended.has(id) }

// EndsKnown changes whenever this frontend keeps an end it could not store
// (the retention monitor's cue that Ended may say more than the ends place).
func (lc *lifecycle) EndsKnown() uint64 { return lc.ended.generation() }

// storeKill stores a kill of p, a running request, in the ends place when
// the log refused its cancel (full): its owner and every follower fold the
// end from there (the ends place republishes it), and the worker of its
// current attempt is told at once.
func (lc *lifecycle) storeKill(ctx context.Context, p *projections.Request, reason, tenant string) error {
	id := p.Accepted.RequestID
	ev := events.RequestCancelled{RequestID: id, Mode: events.CancelKill, Reason: reason, Tenant: tenant}
	p.Apply(lc.events.Envelope(events.ID(id, "cancelled", events.CancelKill), id, ev))
	end, ok := p.End(lc.id)
	if !ok {
		return nil
	}
	if _, err := streams.StoreEnd(ctx, lc.events, endID(id), end, p.AcceptedSeq()); err != nil {
		return fmt.Errorf("cancel %s: store its end: %w", id, err)
	}
	lc.room.Refused(id)
	return nil
}

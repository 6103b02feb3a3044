package retention

import (
	"context"
	"sync"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/streams"
)

// Eviction never stalls (docs/internals.md, "Terminal facts always fit"):
//
//   - a request is ended for eviction when its end is in the ends place
//     (streams.ReadEnd: its owner stored it there, the log being full) or
//     its live owner says it ended it (Ends.Ended), whether or not the end
//     reached the request log; its end is purged with it;
//   - a pass that evicted nothing is not repeated until something it looked
//     at changed: the partition (its first and last sequence, its message
//     count), the ends place (its last sequence), or what this frontend's
//     runner knows of ends (Ends.EndsKnown). A full log that nothing
//     changes costs one reading of each per Interval, not a rescan.

// Ends is what the frontend's runner knows of the ends of the requests it
// owns.
type Ends interface {
	// Ended reports whether this frontend owns request id and ended it.
	Ended(id string) bool
	// EndsKnown changes whenever Ended may answer true for a request it
	// did not before without the ends place changing (an end that could
	// not be stored there).
	EndsKnown() uint64
}

// endsState is the monitor's part of the above.
type endsState struct {
	mu        sync.Mutex
	known     Ends
	fruitless map[string]passKey // by stream: the state at the last pass that evicted nothing
	inPlace   map[string]bool    // by stream: the ends place held something at the pass's start
}

// passKey is what an eviction pass of a partition depends on.
type passKey struct {
	first, last, msgs uint64
	ends, known       uint64
}

// SetEnds tells the monitor what the runner knows of ends, before Run.
// Without it only the ends place is asked.
func (m *Monitor) SetEnds(e Ends) {
	m.ends.mu.Lock()
	defer m.ends.mu.Unlock()
	m.ends.known = e
}

func (m *Monitor) endsKnown() Ends {
	m.ends.mu.Lock()
	defer m.ends.mu.Unlock()
	return m.ends.known
}

// evictChanged is evict of u's partition unless the last pass over it
// evicted nothing and nothing it depends on changed since.
func (m *Monitor) evictChanged(ctx context.Context, u streams.Usage) {
	key := passKey{first: u.FirstSeq, last: u.LastSeq, msgs: u.Msgs}
	ends, err := streams.ReadUsage(ctx, m.js, streams.EndsStream)
	if err == nil {
		key.ends = ends.LastSeq
	}
	if k := m.endsKnown(); k != nil {
		key.known = k.EndsKnown()
	}
	m.ends.mu.Lock()
	if m.ends.fruitless == nil {
		m.ends.fruitless, m.ends.inPlace = map[string]passKey{}, map[string]bool{}
	}
	last, seen := m.ends.fruitless[u.Stream]
	m.ends.inPlace[u.Stream] = err != nil || ends.Msgs > 0 // when in doubt, ask
	m.ends.mu.Unlock()
	if seen && last == key {
		return
	}
	n := m.evict(ctx, u)
	m.ends.mu.Lock()
	defer m.ends.mu.Unlock()
	if n == 0 {
		m.ends.fruitless[u.Stream] = key
	} else {
		delete(m.ends.fruitless, u.Stream)
	}
}

// endedElsewhere reports whether request id of stream, which the log has
// not ended, has ended all the same: this frontend owns and ended it, or its
// end is in the ends place and is its own (stored after its accepted
// event), not an earlier request's of the same id.
func (m *Monitor) endedElsewhere(ctx context.Context, stream, id string) bool {
	if k := m.endsKnown(); k != nil && k.Ended(id) {
		return true
	}
	m.ends.mu.Lock()
	ask := m.ends.inPlace[stream]
	m.ends.mu.Unlock()
	if !ask {
		return false
	}
	e, err := streams.ReadEnd(ctx, m.js, id)
	if err != nil || e == nil {
		return false
	}
	first, err := streams.NextOnSubject(ctx, m.js, stream, streams.RequestEvents(id), 0)
	if err != nil {
		return false
	}
	return first == nil || e.Event.(events.RequestEnded).Through >= first.Sequence
}

// evictOne purges request id from the log, then its end from the ends
// place (in that order: an end purged first would leave a request in
// flight for good if the second purge failed).
func (m *Monitor) evictOne(ctx context.Context, p streams.Partitions, id string) error {
	if _, err := streams.Evict(ctx, m.js, p, id); err != nil {
		return err
	}
	m.ends.mu.Lock()
	ask := m.ends.inPlace[p.StreamOf(id)] || m.ends.inPlace == nil
	m.ends.mu.Unlock()
	if !ask {
		return nil
	}
	return streams.PurgeEnd(ctx, m.js, id)
}

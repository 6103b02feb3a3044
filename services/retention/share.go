package retention

import (
	"context"

	"github.com/baton-dev/baton/streams"
)

// Tenants' shares of the log (a budgets file's log=F): the frontend
// accounts each tenant's bytes and refuses the new requests of one over
// its share; the Monitor reports the log's capacity, and evicts the oldest
// finished requests of the tenants above their share's eviction mark, as
// it does for the whole log above its own, and before anyone else's.

// tenantEvictRound bounds the requests of tenants over their share one
// round of Run evicts per partition: the frontend's count of a tenant's
// bytes is a few hundred milliseconds behind, and a round that evicted
// all it could find would take far more than the tenant's excess.
const tenantEvictRound = 16

// Capacity is the sum of the request partitions' byte limits at the last
// readings (0 before the first, or when none has a limit).
func (m *Monitor) Capacity() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	var n int64
	for _, u := range m.usage {
		if u.MaxBytes > 0 {
			n += u.MaxBytes
		}
	}
	return n
}

// EvictAt is the fraction of the log above which eviction starts (below
// HighWater); a tenant's share has its eviction mark at the same fraction
// of the share.
func (m *Monitor) EvictAt() float64 { return m.evictAt() }

// SetOverShare gives eviction the tenants above their share's eviction
// mark: over lists them, and is called once per reading. While it lists
// any, each round of Run evicts up to tenantEvictRound of their oldest
// finished requests per partition, whatever the partition's usage; and an
// eviction of the whole log takes theirs first.
func (m *Monitor) SetOverShare(over func() []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.overShare = over
}

// overShareSet is the tenants SetOverShare's function lists now.
func (m *Monitor) overShareSet() map[string]bool {
	m.mu.Lock()
	fn := m.overShare
	m.mu.Unlock()
	if fn == nil {
		return nil
	}
	var set map[string]bool
	for _, t := range fn() {
		if set == nil {
			set = map[string]bool{}
		}
		set[t] = true
	}
	return set
}

// evictOverShare evicts up to limit (0: no bound, until the partition is
// below its band) of the oldest finished requests of tenants over their
// share from u's partition; it reports how many, and whether the partition
// got below its band.
func (m *Monitor) evictOverShare(ctx context.Context, u streams.Usage, limit int) (n int, below bool) {
	over := m.overShareSet()
	if len(over) == 0 {
		return 0, false
	}
	stream, err := m.js.Stream(ctx, u.Stream)
	if err != nil {
		return 0, false
	}
	only := func(id string) bool {
		t, _ := streams.SplitRequestID(id)
		return over[t]
	}
	n, below, _ = m.evictEnded(ctx, stream, u, limit, only)
	if !below && (limit == 0 || n < limit) && ctx.Err() == nil {
		// Finished and not compacted (compaction off or held back): found
		// by folding them, as evict's last pass does.
		more, under := m.evictPass(ctx, stream, u, streams.NextStoredEvents, true, max(0, limit-n), only)
		n, below = n+more, under
	}
	if n > 0 {
		m.evicted.WithLabelValues(u.Stream).Add(float64(n))
	}
	return n, below
}

package quota

import (
	"context"
	"testing"
	"time"
)

// BenchmarkAcquire is what a budget check costs the edge: covered by the
// lease this frontend holds (the common case: no network call), and a
// take (one read and one compare-and-set of the tenant's key on an
// embedded JetStream, in process).
func BenchmarkAcquire(b *testing.B) {
	_, kv := budgetsKV(b)
	ctx := context.Background()
	b.Run("lease", func(b *testing.B) {
		l, _ := New(kv, nil, rpm("alice", 1<<40), Config{Frontend: "fe-a", Lease: time.Hour})
		for b.Loop() {
			if _, _, err := l.Acquire(ctx, "alice", 0); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("take", func(b *testing.B) {
		l, _ := New(kv, nil, rpm("bob", 1<<40), Config{Frontend: "fe-a", Lease: time.Hour})
		for b.Loop() {
			h := l.holder("bob")
			h.cas.Lock()
			err := l.take(ctx, "bob", h, shapeOf(1<<40), shape{}, 1, 0, Budget{RPM: 1 << 40})
			h.cas.Unlock()
			if err != nil {
				b.Fatal(err)
			}
			l.mu.Lock()
			h.exp = time.Time{} // the next take returns this lease and takes another
			l.mu.Unlock()
		}
	})
}

// BenchmarkSlots is what a shared concurrent slot costs the edge: taking
// one with this frontend's view current (one compare-and-set of the
// tenant's key), and with it stale (a read more: another frontend wrote).
func BenchmarkSlots(b *testing.B) {
	_, kv := budgetsKV(b)
	ctx := context.Background()
	b.Run("current", func(b *testing.B) {
		s, _ := NewSlots(kv, nil, Config{Frontend: "fe-a", Lease: time.Hour})
		for b.Loop() {
			if err := s.Acquire(ctx, "alice", 1<<30); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("stale", func(b *testing.B) {
		s, _ := NewSlots(kv, nil, Config{Frontend: "fe-a", Lease: time.Hour})
		for b.Loop() {
			s.holder("bob").fresh = false
			if err := s.Acquire(ctx, "bob", 1<<30); err != nil {
				b.Fatal(err)
			}
		}
	})
}

package quota

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/baton-dev/baton/internal/waitfor"
)

// TestSlotsAcrossFrontends: a cap of 2 holds across two frontends
// together: two slots taken, one at each, refuse the third at either; a
// slot given back at one is taken at the other; the slots of a frontend
// that stops renewing (killed) lapse after one lease, and not before.
func TestSlotsAcrossFrontends(t *testing.T) {
	_, kv := budgetsKV(t)
	c := &clock{now: time.Unix(1_700_000_000, 0)}
	mk := func(id string) *Slots {
		s, err := NewSlots(kv, nil, Config{Frontend: id, Lease: 2 * time.Second, Now: c.Now})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	a, b := mk("fe-a"), mk("fe-b")
	ctx := context.Background()
	if err := a.Acquire(ctx, "alice", 2); err != nil {
		t.Fatal(err)
	}
	if err := b.Acquire(ctx, "alice", 2); err != nil {
		t.Fatal(err)
	}
	if n, err := b.Open(ctx, "alice"); err != nil || n != 2 {
		t.Fatalf("open across both: %d, %v; want 2", n, err)
	}
	var full *SlotsFullError
	for _, s := range []*Slots{a, b} {
		if err := s.Acquire(ctx, "alice", 2); !errors.As(err, &full) || full.Limit != 2 {
			t.Fatalf("%s: a third slot: got %v, want a SlotsFullError of 2", s.self, err)
		}
	}
	if err := a.Acquire(ctx, "bob", 1); err != nil {
		t.Fatalf("bob refused for alice's slots: %v", err)
	}
	a.Release("alice")
	waitfor.Poll(t, "a's slot given back to b", func() bool { return b.Acquire(ctx, "alice", 2) == nil })
	if a.Held("alice") != 0 || b.Held("alice") != 2 {
		t.Fatalf("held: a %d, b %d; want 0 and 2", a.Held("alice"), b.Held("alice"))
	}
	// b is killed holding 2: nothing renews them. They count until the
	// lease ends, then lapse.
	c.advance(1900 * time.Millisecond)
	if err := a.Acquire(ctx, "alice", 2); !errors.As(err, &full) {
		t.Fatalf("before b's lease ended: got %v, want refused", err)
	}
	c.advance(200 * time.Millisecond)
	if err := a.Acquire(ctx, "alice", 2); err != nil {
		t.Fatalf("after b's lease ended: %v", err)
	}
	if err := a.Acquire(ctx, "alice", 2); err != nil {
		t.Fatalf("b's second lapsed slot: %v", err)
	}
	if err := a.Acquire(ctx, "alice", 2); !errors.As(err, &full) {
		t.Fatalf("a third after the lapse: got %v, want refused", err)
	}
}

// TestSlotsRenewAndStop: a running frontend's slots outlive many leases
// (Run renews them), and a frontend that stops gives them all back.
func TestSlotsRenewAndStop(t *testing.T) {
	_, kv := budgetsKV(t)
	a, err := NewSlots(kv, nil, Config{Frontend: "fe-a", Lease: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewSlots(kv, nil, Config{Frontend: "fe-b", Lease: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	if err := a.Acquire(context.Background(), "alice", 1); err != nil {
		t.Fatal(err)
	}
	expOf := func() int64 {
		e, err := kv.Get(context.Background(), slotsPrefix+"alice")
		if err != nil {
			t.Fatal(err)
		}
		var st slotsState
		if err := json.Unmarshal(e.Value(), &st); err != nil {
			t.Fatal(err)
		}
		return st.Held["fe-a"].Exp
	}
	first := expOf()
	// Past two leases from the first: a's renewals keep its slot held.
	waitfor.Poll(t, "a's slot renewed past two leases", func() bool {
		return expOf() > first+int64(600*time.Millisecond) && time.Now().UnixNano() > first
	})
	var full *SlotsFullError
	if err := b.Acquire(context.Background(), "alice", 1); !errors.As(err, &full) {
		t.Fatalf("b took a's renewed slot after its first lease ended: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := b.Acquire(context.Background(), "alice", 1); err != nil {
		t.Fatalf("after a stopped: %v, want its slot given back", err)
	}
}

// TestSlotsNeverOverCap: frontends taking and giving back slots of one
// tenant at once never hold more than the cap together, and once every
// slot is given back the key holds none.
func TestSlotsNeverOverCap(t *testing.T) {
	_, kv := budgetsKV(t)
	const limit = 3
	var inFlight, most atomic.Int64
	var wg sync.WaitGroup
	var fronts []*Slots
	for _, id := range []string{"fe-a", "fe-b"} {
		s, err := NewSlots(kv, nil, Config{Frontend: id, Lease: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		fronts = append(fronts, s)
		for range 6 {
			wg.Go(func() {
				for range 15 {
					err := s.Acquire(context.Background(), "alice", limit)
					var full *SlotsFullError
					if errors.As(err, &full) {
						continue
					}
					if err != nil {
						t.Error(err)
						return
					}
					n := inFlight.Add(1)
					for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
					}
					inFlight.Add(-1)
					s.Release("alice")
				}
			})
		}
	}
	wg.Wait()
	if most.Load() > limit {
		t.Fatalf("at most %d held at once, want at most %d", most.Load(), limit)
	}
	if most.Load() == 0 {
		t.Fatal("no slot was ever taken")
	}
	waitfor.Poll(t, "every slot given back in the key", func() bool {
		n, err := fronts[0].Open(context.Background(), "alice")
		return err == nil && n == 0
	})
}

package retention_test

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/baton-dev/baton/internal/waitfor"
	"github.com/baton-dev/baton/services/retention"
)

// shareStack is a 200 KB request stream holding finished requests of alice
// and bob, interleaved, bob's first, and alice's one in flight; it stops
// once the stream is above fill.
func shareStack(t *testing.T, fill float64) (present func(id string) bool, alice, bob []string, m *retention.Monitor) {
	t.Helper()
	l := newSmallLog(t)
	fe, wk := l.fe, l.wk
	store(t, fe, wk, "bob:first", 20, false)
	bob = append(bob, "bob:first")
	store(t, fe, wk, "alice:inflight", 20, true)
	for i := 0; l.ratio() <= fill; i++ {
		id := fmt.Sprintf("%s:done-%03d", map[bool]string{true: "alice", false: "bob"}[i%2 == 1], i)
		store(t, fe, wk, id, 20, false)
		if i%2 == 1 {
			alice = append(alice, id)
		} else {
			bob = append(bob, id)
		}
	}
	return l.present, alice, bob, l.monitor()
}

// TestEvictionTakesTenantsOverTheirShareFirst: with the stream above its
// eviction mark and alice over her share, eviction takes alice's finished
// requests, oldest first, and none of bob's, older as his are, while hers
// are enough to bring the stream below its band; her request in flight
// stays.
func TestEvictionTakesTenantsOverTheirShareFirst(t *testing.T) {
	present, alice, bob, m := shareStack(t, 0.85)
	m.SetOverShare(func() []string { return []string{"alice"} })
	if got := m.Capacity(); got != 0 {
		t.Errorf("capacity before a reading: got %d, want 0", got)
	}
	stop := runMonitor(t, m)
	waitfor.Poll(t, "some of alice's finished requests evicted", func() bool { return !present(alice[0]) })
	waitfor.Poll(t, "the capacity read", func() bool { return m.Capacity() == 200_000 })
	stop()
	for _, id := range bob {
		if !present(id) {
			t.Errorf("bob's %s was evicted, with alice over her share and her finished requests enough", id)
		}
	}
	gone := 0
	for gone < len(alice) && !present(alice[gone]) {
		gone++
	}
	for _, id := range alice[gone:] {
		if !present(id) {
			t.Errorf("alice's %s was evicted before an older one of hers", id)
		}
	}
	if !present("alice:inflight") {
		t.Error("alice's request in flight was evicted")
	}
}

// TestEvictionOfATenantAboveItsShare: with the stream far below its
// eviction mark, a tenant listed as above its share's mark has its
// finished requests evicted, a round at a time, until it is no longer
// listed; no one else's are.
func TestEvictionOfATenantAboveItsShare(t *testing.T) {
	present, alice, bob, m := shareStack(t, 0.4)
	var over atomic.Bool
	over.Store(true)
	m.SetOverShare(func() []string {
		if over.Load() {
			return []string{"alice"}
		}
		return nil
	})
	stop := runMonitor(t, m)
	defer stop()
	waitfor.Poll(t, "alice's finished requests evicted", func() bool {
		for _, id := range alice {
			if present(id) {
				return false
			}
		}
		return true
	})
	over.Store(false)
	for _, id := range bob {
		if !present(id) {
			t.Errorf("bob's %s was evicted, the stream below its mark and bob within his share", id)
		}
	}
	if !present("alice:inflight") {
		t.Error("alice's request in flight was evicted")
	}
}

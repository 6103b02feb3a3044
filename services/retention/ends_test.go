package retention_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/internal/waitfor"
	"github.com/baton-dev/baton/streams"
)

// owner is a retention.Ends: the requests its frontend ended, and how often
// it was asked.
type owner struct {
	mu    sync.Mutex
	ended map[string]bool
	asked int
}

func (o *owner) Ended(id string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.asked++
	return o.ended[id]
}

func (o *owner) EndsKnown() uint64 { return 0 }

func (o *owner) questions() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.asked
}

// TestEvictionTakesEndsAndSkipsUnchanged is issue 32's stall: a log full of
// requests that the log says are in flight. Those whose end is in the ends
// place, or whose owner ended them, are evicted (their ends with them); an
// end of an earlier request of the same id is not taken for the request's;
// once no pass evicts anything, passes stop (nothing is asked) until the
// ends place changes, and then the request ended there goes.
func TestEvictionTakesEndsAndSkipsUnchanged(t *testing.T) {
	l := newSmallLog(t)
	ctx, js, fe, wk, ratio, present := context.Background(), l.js, l.fe, l.wk, l.ratio, l.present
	storeEnd := func(id string, through uint64) {
		t.Helper()
		f := events.RequestFailed{RequestID: id, Code: "log_full", Status: 503}
		if ok, err := streams.StoreEnd(ctx, fe, id+".ended", events.RequestEnded{RequestID: id, Frontend: "fe-1", Through: through, Failed: &f}, 0); !ok || err != nil {
			t.Fatalf("store the end of %s: %v %v", id, ok, err)
		}
	}
	// An earlier request of the id "stale" ended at sequence 1; the one in
	// the log began later.
	storeEnd("stale", 1)
	var running []string
	for i := 0; ratio() < 0.85; i++ {
		id := fmt.Sprintf("running-%02d", i)
		store(t, fe, wk, id, 20, true)
		running = append(running, id)
	}
	store(t, fe, wk, "stale", 20, true)
	var ended []string
	for i := 0; ratio() < 0.95; i++ {
		id := fmt.Sprintf("ended-%02d", i)
		store(t, fe, wk, id, 20, true)
		ended = append(ended, id)
		if i%2 == 0 {
			storeEnd(id, 1<<40)
		}
	}
	o := &owner{ended: map[string]bool{}}
	for i, id := range ended {
		if i%2 == 1 {
			o.ended[id] = true // its owner ended it; the ends place does not know
		}
	}
	m := l.monitor()
	m.SetEnds(o)
	stop := runMonitor(t, m)
	waitfor.Poll(t, "the ended requests evicted", func() bool {
		for _, id := range ended {
			if present(id) {
				return false
			}
		}
		return true
	})
	for _, id := range append([]string{"stale"}, running...) {
		if !present(id) {
			t.Errorf("%s, in flight, was evicted", id)
		}
	}
	for _, id := range ended {
		if e, _ := streams.ReadEnd(ctx, js, id); e != nil {
			t.Errorf("the end of %s outlived its request", id)
		}
	}
	if r := ratio(); r < 0.8 {
		t.Fatalf("usage %.2f after eviction: the test wants a log that stays above the eviction mark", r)
	}
	// Nothing changes: the passes stop asking.
	waitfor.Poll(t, "passes to stop", func() bool {
		before := o.questions()
		time.Sleep(100 * time.Millisecond) // ten intervals
		return o.questions() == before
	})
	// The ends place changes: the request ended there is evicted.
	storeEnd(running[0], 1<<40)
	waitfor.Poll(t, running[0]+" evicted once its end is stored", func() bool { return !present(running[0]) })
	if !present(running[1]) {
		t.Errorf("%s, in flight, was evicted", running[1])
	}
	stop()
}

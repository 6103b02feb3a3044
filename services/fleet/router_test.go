package fleet

import (
	"errors"
	"maps"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
)

func worker(id, lease string) projections.Worker {
	return projections.Worker{ID: id, LeaseID: lease, Model: "mock", State: projections.WorkerReady}
}

func loaded(w projections.Worker, l events.Load) projections.Worker {
	w.Load = l
	return w
}

// picks returns the set of workers r picks from cands in n tries.
func picks(t *testing.T, r *router, cands []projections.Worker, exclude map[string]bool, n int) map[string]int {
	t.Helper()
	got := map[string]int{}
	for range n {
		w, err := r.pick(cands, exclude)
		if err != nil {
			t.Fatalf("pick: %v", err)
		}
		got[w.ID]++
	}
	return got
}

func onlyPicked(t *testing.T, got map[string]int, want string) {
	t.Helper()
	if len(got) != 1 || got[want] == 0 {
		t.Fatalf("picked %v, want only %s", got, want)
	}
}

// TestRouterInhibition runs the inhibition window on synctest's fake clock
// (time.Now is the bubble's clock), so a 5 s window takes no time.
func TestRouterInhibition(t *testing.T) {
	const window = 5 * time.Second
	w1, w2 := worker("w1", "lease-1"), worker("w2", "lease-2")
	both := []projections.Worker{w1, w2}

	t.Run("skipped for the window, back after it", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := newRouter(Config{InhibitedDuration: window}, time.Now)
			r.inhibit(w1, 0)
			onlyPicked(t, picks(t, r, both, nil, 50), "w2")
			time.Sleep(window - time.Millisecond)
			if !r.isInhibited(w1) {
				t.Fatalf("w1 not inhibited %v after the failure, want inhibited for %v", window-time.Millisecond, window)
			}
			onlyPicked(t, picks(t, r, both, nil, 50), "w2")
			time.Sleep(time.Millisecond)
			if r.isInhibited(w1) {
				t.Fatalf("w1 still inhibited once the %v window has passed", window)
			}
			if got := picks(t, r, both, nil, 100); got["w1"] == 0 || got["w2"] == 0 {
				t.Fatalf("picked %v after the window, want both idle workers", got)
			}
		})
	})

	t.Run("a re-registered worker returns at once", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := newRouter(Config{InhibitedDuration: window}, time.Now)
			r.inhibit(w1, 0)
			again := worker("w1", "lease-1b") // same id, new lease
			if r.isInhibited(again) {
				t.Fatalf("w1 with a new lease is inhibited, want it back at once")
			}
			// The old lease stays forgotten: re-registration ended the inhibition.
			if got := picks(t, r, []projections.Worker{again, w2}, nil, 100); got["w1"] == 0 {
				t.Fatalf("picked %v, want the re-registered w1 among them", got)
			}
		})
	})

	t.Run("a removed worker is gone and its return is fresh", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := newRouter(Config{InhibitedDuration: window}, time.Now)
			r.inhibit(w1, 0)
			// Removed from discovery: not a candidate at all.
			onlyPicked(t, picks(t, r, []projections.Worker{w2}, nil, 10), "w2")
			// Back under a new lease (a worker re-registers with a new lease id).
			if got := picks(t, r, []projections.Worker{worker("w1", "lease-1c")}, nil, 1); got["w1"] != 1 {
				t.Fatalf("picked %v, want the returned w1", got)
			}
		})
	})

	for _, d := range []time.Duration{0, -1} {
		t.Run("duration "+d.String()+" disables", func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := newRouter(Config{InhibitedDuration: d}, time.Now)
				r.inhibit(w1, 0)
				if r.isInhibited(w1) {
					t.Fatalf("w1 inhibited with duration %v, want inhibition disabled", d)
				}
				if got := picks(t, r, both, nil, 100); got["w1"] == 0 {
					t.Fatalf("picked %v, want w1 among them", got)
				}
			})
		})
	}

	t.Run("every worker inhibited is no worker, not busy", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := newRouter(Config{InhibitedDuration: window}, time.Now)
			r.inhibit(w1, 0)
			r.inhibit(w2, 0)
			if _, err := r.pick(both, nil); !errors.Is(err, errNoWorkers) {
				t.Fatalf("pick = %v, want errNoWorkers", err)
			}
			time.Sleep(window)
			if _, err := r.pick(both, nil); err != nil {
				t.Fatalf("pick after the window = %v, want a worker", err)
			}
		})
	})

	t.Run("a second failure extends the window", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := newRouter(Config{InhibitedDuration: window}, time.Now)
			r.inhibit(w1, 0)
			time.Sleep(3 * time.Second)
			r.inhibit(w1, 0)
			time.Sleep(3 * time.Second)
			if !r.isInhibited(w1) {
				t.Fatalf("w1 not inhibited 3 s after its second failure")
			}
			time.Sleep(2 * time.Second)
			if r.isInhibited(w1) {
				t.Fatalf("w1 inhibited %v after its second failure", window)
			}
		})
	})
}

func TestRouterBusy(t *testing.T) {
	half, quarter := 0.5, 0.25
	hundred := 100
	kv := func(used, total int) events.Load { return events.Load{KVBlocksUsed: used, KVBlocksTotal: total} }
	prefill := func(n int) events.Load { return events.Load{QueuedPrefillTokens: n} }
	for _, tc := range []struct {
		name    string
		decode  *float64
		prefill *int
		cands   []projections.Worker
		exclude map[string]bool
		want    string // the only worker picked, or ""
		wantErr error
	}{
		{name: "no thresholds: nothing is busy", cands: []projections.Worker{
			loaded(worker("w1", "a"), kv(10, 10)), loaded(worker("w2", "b"), prefill(1e6))}, want: ""},
		{name: "decode threshold skips the full worker", decode: &half, cands: []projections.Worker{
			loaded(worker("w1", "a"), kv(9, 10)), loaded(worker("w2", "b"), kv(4, 10))}, want: "w2"},
		{name: "decode threshold exactly reached is not busy", decode: &half, cands: []projections.Worker{
			loaded(worker("w1", "a"), kv(5, 10))}, want: "w1"},
		{name: "decode threshold ignores unknown capacity", decode: &quarter, cands: []projections.Worker{
			loaded(worker("w1", "a"), kv(5, 0))}, want: "w1"},
		{name: "prefill threshold skips the queued worker", prefill: &hundred, cands: []projections.Worker{
			loaded(worker("w1", "a"), prefill(101)), loaded(worker("w2", "b"), prefill(100))}, want: "w2"},
		{name: "every worker busy", decode: &half, prefill: &hundred, cands: []projections.Worker{
			loaded(worker("w1", "a"), kv(6, 10)), loaded(worker("w2", "b"), prefill(101))}, wantErr: ErrAllBusy},
		{name: "the only free worker is excluded", decode: &half, exclude: map[string]bool{"w2": true}, cands: []projections.Worker{
			loaded(worker("w1", "a"), kv(6, 10)), loaded(worker("w2", "b"), kv(1, 10))}, wantErr: ErrAllBusy},
		{name: "a worker whose server said busy is busy without thresholds", cands: []projections.Worker{
			loaded(worker("w1", "a"), events.Load{Busy: true}), worker("w2", "b")}, want: "w2"},
		{name: "every worker's server busy", cands: []projections.Worker{
			loaded(worker("w1", "a"), events.Load{Busy: true})}, wantErr: ErrAllBusy},
		{name: "every worker excluded", exclude: map[string]bool{"w1": true}, cands: []projections.Worker{
			worker("w1", "a")}, wantErr: errNoWorkers},
		{name: "no candidates", wantErr: errNoWorkers},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRouter(Config{InhibitedDuration: time.Second, ActiveDecodeBlocksThreshold: tc.decode,
				ActivePrefillTokensThreshold: tc.prefill}, time.Now)
			if tc.wantErr != nil {
				if _, err := r.pick(tc.cands, tc.exclude); !errors.Is(err, tc.wantErr) {
					t.Fatalf("pick = %v, want %v", err, tc.wantErr)
				}
				return
			}
			got := picks(t, r, tc.cands, tc.exclude, 50)
			if tc.want != "" {
				onlyPicked(t, got, tc.want)
			} else if len(got) != len(tc.cands) {
				t.Fatalf("picked %v, want every candidate", got)
			}
		})
	}
}

func TestRouterLeastLoaded(t *testing.T) {
	active := func(n int) events.Load { return events.Load{ActiveRequests: n} }
	w1 := loaded(worker("w1", "a"), active(3))
	w2 := loaded(worker("w2", "b"), active(1))
	w3 := loaded(worker("w3", "c"), active(2))
	cands := []projections.Worker{w1, w2, w3}
	r := newRouter(Config{InhibitedDuration: time.Second}, time.Now)

	onlyPicked(t, picks(t, r, cands, nil, 50), "w2")
	onlyPicked(t, picks(t, r, cands, map[string]bool{"w2": true}, 50), "w3")

	// This frontend's own dispatches count when the reported load lags:
	// two in flight on w2 tie it with w3, three put it behind.
	done := []func(){r.track("w2"), r.track("w2")}
	if got := picks(t, r, cands, nil, 100); got["w2"] == 0 || got["w3"] == 0 || got["w1"] != 0 {
		t.Fatalf("picked %v with w2 and w3 tied at 2, want both and never w1", got)
	}
	done = append(done, r.track("w2"))
	onlyPicked(t, picks(t, r, cands, nil, 50), "w3")
	for _, d := range done {
		d()
		d() // idempotent
	}
	onlyPicked(t, picks(t, r, cands, nil, 50), "w2")
	if len(r.active) != 0 {
		t.Errorf("active = %v after every dispatch ended, want empty", r.active)
	}

	// A reported load above the frontend's own count wins.
	r.track("w1")
	if got := picks(t, r, []projections.Worker{w1, w3}, nil, 50); got["w1"] != 0 {
		t.Fatalf("picked %v, want w3 (load 2) over w1 (load 3)", got)
	}
}

// TestRouterReserveBalancesBursts (issue 22, failure 11): a burst of
// concurrent dispatches, none of which has been counted by a load report
// yet, spreads evenly, because reserve counts each choice as it makes it.
func TestRouterReserveBalancesBursts(t *testing.T) {
	r := newRouter(Config{}, time.Now)
	both := []projections.Worker{worker("w1", "l1"), worker("w2", "l2")}
	got := make(chan string, 20)
	var dones []func()
	var wg sync.WaitGroup
	var mu sync.Mutex
	for range 20 {
		wg.Go(func() {
			w, done, err := r.reserve(both, nil, false)
			if err != nil {
				t.Errorf("reserve: %v", err)
				return
			}
			mu.Lock()
			dones = append(dones, done)
			mu.Unlock()
			got <- w.ID
		})
	}
	wg.Wait()
	close(got)
	count := map[string]int{}
	for id := range got {
		count[id]++
	}
	if count["w1"] != 10 || count["w2"] != 10 {
		t.Errorf("a burst of 20 went %v, want 10 and 10", count)
	}
	for _, done := range dones {
		done()
		done() // idempotent
	}
	r.mu.Lock()
	left := len(r.active)
	r.mu.Unlock()
	if left != 0 {
		t.Errorf("%d workers still counted after every dispatch ended", left)
	}
}

// TestRouterLastResort (issue 22, failure 8): when every worker left is
// inhibited, a migration goes to the least recently failed one instead of
// failing; a new request still finds none.
func TestRouterLastResort(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRouter(Config{InhibitedDuration: 5 * time.Second}, time.Now)
		w1, w2, w3 := worker("w1", "l1"), worker("w2", "l2"), worker("w3", "l3")
		all := []projections.Worker{w1, w2, w3}
		r.inhibit(w2, 0)
		time.Sleep(time.Second)
		r.inhibit(w1, 0)
		exclude := map[string]bool{"w3": true} // the worker that just failed
		if _, _, err := r.reserve(all, exclude, false); !errors.Is(err, errNoWorkers) {
			t.Fatalf("a new request with every worker inhibited: %v, want errNoWorkers", err)
		}
		w, done, err := r.reserve(all, exclude, true)
		if err != nil || w.ID != "w2" {
			t.Fatalf("a migration with every worker inhibited got %q, %v; want w2, the least recently failed", w.ID, err)
		}
		done()
		if _, _, err := r.reserve(all, map[string]bool{"w1": true, "w2": true, "w3": true}, true); !errors.Is(err, errNoWorkers) {
			t.Fatalf("every worker excluded: %v, want errNoWorkers", err)
		}
	})
}

func tier(w projections.Worker, p int) projections.Worker {
	w.Priority = p
	return w
}

// TestRouterTiers (issue 35, item 4): the router picks among the highest
// priority tier's workers that can take the request (not excluded, not
// inhibited, not busy), the least loaded of them, and a lower tier only
// when no worker of a higher one can; when none of any tier can, the
// answer is what it was without tiers.
func TestRouterTiers(t *testing.T) {
	half := 0.5
	active := func(n int) events.Load { return events.Load{ActiveRequests: n} }
	full := events.Load{KVBlocksUsed: 9, KVBlocksTotal: 10}
	for _, tc := range []struct {
		name      string
		cands     []projections.Worker
		inhibited []string
		exclude   map[string]bool
		want      []string // every worker picked over many picks
		wantErr   error
	}{
		{name: "the top tier first, even when more loaded", cands: []projections.Worker{
			tier(loaded(worker("p", "a"), active(5)), 1), loaded(worker("f", "b"), active(0))}, want: []string{"p"}},
		{name: "least loaded within the top tier", cands: []projections.Worker{
			tier(loaded(worker("p1", "a"), active(3)), 1), tier(loaded(worker("p2", "b"), active(1)), 1),
			loaded(worker("f", "c"), active(0))}, want: []string{"p2"}},
		{name: "ties within the top tier share it", cands: []projections.Worker{
			tier(worker("p1", "a"), 1), tier(worker("p2", "b"), 1), worker("f", "c")}, want: []string{"p1", "p2"}},
		{name: "the order of the candidates does not matter", cands: []projections.Worker{
			worker("f", "c"), tier(worker("p", "a"), 1), tier(worker("low", "d"), -1)}, want: []string{"p"}},
		{name: "a busy top tier falls back", cands: []projections.Worker{
			tier(loaded(worker("p", "a"), full), 1), worker("f", "b")}, want: []string{"f"}},
		{name: "the next tier down, not the last", cands: []projections.Worker{
			tier(loaded(worker("top", "a"), full), 2), tier(worker("mid", "b"), 1), worker("last", "c")}, want: []string{"mid"}},
		{name: "an inhibited top tier falls back", inhibited: []string{"p"}, cands: []projections.Worker{
			tier(worker("p", "a"), 1), worker("f", "b")}, want: []string{"f"}},
		{name: "a top tier that failed the request falls back", exclude: map[string]bool{"p": true}, cands: []projections.Worker{
			tier(worker("p", "a"), 1), worker("f", "b")}, want: []string{"f"}},
		{name: "one of the top tier left takes it", inhibited: []string{"p1"}, cands: []projections.Worker{
			tier(worker("p1", "a"), 1), tier(loaded(worker("p2", "b"), active(9)), 1), worker("f", "c")}, want: []string{"p2"}},
		{name: "below the default tier is last", cands: []projections.Worker{
			tier(worker("low", "a"), -1), worker("f", "b")}, want: []string{"f"}},
		{name: "every tier busy is busy", wantErr: ErrAllBusy, cands: []projections.Worker{
			tier(loaded(worker("p", "a"), full), 1), loaded(worker("f", "b"), full)}},
		{name: "the top tier inhibited and the rest busy is busy", inhibited: []string{"p"}, wantErr: ErrAllBusy,
			cands: []projections.Worker{tier(worker("p", "a"), 1), loaded(worker("f", "b"), full)}},
		{name: "every tier inhibited is no worker", inhibited: []string{"p", "f"}, wantErr: errNoWorkers,
			cands: []projections.Worker{tier(worker("p", "a"), 1), worker("f", "b")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRouter(Config{InhibitedDuration: time.Minute, ActiveDecodeBlocksThreshold: &half}, time.Now)
			for _, w := range tc.cands {
				if slices.Contains(tc.inhibited, w.ID) {
					r.inhibit(w, 0)
				}
			}
			if tc.wantErr != nil {
				if w, err := r.pick(tc.cands, tc.exclude); !errors.Is(err, tc.wantErr) {
					t.Fatalf("pick = %q, %v; want %v", w.ID, err, tc.wantErr)
				}
				return
			}
			got := picks(t, r, tc.cands, tc.exclude, 100)
			if ids := slices.Sorted(maps.Keys(got)); !slices.Equal(ids, tc.want) {
				t.Fatalf("picked %v, want %v", got, tc.want)
			}
		})
	}
}

// TestRouterTiersReturn: the fallback tier serves only while the top tier
// cannot, and the first pick after the top tier can again is the top
// tier's: at the end of its inhibition, at its re-registration (a new
// lease), and as soon as it is routable again (back in the candidates).
func TestRouterTiersReturn(t *testing.T) {
	const window = 5 * time.Second
	p, f := tier(worker("p", "lease-p"), 1), worker("f", "lease-f")
	both := []projections.Worker{p, f}
	synctest.Test(t, func(t *testing.T) {
		r := newRouter(Config{InhibitedDuration: window}, time.Now)
		onlyPicked(t, picks(t, r, both, nil, 20), "p")

		r.inhibit(p, 0)
		onlyPicked(t, picks(t, r, both, nil, 20), "f")
		time.Sleep(window)
		onlyPicked(t, picks(t, r, both, nil, 20), "p")

		r.inhibit(p, 0)
		again := tier(worker("p", "lease-p2"), 1) // restarted: a new lease
		onlyPicked(t, picks(t, r, []projections.Worker{again, f}, nil, 20), "p")

		// Out of routing (lease lost, not ready, draining): not a candidate.
		onlyPicked(t, picks(t, r, []projections.Worker{f}, nil, 20), "f")
		onlyPicked(t, picks(t, r, []projections.Worker{f, again}, nil, 20), "p")
	})
}

// TestRouterTiersReserve: a burst spreads over the top tier's workers, as
// it does without tiers, and none of it spills to a lower tier that no
// threshold asked for.
func TestRouterTiersReserve(t *testing.T) {
	r := newRouter(Config{}, time.Now)
	cands := []projections.Worker{worker("f", "l0"), tier(worker("p1", "l1"), 1), tier(worker("p2", "l2"), 1)}
	count := map[string]int{}
	var dones []func()
	for range 20 {
		w, done, err := r.reserve(cands, nil, false)
		if err != nil {
			t.Fatalf("reserve: %v", err)
		}
		count[w.ID]++
		dones = append(dones, done)
	}
	if count["p1"] != 10 || count["p2"] != 10 {
		t.Errorf("a burst of 20 went %v, want 10 and 10 on the top tier", count)
	}
	for _, done := range dones {
		done()
	}
}

// TestRouterTiersLastResort: a migration whose every candidate left is
// inhibited goes to the highest tier's least recently failed worker, even
// when a lower tier's failed longer ago; a new request still finds none.
func TestRouterTiersLastResort(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRouter(Config{InhibitedDuration: 5 * time.Second}, time.Now)
		f := worker("f", "lf")
		p1, p2 := tier(worker("p1", "l1"), 1), tier(worker("p2", "l2"), 1)
		all := []projections.Worker{f, p1, p2}
		r.inhibit(f, 0)
		time.Sleep(time.Second)
		r.inhibit(p2, 0)
		time.Sleep(time.Second)
		r.inhibit(p1, 0)
		if _, _, err := r.reserve(all, nil, false); !errors.Is(err, errNoWorkers) {
			t.Fatalf("a new request with every worker inhibited: %v, want errNoWorkers", err)
		}
		for _, tc := range []struct {
			exclude map[string]bool
			want    string
		}{
			{nil, "p2"}, // the top tier's least recently failed, not f
			{map[string]bool{"p2": true}, "p1"},
			{map[string]bool{"p1": true, "p2": true}, "f"},
		} {
			w, done, err := r.reserve(all, tc.exclude, true)
			if err != nil || w.ID != tc.want {
				t.Fatalf("a migration excluding %v with every worker inhibited got %q, %v; want %s", tc.exclude, w.ID, err, tc.want)
			}
			done()
		}
	})
}

// TestRouterFree: a worker is free for the fair queue when it is not busy
// and its load report counts every dispatch this frontend runs on it; a
// dispatch its report does not show yet makes it not free, until a report
// that counts it, or until the dispatch ends.
func TestRouterFree(t *testing.T) {
	zero := 0.0
	r := newRouter(Config{ActiveDecodeBlocksThreshold: &zero, InhibitedDuration: time.Minute}, time.Now)
	idle := loaded(worker("w1", "lease-1"), events.Load{KVBlocksTotal: 4})
	if !r.free([]projections.Worker{idle}) {
		t.Fatal("an idle worker: got not free, want free")
	}
	_, done, err := r.reserve([]projections.Worker{idle}, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	if r.free([]projections.Worker{idle}) {
		t.Error("dispatched to, its report not showing it: got free, want not free")
	}
	running := loaded(worker("w1", "lease-1"), events.Load{ActiveRequests: 1, KVBlocksTotal: 4})
	if !r.free([]projections.Worker{running}) {
		t.Error("its report counts the dispatch and it is not busy: got not free, want free")
	}
	busy := loaded(worker("w1", "lease-1"), events.Load{ActiveRequests: 1, KVBlocksUsed: 1, KVBlocksTotal: 4})
	if r.free([]projections.Worker{busy}) {
		t.Error("over the threshold: got free, want not free")
	}
	done()
	if !r.free([]projections.Worker{idle}) {
		t.Error("the dispatch ended: got not free, want free")
	}
	r.inhibit(idle, time.Minute)
	if r.free([]projections.Worker{idle}) {
		t.Error("inhibited: got free, want not free")
	}
}

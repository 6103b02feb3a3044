package retention_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/baton-dev/baton/services/retention"
)

// TestPacerOneAtATime: purges of one stream run one at a time, in the order
// they came; another stream's do not wait for them; a caller whose ctx
// ends while it waits never runs; a nil Pacer runs at once.
func TestPacerOneAtATime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pc := retention.NewPacer()
		release := make(chan struct{}) // each receive lets the purge under way end
		var mu sync.Mutex
		var order []int
		running, overlapped := 0, false
		var wg sync.WaitGroup
		for i := range 5 {
			wg.Go(func() {
				err := pc.Do(t.Context(), "s1", func(context.Context) error {
					mu.Lock()
					running++
					overlapped = overlapped || running > 1
					order = append(order, i)
					mu.Unlock()
					<-release
					mu.Lock()
					running--
					mu.Unlock()
					return nil
				})
				if err != nil {
					t.Errorf("purge %d: %v", i, err)
				}
			})
			synctest.Wait() // purge i is under way or waiting before i+1 comes
		}
		if err := pc.Do(t.Context(), "s2", func(context.Context) error { return nil }); err != nil {
			t.Errorf("a purge of another stream: %v", err)
		}
		cancelled, cancel := context.WithCancel(t.Context())
		ran := false
		var late error
		wg.Go(func() {
			late = pc.Do(cancelled, "s1", func(context.Context) error { ran = true; return nil })
		})
		synctest.Wait() // it waits behind the five
		cancel()
		synctest.Wait()
		for range 5 {
			release <- struct{}{}
		}
		wg.Wait()
		if overlapped {
			t.Error("two purges of one stream ran at once")
		}
		for k, i := range order {
			if i != k {
				t.Errorf("purge %d ran %dth, want in the order they came", i, k)
			}
		}
		if len(order) != 5 {
			t.Errorf("%d purges ran, want 5", len(order))
		}
		if ran || !errors.Is(late, context.Canceled) {
			t.Errorf("a caller whose ctx ended while it waited: ran %v, err %v", ran, late)
		}
		var nilPacer *retention.Pacer
		if err := nilPacer.Do(t.Context(), "s1", func(context.Context) error { return errors.ErrUnsupported }); !errors.Is(err, errors.ErrUnsupported) {
			t.Errorf("a nil Pacer: %v", err)
		}
	})
}

// TestPacerSkipsPastMaxWaiting: with one purge under way and MaxWaiting
// waiting, one more is skipped at once (ErrPurgeSkipped, never run); the
// waiting ones all run once the first ends.
func TestPacerSkipsPastMaxWaiting(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pc := retention.NewPacer()
		release := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			_ = pc.Do(t.Context(), "s1", func(context.Context) error { <-release; return nil })
		})
		synctest.Wait()
		var mu sync.Mutex
		ran := 0
		for range retention.MaxWaiting {
			wg.Go(func() {
				err := pc.Do(t.Context(), "s1", func(context.Context) error {
					mu.Lock()
					ran++
					mu.Unlock()
					return nil
				})
				if err != nil {
					t.Errorf("a waiting purge: %v", err)
				}
			})
		}
		synctest.Wait()
		skipped := true
		if err := pc.Do(t.Context(), "s1", func(context.Context) error { skipped = false; return nil }); !errors.Is(err, retention.ErrPurgeSkipped) || !skipped {
			t.Errorf("one past %d waiting: %v (ran: %v), want %v", retention.MaxWaiting, err, !skipped, retention.ErrPurgeSkipped)
		}
		if err := pc.Do(t.Context(), "s2", func(context.Context) error { return nil }); err != nil {
			t.Errorf("another stream's purge: %v", err)
		}
		close(release)
		wg.Wait()
		if ran != retention.MaxWaiting {
			t.Errorf("%d of the %d waiting purges ran", ran, retention.MaxWaiting)
		}
	})
}

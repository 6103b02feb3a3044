package retention_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/baton-dev/baton/services/retention"
)

// TestPacerOneAtATime: purges of one stream run one at a time, in the order
// they came; another stream's do not wait for them; a caller whose ctx
// ends while it waits never runs; a nil Pacer runs at once.
func TestPacerOneAtATime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pc := retention.NewPacer()
		const d = 2 * time.Millisecond
		type span struct {
			i        int
			from, to time.Time
		}
		var mu sync.Mutex
		var spans []span
		var wg sync.WaitGroup
		for i := range 5 {
			wg.Go(func() {
				time.Sleep(time.Duration(i) * time.Microsecond) // they come in order
				err := pc.Do(t.Context(), "s1", func(context.Context) error {
					from := time.Now()
					time.Sleep(d) // the purge takes d of the bubble's clock
					mu.Lock()
					spans = append(spans, span{i, from, time.Now()})
					mu.Unlock()
					return nil
				})
				if err != nil {
					t.Errorf("purge %d: %v", i, err)
				}
			})
		}
		other := time.Duration(-1)
		wg.Go(func() {
			time.Sleep(10 * time.Microsecond)
			at := time.Now()
			_ = pc.Do(t.Context(), "s2", func(context.Context) error { return nil })
			other = time.Since(at)
		})
		cancelled, cancel := context.WithCancel(t.Context())
		ran := false
		var late error
		wg.Go(func() {
			time.Sleep(20 * time.Microsecond)
			go func() { time.Sleep(2 * d); cancel() }()
			late = pc.Do(cancelled, "s1", func(context.Context) error { ran = true; return nil })
		})
		wg.Wait()
		if len(spans) != 5 {
			t.Fatalf("%d purges ran, want 5", len(spans))
		}
		for i, s := range spans {
			if s.i != i {
				t.Errorf("purge %d ran %dth, want in the order they came", s.i, i)
			}
			if i > 0 && s.from.Before(spans[i-1].to) {
				t.Errorf("purge %d started before the one before it ended", s.i)
			}
		}
		if other != 0 {
			t.Errorf("a purge of another stream waited %v", other)
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

package every

import (
	"context"
	"testing"
	"testing/synctest"
	"time"
)

// TestTick: f runs at d, 2d, 3d after the call, and not once ctx is done.
func TestTick(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		start := time.Now()
		var at []time.Duration
		done := make(chan struct{})
		go func() {
			Tick(ctx, time.Second, func() {
				at = append(at, time.Since(start))
				if len(at) == 3 {
					cancel()
				}
			})
			close(done)
		}()
		<-done
		want := []time.Duration{time.Second, 2 * time.Second, 3 * time.Second}
		if len(at) != len(want) {
			t.Fatalf("f ran at %v, want %v", at, want)
		}
		for i := range want {
			if at[i] != want[i] {
				t.Fatalf("f ran at %v, want %v", at, want)
			}
		}
		time.Sleep(5 * time.Second)
		if len(at) != 3 {
			t.Errorf("f ran %d times after ctx was done", len(at)-3)
		}
	})
}

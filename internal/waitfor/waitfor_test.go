package waitfor

import (
	"sync/atomic"
	"testing"

	"github.com/baton-dev/baton/internal/notify"
)

// TestSignal: a condition made true after the first check is seen at the
// notification that follows.
func TestSignal(t *testing.T) {
	var sig notify.Signal
	var v atomic.Bool
	go func() {
		v.Store(true)
		sig.Notify()
	}()
	Signal(t, &sig, "v", v.Load)
	if !v.Load() {
		t.Error("returned before v held")
	}
}

// TestPoll: a condition made true by another goroutine is seen.
func TestPoll(t *testing.T) {
	var v atomic.Bool
	go v.Store(true)
	Poll(t, "v", v.Load)
	if !v.Load() {
		t.Error("returned before v held")
	}
}

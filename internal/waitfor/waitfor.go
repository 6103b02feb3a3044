// Package waitfor holds the tests' waits for a condition that another
// goroutine makes true. Each wait is bounded: the test fails after Timeout.
// Wait on a notification where the code under test gives one (Signal), and
// poll (Poll) only where nothing tells of the change.
package waitfor

import (
	"testing"
	"time"

	"github.com/baton-dev/baton/internal/notify"
)

// Timeout bounds every wait.
const Timeout = 10 * time.Second

// pollEvery spaces Poll's checks.
const pollEvery = 5 * time.Millisecond

// Signal waits until cond holds, checking it again at every notification
// of sig; t fails after Timeout.
func Signal(t testing.TB, sig *notify.Signal, what string, cond func() bool) {
	t.Helper()
	timeout := time.NewTimer(Timeout)
	defer timeout.Stop()
	for {
		ch := sig.C() // before cond: a change after the check still wakes us
		if cond() {
			return
		}
		select {
		case <-ch:
		case <-timeout.C:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// Poll waits until cond holds, checking it every few milliseconds; t fails
// after Timeout.
func Poll(t testing.TB, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	timeout := time.NewTimer(Timeout)
	defer timeout.Stop()
	for !cond() {
		select {
		case <-tick.C:
		case <-timeout.C:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

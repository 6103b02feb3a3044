package worker_test

import (
	"testing"

	"github.com/baton-dev/baton/services/worker"
)

// TestLeasePriority: the worker announces its tier (--priority) in its
// lease, and a default worker's lease carries none (what an older build
// wrote, read as tier 0).
func TestLeasePriority(t *testing.T) {
	for _, tc := range []struct {
		name     string
		priority int
	}{{"primary", 2}, {"default", 0}, {"below the default", -1}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.start(nil, fullSpeed, worker.Config{ID: "w-prio", Model: "mock", Priority: tc.priority})
			l, ok := e.lease("w-prio")
			if !ok || l.Priority != tc.priority {
				t.Errorf("lease %+v (found %v): priority %d, want %d", l, ok, l.Priority, tc.priority)
			}
		})
	}
}

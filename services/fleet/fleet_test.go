package fleet

import (
	"context"
	"testing"

	"github.com/baton-dev/baton/internal/natstest"
)

// TestRunStoppedWhileLoading: a Run whose ctx ends before the view is
// loaded (here: its buckets are never provisioned) returns nil, as any
// other stop, and Ready stays open. Formerly it returned the load's error
// ("watch baton_frontends: context canceled"), which failed tests that end
// before their fleet view was loaded.
func TestRunStoppedWhileLoading(t *testing.T) {
	s := natstest.Start(t) // nothing provisioned: Run waits for the buckets
	f, err := New(s.Connect(t), "fe", nil, nil, Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run = %v, want nil", err)
	}
	select {
	case <-f.Ready():
		t.Error("Ready is closed, want open: the view was never loaded")
	default:
	}
}

package worker

import (
	"fmt"
	"testing"

	"github.com/baton-dev/baton/internal/natstest"
	"github.com/nats-io/nats.go"
)

// TestFlowWindowConfirms: the publish that fills the window returns only
// once the server has processed every publish before it; here that shows as
// all of them already delivered to a subscription of the same connection
// (the server answers the flush after delivering them, and the client reads
// in order).
func TestFlowWindowConfirms(t *testing.T) {
	s := natstest.Start(t)
	nc := s.Connect(t)
	sub, err := nc.SubscribeSync("fw.>")
	if err != nil {
		t.Fatal(err)
	}
	const window = 8
	w := newFlowWindow(nc, window)
	for round := 1; round <= 3; round++ {
		for i := range window {
			if err := w.publish(&nats.Msg{Subject: fmt.Sprintf("fw.%d", i), Data: []byte("x")}); err != nil {
				t.Fatal(err)
			}
		}
		if n, _, err := sub.Pending(); err != nil || n != round*window {
			t.Fatalf("after %d full windows, %d messages delivered (%v), want %d", round, n, err, round*window)
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.out != 0 || w.flushing {
		t.Errorf("window out %d flushing %v after confirmed rounds, want 0 false", w.out, w.flushing)
	}
}

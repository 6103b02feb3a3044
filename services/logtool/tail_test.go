package logtool

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/internal/natstest"
	"github.com/baton-dev/baton/internal/waitfor"
	"github.com/baton-dev/baton/streams"
)

// TestTailLogFollow prints what is stored, then what arrives, from both
// streams, until its ctx ends.
func TestTailLogFollow(t *testing.T) {
	s := natstest.Start(t)
	js := s.Provision(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	wl, fl := streams.NewLog(js, "baton/worker/w1"), streams.NewLog(js, "baton/frontend/fe-1")
	appendOr := func(l *streams.Log, subject, id string, ev events.Event) {
		t.Helper()
		natstest.Append(ctx, t, l, subject, id, "x", ev)
	}
	appendOr(wl, streams.WorkerEvents("w1"), "reg", events.WorkerRegistered{WorkerID: "w1", Model: "mock"})

	var mu sync.Mutex
	var lines []string
	got := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), lines...)
	}
	tctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- Tail(tctx, js, []Source{{Stream: streams.RequestsStream}, {Stream: streams.WorkersStream}}, 0, true, func(r Record) error {
			mu.Lock()
			defer mu.Unlock()
			lines = append(lines, r.Line())
			return nil
		})
	}()
	waitfor.Poll(t, "the stored event", func() bool { return len(got()) == 1 })
	appendOr(fl, streams.RequestEvents("r9"), "acc", events.RequestAccepted{RequestID: "r9", Model: "mock", Frontend: "fe-1"})
	appendOr(wl, streams.WorkerEvents("w1"), "drain", events.WorkerDraining{WorkerID: "w1", Reason: "sigterm"})
	waitfor.Poll(t, "the new events", func() bool { return len(got()) == 3 })
	stop()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("got %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Tail did not return after its ctx ended")
	}
	all := strings.Join(got(), "\n")
	for _, want := range []string{"worker w1 registered", streams.RequestEvents("r9"), "worker w1 draining: sigterm"} {
		if !strings.Contains(all, want) {
			t.Errorf("output lacks %q:\n%s", want, all)
		}
	}
}

func TestTokenRange(t *testing.T) {
	tests := []struct {
		offset, n, deltas int
		want              string
	}{
		{0, 64, 4, "tokens 0-63 (64 tokens in 4 deltas)"},
		{7, 1, 1, "token 7"},
		{7, 3, 1, "tokens 7-9 (3)"},
		{7, 0, 1, "no tokens at 7"},
	}
	for _, tt := range tests {
		if got := tokenRange(tt.offset, tt.n, tt.deltas); got != tt.want {
			t.Errorf("tokenRange(%d, %d, %d): got %q, want %q", tt.offset, tt.n, tt.deltas, got, tt.want)
		}
	}
}

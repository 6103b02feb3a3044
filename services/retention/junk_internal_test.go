package retention

import (
	"context"
	"log/slog"
	"testing"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/internal/natstest"
	"github.com/baton-dev/baton/streams"
	"github.com/prometheus/client_golang/prometheus"
)

// TestRoutedWorkerInAccepted: the guard finds the worker of attempt 0 in
// the accepted event when its routed decision was stored there
// (events.RequestAccepted.Route), as in a routed event, so that its honest
// output is not taken for junk.
func TestRoutedWorkerInAccepted(t *testing.T) {
	js := natstest.Start(t).JetStream(t)
	ctx := context.Background()
	if _, err := streams.Provision(ctx, js, streams.Config{MemoryStorage: true}); err != nil {
		t.Fatal(err)
	}
	fe := streams.NewLog(js, "baton/frontend/fe-1")
	acc := func(id string, route *events.RequestRouted) {
		natstest.Append(ctx, t, fe, streams.RequestEvents(id), events.ID(id, "accepted"), id,
			events.RequestAccepted{RequestID: id, Model: "m", Frontend: "fe-1", Route: route})
	}
	routed := func(id string, k int, w string) {
		natstest.Append(ctx, t, fe, streams.RequestEvents(id), events.ID(id, "routed", k), id,
			events.RequestRouted{RequestID: id, Attempt: k, WorkerID: w})
	}
	acc("a", &events.RequestRouted{RequestID: "a", WorkerID: "w1"})
	routed("a", 1, "w3")
	acc("b", nil)
	routed("b", 0, "w2")
	reg, log := prometheus.NewRegistry(), slog.New(slog.DiscardHandler)
	m, err := NewMonitor(js, reg, log, Config{})
	if err != nil {
		t.Fatal(err)
	}
	g, err := NewGuard(js, m, reg, log, GuardConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		id      string
		attempt int
		want    string
	}{{"a", 0, "w1"}, {"a", 1, "w3"}, {"a", 2, ""}, {"b", 0, "w2"}, {"b", 1, ""}} {
		if got, err := g.routedWorker(ctx, streams.RequestsStream, c.id, c.attempt); err != nil || got != c.want {
			t.Errorf("routedWorker(%s, %d) = %q, %v; want %q", c.id, c.attempt, got, err, c.want)
		}
	}
}

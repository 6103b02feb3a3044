package runner

import (
	"context"
	"encoding/json"
	"os"
	"testing"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/internal/natstest"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"
)

// startPresence registers frontend id's presence on a new embedded
// JetStream, and returns it with the frontends bucket.
func startPresence(t *testing.T, id string) (*presence, jetstream.KeyValue) {
	t.Helper()
	js := natstest.Start(t).Provision(t)
	ctx, cancel := context.WithCancel(t.Context())
	var g errgroup.Group
	t.Cleanup(func() {
		cancel()
		_ = g.Wait()
	})
	p := &presence{}
	err := p.start(ctx, ctx, js, events.FrontendPresence{FrontendID: id, Addr: "127.0.0.1:1", ClientID: 7, Server: "S1"}, &g)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, streams.FrontendsBucket)
	if err != nil {
		t.Fatal(err)
	}
	return p, kv
}

// TestPresenceRegisters: the frontend's own key names this process, its
// address and its NATS connection (what a disconnect advisory names).
func TestPresenceRegisters(t *testing.T) {
	_, kv := startPresence(t, "fe-a")
	e, err := kv.Get(t.Context(), "fe-a")
	if err != nil {
		t.Fatalf("got %v reading the own key, want it registered", err)
	}
	var v events.FrontendPresence
	if err := json.Unmarshal(e.Value(), &v); err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname()
	if v.PID != os.Getpid() || v.Host != host || v.Addr != "127.0.0.1:1" || v.ClientID != 7 || v.Server != "S1" {
		t.Errorf("got %+v, want this process's pid and host, the given address and connection", v)
	}
}

func TestPresenceRevoke(t *testing.T) {
	if err := (&presence{}).revoke(t.Context()); err != nil {
		t.Errorf("got %v revoking a presence never started, want nil", err)
	}
	p, kv := startPresence(t, "fe-a")
	if err := p.revoke(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Get(t.Context(), "fe-a"); err == nil {
		t.Error("got the key after revoke, want it deleted")
	}
}

package runner

import (
	"context"
	"encoding/json"
	"os"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/internal/natstest"
	"github.com/baton-dev/baton/internal/notify"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"
)

// waitUntil waits for cond, re-checking it at every notification of sig.
func waitUntil(t *testing.T, sig *notify.Signal, what string, cond func() bool) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		ch := sig.C()
		if cond() {
			return
		}
		select {
		case <-ch:
		case <-timeout:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

type membershipFixture struct {
	js  jetstream.JetStream
	ctx context.Context
	g   *errgroup.Group
}

func newMembershipFixture(t *testing.T) *membershipFixture {
	js := natstest.Start(t).Provision(t)
	ctx, cancel := context.WithCancel(t.Context())
	g := &errgroup.Group{}
	t.Cleanup(func() {
		cancel()
		if err := g.Wait(); err != nil {
			t.Errorf("watchers: %v", err)
		}
	})
	return &membershipFixture{js: js, ctx: ctx, g: g}
}

func (x *membershipFixture) kv(t *testing.T, bucket string) jetstream.KeyValue {
	t.Helper()
	kv, err := x.js.KeyValue(x.ctx, bucket)
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

func (x *membershipFixture) put(t *testing.T, bucket, key string, v any) uint64 {
	t.Helper()
	data, ok := v.([]byte)
	if !ok {
		var err error
		if data, err = json.Marshal(v); err != nil {
			t.Fatal(err)
		}
	}
	rev, err := x.kv(t, bucket).Put(x.ctx, key, data)
	if err != nil {
		t.Fatal(err)
	}
	return rev
}

func startPresence(t *testing.T, x *membershipFixture, id string) *presence {
	t.Helper()
	p := &presence{}
	err := p.start(x.ctx, x.ctx, x.js, events.FrontendPresence{FrontendID: id, Addr: "127.0.0.1:1", ClientID: 7, Server: "S1"}, x.g)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestPresenceRegisters: the frontend's own key names this process, its
// address and its NATS connection (what a disconnect advisory names).
func TestPresenceRegisters(t *testing.T) {
	x := newMembershipFixture(t)
	startPresence(t, x, "fe-a")
	e, err := x.kv(t, streams.FrontendsBucket).Get(x.ctx, "fe-a")
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
	x := newMembershipFixture(t)
	if err := (&presence{}).revoke(x.ctx); err != nil {
		t.Errorf("got %v revoking a presence never started, want nil", err)
	}
	p := startPresence(t, x, "fe-a")
	if err := p.revoke(x.ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := x.kv(t, streams.FrontendsBucket).Get(x.ctx, "fe-a"); err == nil {
		t.Error("got the key after revoke, want it deleted")
	}
}

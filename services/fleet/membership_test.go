package fleet

import (
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/internal/natstest"
	"github.com/baton-dev/baton/internal/waitfor"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"
)

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

func TestDiscoveryFollowsLeasesAndLoad(t *testing.T) {
	x := newMembershipFixture(t)
	// A worker registered before the frontend started is in the initial state.
	x.put(t, streams.LeasesBucket, "w1", events.Lease{WorkerID: "w1", LeaseID: "l1", Model: "m1"})
	d := newDiscovery(slog.New(slog.DiscardHandler))
	if err := d.start(x.ctx, x.ctx, x.js, x.g); err != nil {
		t.Fatal(err)
	}
	if w, ok := d.get("w1"); !ok || w.LeaseID != "l1" || !w.Routable() {
		t.Fatalf("got %+v, %v right after start, want w1 with lease l1, routable", w, ok)
	}
	if !d.hasServed("m1") || d.hasServed("m2") {
		t.Errorf("got served m1 %v, m2 %v; want true, false", d.hasServed("m1"), d.hasServed("m2"))
	}

	steps := []struct {
		name string
		do   func()
		done func() bool
	}{
		{name: "a second worker registers", do: func() {
			x.put(t, streams.LeasesBucket, "w2", events.Lease{WorkerID: "w2", LeaseID: "l2", Model: "m2"})
		}, done: func() bool { _, ok := d.get("w2"); return ok && d.hasServed("m2") }},
		{name: "a malformed lease is skipped", do: func() {
			x.put(t, streams.LeasesBucket, "w3", []byte("not json"))
			x.put(t, streams.LeasesBucket, "w4", events.Lease{WorkerID: "w4", LeaseID: "l4", Model: "m1"})
		}, done: func() bool { _, bad := d.get("w3"); _, ok := d.get("w4"); return ok && !bad }},
		{name: "a load report", do: func() {
			x.put(t, streams.LoadBucket, "w1", events.Load{WorkerID: "w1", ActiveRequests: 3, KVBlocksUsed: 5, KVBlocksTotal: 10})
		}, done: func() bool { w, _ := d.get("w1"); return w.Load.ActiveRequests == 3 && w.Load.KVBlocksTotal == 10 }},
		{name: "draining leaves routing", do: func() {
			x.put(t, streams.LeasesBucket, "w2", events.Lease{WorkerID: "w2", LeaseID: "l2", Model: "m2", Draining: true})
		}, done: func() bool { w, ok := d.get("w2"); return ok && !w.Routable() }},
		{name: "not ready leaves routing with its reason", do: func() {
			x.put(t, streams.LeasesBucket, "w4", events.Lease{WorkerID: "w4", LeaseID: "l4", Model: "m1", NotReady: true, NotReadyReason: "stalled"})
		}, done: func() bool { w, ok := d.get("w4"); return ok && !w.Routable() && w.Reason == "stalled" }},
		{name: "a deleted lease is gone, its model still served", do: func() {
			if err := x.kv(t, streams.LeasesBucket).Delete(x.ctx, "w2"); err != nil {
				t.Fatal(err)
			}
		}, done: func() bool { _, ok := d.get("w2"); return !ok && d.hasServed("m2") }},
	}
	for _, s := range steps {
		s.do()
		waitfor.Signal(t, d.changed, s.name, s.done)
	}
	var routable []string
	d.read(func(v *projections.Discovery) {
		for _, w := range v.Routable("m1") {
			routable = append(routable, w.ID)
		}
	})
	if len(routable) != 1 || routable[0] != "w1" {
		t.Errorf("got routable m1 workers %v, want [w1]", routable)
	}
}

// TestFrontendsFollowTheBucket: the view holds every live presence key,
// by the connection it names, and the departed ones.
func TestFrontendsFollowTheBucket(t *testing.T) {
	x := newMembershipFixture(t)
	x.put(t, streams.FrontendsBucket, "fe-a", events.FrontendPresence{FrontendID: "fe-a", Addr: "127.0.0.1:1", ClientID: 7, Server: "S1"})
	p := newFrontends()
	if err := p.start(x.ctx, x.ctx, x.js, x.g); err != nil {
		t.Fatal(err)
	}
	waitfor.Signal(t, p.changed, "the first key seen", func() bool { return p.isAlive("fe-a") })

	steps := []struct {
		name string
		do   func()
		done func() bool
	}{
		{name: "a peer arrives", do: func() {
			x.put(t, streams.FrontendsBucket, "fe-b", events.FrontendPresence{FrontendID: "fe-b", ClientID: 9, Server: "S1"})
		}, done: func() bool { return p.isAlive("fe-b") }},
		{name: "a malformed key is no member", do: func() {
			x.put(t, streams.FrontendsBucket, "fe-c", []byte("{"))
			x.put(t, streams.FrontendsBucket, "fe-d", events.FrontendPresence{FrontendID: "fe-d", ClientID: 9, Server: "S2"})
		}, done: func() bool { return p.isAlive("fe-d") && !p.isAlive("fe-c") }},
		{name: "the peer leaves", do: func() {
			if err := x.kv(t, streams.FrontendsBucket).Delete(x.ctx, "fe-b"); err != nil {
				t.Fatal(err)
			}
		}, done: func() bool { return !p.isAlive("fe-b") }},
	}
	for _, s := range steps {
		s.do()
		waitfor.Signal(t, p.changed, s.name, s.done)
	}
	cases := []struct {
		client uint64
		server string
		want   []string
	}{
		{7, "S1", []string{"fe-a"}},
		{9, "S2", []string{"fe-d"}},
		{9, "S1", nil}, // fe-b left
		{7, "S2", nil},
	}
	for _, tc := range cases {
		var got []string
		for _, f := range p.connectedAs(tc.client, tc.server) {
			got = append(got, f.FrontendID)
		}
		if len(got) != len(tc.want) || (len(got) == 1 && got[0] != tc.want[0]) {
			t.Errorf("connectedAs(%d, %s): got %v, want %v", tc.client, tc.server, got, tc.want)
		}
	}
	if got := len(p.known()); got != 3 { // fe-a, fe-d alive; fe-b departed
		t.Errorf("got %d known frontends, want 3", got)
	}
}

func TestFrontendsExpire(t *testing.T) {
	cases := []struct {
		name     string
		renewed  bool // the key was written again after the revision seen
		wantKept bool
	}{
		{name: "at the revision seen: deleted"},
		{name: "renewed since: alive after all", renewed: true, wantKept: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			x := newMembershipFixture(t)
			p := newFrontends()
			if err := p.start(x.ctx, x.ctx, x.js, x.g); err != nil {
				t.Fatal(err)
			}
			rev := x.put(t, streams.FrontendsBucket, "fe-b", events.FrontendPresence{FrontendID: "fe-b"})
			if tc.renewed {
				x.put(t, streams.FrontendsBucket, "fe-b", events.FrontendPresence{FrontendID: "fe-b"})
			}
			err := p.expire(x.ctx, projections.Frontend{FrontendPresence: events.FrontendPresence{FrontendID: "fe-b"}, Revision: rev})
			if err != nil {
				t.Fatalf("got %v, want nil", err)
			}
			_, gerr := x.kv(t, streams.FrontendsBucket).Get(x.ctx, "fe-b")
			if kept := gerr == nil; kept != tc.wantKept {
				t.Errorf("got key kept %v (%v), want %v", kept, gerr, tc.wantKept)
			}
		})
	}
}

// TestRevoke covers what a disconnect advisory finds when it revokes the lease
// its discovery view holds: only a lease of the lost registration is revoked
// (and so recorded as lost), never one the worker already gave up in order or
// replaced by registering again.
func TestRevoke(t *testing.T) {
	for _, tc := range []struct {
		name        string
		meanwhile   func(t *testing.T, kv jetstream.KeyValue) // what happened after the view saw revision 1
		wantRevoked bool
		wantKey     bool // the key still holds a lease afterwards
	}{
		{"unchanged", func(*testing.T, jetstream.KeyValue) {}, true, false},
		{"renewed by the same registration", func(t *testing.T, kv jetstream.KeyValue) { putLease(t, kv, "L1") }, true, false},
		{"deregistered in order", func(t *testing.T, kv jetstream.KeyValue) {
			if err := kv.Delete(context.Background(), "w1"); err != nil {
				t.Fatal(err)
			}
		}, false, false},
		{"registered again", func(t *testing.T, kv jetstream.KeyValue) { putLease(t, kv, "L2") }, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			js := natstest.Start(t).Provision(t)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			kv, err := js.KeyValue(ctx, streams.LeasesBucket)
			if err != nil {
				t.Fatal(err)
			}
			rev := putLease(t, kv, "L1")
			tc.meanwhile(t, kv)
			d := &discovery{leases: kv}
			revoked, err := d.revoke(ctx, projections.Worker{ID: "w1", LeaseID: "L1", LeaseRevision: rev})
			if err != nil {
				t.Fatalf("revoke: %v", err)
			}
			if revoked != tc.wantRevoked {
				t.Errorf("revoked = %v, want %v", revoked, tc.wantRevoked)
			}
			_, err = kv.Get(ctx, "w1")
			if gotKey := err == nil; gotKey != tc.wantKey {
				t.Errorf("lease key present = %v (err %v), want %v", gotKey, err, tc.wantKey)
			}
		})
	}
}

// putLease puts a lease of w1 with leaseID into kv.
func putLease(t *testing.T, kv jetstream.KeyValue, leaseID string) uint64 {
	t.Helper()
	data, _ := json.Marshal(events.Lease{WorkerID: "w1", LeaseID: leaseID, Model: "m"})
	rev, err := kv.Put(context.Background(), "w1", data)
	if err != nil {
		t.Fatal(err)
	}
	return rev
}

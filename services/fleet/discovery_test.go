package fleet

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/internal/natstest"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go/jetstream"
)

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
		{"renewed by the same registration", func(t *testing.T, kv jetstream.KeyValue) { put(t, kv, "L1") }, true, false},
		{"deregistered in order", func(t *testing.T, kv jetstream.KeyValue) {
			if err := kv.Delete(context.Background(), "w1"); err != nil {
				t.Fatal(err)
			}
		}, false, false},
		{"registered again", func(t *testing.T, kv jetstream.KeyValue) { put(t, kv, "L2") }, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			js := natstest.Start(t).Provision(t)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			kv, err := js.KeyValue(ctx, streams.LeasesBucket)
			if err != nil {
				t.Fatal(err)
			}
			rev := put(t, kv, "L1")
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

func put(t *testing.T, kv jetstream.KeyValue, leaseID string) uint64 {
	t.Helper()
	data, _ := json.Marshal(events.Lease{WorkerID: "w1", LeaseID: leaseID, Model: "m"})
	rev, err := kv.Put(context.Background(), "w1", data)
	if err != nil {
		t.Fatal(err)
	}
	return rev
}

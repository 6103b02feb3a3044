package quota

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// TestLogSharesAcrossFrontends: what one frontend accounts of a tenant's
// log bytes reaches the others through the bucket and adds to theirs; a
// frontend that stops deletes its key and its bytes stop counting.
func TestLogSharesAcrossFrontends(t *testing.T) {
	_, kv := budgetsKV(t)
	ctx := context.Background()
	a, err := NewLogShares(kv, nil, "fe-a", 10*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := NewLogShares(kv, nil, "fe-b", 10*time.Millisecond)
	if _, err := NewLogShares(kv, nil, "", 0); err == nil {
		t.Error("log shares without a frontend id: got no error")
	}
	actx, stopA := context.WithCancel(ctx)
	bctx, stopB := context.WithCancel(ctx)
	aDone, bDone := make(chan error, 1), make(chan error, 1)
	go func() { aDone <- a.Run(actx) }()
	go func() { bDone <- b.Run(bctx) }()
	defer func() {
		stopB()
		if err := <-bDone; err != nil {
			t.Error(err)
		}
	}()

	a.Set(map[string]int64{"alice": 1000, "bob": 5})
	b.Set(map[string]int64{"alice": 300})
	waitUntil(t, "each frontend to add the other's bytes", func() bool {
		return a.Bytes("alice") == 1300 && b.Bytes("alice") == 1300 && b.Bytes("bob") == 5
	})
	if got := a.Bytes("carol"); got != 0 {
		t.Errorf("carol's bytes: got %d, want 0", got)
	}
	a.Set(map[string]int64{"alice": 10})
	waitUntil(t, "a change to reach the other frontend", func() bool { return b.Bytes("alice") == 310 })

	stopA()
	if err := <-aDone; err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Get(ctx, logPrefix+"fe-a"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("fe-a's key after it stopped: got %v, want it deleted", err)
	}
	waitUntil(t, "a stopped frontend's bytes to stop counting", func() bool { return b.Bytes("alice") == 300 && b.Bytes("bob") == 0 })
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(10 * time.Second)
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}
